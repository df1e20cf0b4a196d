import { z } from 'zod';
import { badRequest } from '../core/errors.ts';
import { parseInput } from '../core/validation.ts';
import { userIdSchema } from '../users/routes.ts';

/**
 * The chat completion request as the spec defines it (`model`, `messages`, `stream`, `user`), plus the
 * OpenAI fields Tollgate itself reads (`max_tokens`, `max_completion_tokens`, `n`, `stream_options`).
 * Every other field (temperature, tools, response_format, …) passes through to the provider untouched.
 */
export const messageSchema = z.looseObject({
  role: z.enum(['system', 'user', 'assistant'], { message: "must be one of 'system', 'user', 'assistant'" }),
  content: z.string({ message: 'must be a string' }),
  name: z
    .string({ message: 'must be a string' })
    .regex(/^[a-zA-Z0-9_]{1,64}$/, { message: 'must be 1 to 64 letters, digits or underscores' })
    .optional(),
});
export type ChatMessage = z.infer<typeof messageSchema>;

const positiveInt = z
  .number({ message: 'must be a positive integer' })
  .int({ message: 'must be a positive integer' })
  .min(1, { message: 'must be a positive integer' });

export const chatRequestSchema = z.looseObject({
  model: z.string({ message: 'is required' }).min(1, { message: 'must not be empty' }),
  messages: z
    .array(messageSchema, { message: 'must be an array of messages' })
    .min(1, { message: 'must contain at least 1 message' }),
  stream: z.boolean({ message: 'must be a boolean' }).nullable().optional(),
  user: userIdSchema.optional(),
  max_tokens: positiveInt.nullable().optional(),
  max_completion_tokens: positiveInt.nullable().optional(),
  n: positiveInt.max(128, { message: 'must be at most 128' }).nullable().optional(),
  stream_options: z
    .looseObject({ include_usage: z.boolean({ message: 'must be a boolean' }).optional() })
    .nullable()
    .optional(),
});
export type ChatRequest = z.infer<typeof chatRequestSchema>;

export const END_USER_HEADER = 'x-service-user';

/** Parses the body; problems become 400s whose `param` names the field (e.g. `messages.0.role`). */
export function parseChatRequest(body: unknown): ChatRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw badRequest('Request body must be a JSON object.', null, 'invalid_request');
  }
  return parseInput(chatRequestSchema, body, 'body');
}

/**
 * The end user of a request: the body's `user`, else the `X-Service-User` header. When both are given
 * the body wins (it is the per-request field; the header is often a client-wide default). A request
 * with neither gets 400 naming `user`.
 */
export function resolveEndUser(body: ChatRequest, header: string | string[] | undefined): string {
  if (body.user !== undefined) return body.user;
  const fromHeader = Array.isArray(header) ? header[0] : header;
  if (fromHeader) {
    const checked = userIdSchema.safeParse(fromHeader);
    if (!checked.success) {
      throw badRequest(`Invalid 'X-Service-User': ${checked.error.issues[0]!.message}`, 'user');
    }
    return checked.data;
  }
  throw badRequest(
    'No end user: pass `user` in the body or the `X-Service-User` header, a stable pseudonymous id of your user.',
    'user',
    'missing_user',
  );
}
