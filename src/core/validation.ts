import type { FastifySchemaCompiler } from 'fastify';
import { z } from 'zod';
import { type ApiError, badRequest } from './errors.ts';

/**
 * Input validation. Routes declare their inputs as zod schemas (`schema: { body, querystring, params }`
 * through the zod type provider); `validatorCompiler` below runs them before the handler and turns the
 * first problem into a 400 in OpenAI's shape through `validationError`, the one schema error formatter.
 * Outside HTTP (the CLI, the pricing file, the operator) `parseInput` does the same.
 */

/** Where an input came from, as named in messages (`Invalid query: …`). */
export type InputPart = 'body' | 'query' | 'path' | 'headers' | (string & {});

/**
 * The first problem of a failed parse as a 400 whose `param` names the field (dotted path, e.g.
 * `messages.0.role`); unknown fields become `Unknown field 'x'.`.
 */
export function validationError(error: z.ZodError, where: InputPart = 'body'): ApiError {
  const issue = error.issues[0]!;
  const path = issue.path.map(String).join('.');
  if (issue.code === 'unrecognized_keys') {
    const field = path ? `${path}.${issue.keys[0]}` : issue.keys[0]!;
    return badRequest(`Unknown field '${field}'.`, field);
  }
  if (where === 'body' && !path && issue.code === 'invalid_type' && issue.expected === 'object') {
    return badRequest('Request body must be a JSON object.', null);
  }
  let message = issue.message;
  if (issue.code === 'invalid_type' && message.toLowerCase().includes('received undefined')) {
    message = 'is required';
  }
  return badRequest(path ? `Invalid '${path}': ${message}` : `Invalid ${where}: ${message}`, path || where);
}

/** Parses input with a zod schema; the first problem is thrown as `validationError`. */
export function parseInput<S extends z.ZodType>(
  schema: S,
  input: unknown,
  where: InputPart = 'body',
): z.infer<S> {
  const result = schema.safeParse(input);
  if (result.success) return result.data;
  throw validationError(result.error, where);
}

const PARTS: Record<string, InputPart> = {
  body: 'body',
  querystring: 'query',
  params: 'path',
  headers: 'headers',
};

const fastPaths = new WeakMap<z.ZodType, (data: unknown) => unknown>();

/**
 * Gives a route schema a cheaper check for its common inputs: `fast` returns exactly what the schema's
 * parse would (a test must hold the two together), or undefined to let the schema parse — and word the
 * error.
 */
export function addFastPath<S extends z.ZodType>(
  schema: S,
  fast: (data: unknown) => z.output<S> | undefined,
) {
  fastPaths.set(schema, fast);
}

/**
 * fastify's validator compiler for zod route schemas: valid input replaces the request's part with the
 * parsed value (defaults and transforms applied); invalid input fails the request with
 * `validationError`, rendered by the server's error handler.
 */
export const validatorCompiler: FastifySchemaCompiler<z.ZodType> = ({ schema, httpPart }) => {
  const where = PARTS[httpPart ?? 'body'] ?? 'body';
  const fast = fastPaths.get(schema);
  return (data: unknown) => {
    if (fast) {
      const value = fast(data);
      if (value !== undefined) return { value };
    }
    const result = schema.safeParse(data);
    if (result.success) return { value: result.data };
    return { error: validationError(result.error, where) };
  };
};

// biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is the point
const CONTROL = /[\u0000-\u001f\u007f]/;
// A lone UTF-16 surrogate: not a character; Postgres refuses it in JSON and text would store U+FFFD.
const LONE_SURROGATE = /\p{Cs}/u;

/** No control characters and no lone surrogates: fit for an id, a filter, a URL. */
export function isPlainText(v: string): boolean {
  return !CONTROL.test(v) && !LONE_SURROGATE.test(v);
}

/**
 * Text Postgres stores as given: no NUL (refused in text and JSON) and no lone surrogates (refused in
 * JSON, silently replaced in text). Applies to every string inside a JSON value, keys included.
 */
export function isStorable(v: unknown): boolean {
  if (typeof v === 'string') return !v.includes('\u0000') && !LONE_SURROGATE.test(v);
  if (Array.isArray(v)) return v.every(isStorable);
  if (typeof v === 'object' && v !== null)
    return Object.entries(v).every(([k, item]) => isStorable(k) && isStorable(item));
  return true;
}

/** The message of `isStorable` failures. */
export const NOT_STORABLE = 'must not contain NUL characters or lone surrogates';

/**
 * A text input that reaches the database or a log: at most `max` characters, no NUL or other control
 * characters (Postgres refuses NUL in text; control characters are never part of an id).
 */
export function textInput(max: number, what = 'a string') {
  return z
    .string({ message: `must be ${what}` })
    .min(1, { message: 'must not be empty' })
    .max(max, { message: `must be at most ${max} characters` })
    .refine(isPlainText, { message: 'must not contain control characters' });
}

/** Route params of `/…/:id`. */
/**
 * A whole number from 1 to `max` in a query (a string, coerced), `fallback` when absent; every way it can
 * be wrong says the same: `must be a whole number from 1 to <max>`.
 */
export function wholeNumberParam(max: number, fallback: number) {
  const message = `must be a whole number from 1 to ${max}`;
  return z.coerce
    .number({ message })
    .int({ message })
    .min(1, { message })
    .max(max, { message })
    .default(fallback);
}

export const idParams = z.object({ id: textInput(255, 'an id') });

/** Free text that is stored (a name, a message): trimmed, 1..max characters, no NUL or lone surrogates. */
export function storableText(max: number) {
  return z
    .string({ message: 'must be a string' })
    .trim()
    .min(1, { message: 'must not be empty' })
    .max(max, { message: `must be at most ${max} characters` })
    .refine(isStorable, { message: NOT_STORABLE });
}
