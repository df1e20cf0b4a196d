import type { z } from 'zod';
import { badRequest } from './errors.ts';

/**
 * Parses input with a zod schema; the first problem becomes a 400 whose `param` names the field
 * (dotted path, e.g. `messages.0.role`).
 */
export function parseInput<S extends z.ZodType>(schema: S, input: unknown, where = 'body'): z.infer<S> {
  const result = schema.safeParse(input);
  if (result.success) return result.data;
  const issue = result.error.issues[0]!;
  const path = issue.path.map(String).join('.');
  let message = issue.message;
  if (issue.code === 'unrecognized_keys') {
    const keys = (issue as { keys: string[] }).keys;
    const field = path ? `${path}.${keys[0]}` : keys[0]!;
    return failWith(`Unknown field '${field}'.`, field);
  }
  if (issue.code === 'invalid_type' && message.toLowerCase().includes('received undefined')) {
    message = 'is required';
  }
  const param = path || where;
  throw badRequest(path ? `Invalid '${path}': ${message}` : `Invalid ${where}: ${message}`, param);
}

function failWith(message: string, param: string): never {
  throw badRequest(message, param);
}
