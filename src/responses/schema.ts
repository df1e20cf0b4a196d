import { z } from 'zod';
import { userIdSchema } from '../users/schema.ts';

/**
 * The body of `POST /v1/responses`: the fields Tollgate reads (`model`, `input`, `instructions`,
 * `stream`, `user`, `max_output_tokens`, `tools`, `previous_response_id`, `conversation`) are checked
 * for their shape; every other field of OpenAI's Responses API (`text`, `reasoning`, `store`, …) passes
 * through as received.
 */
const positiveInt = z
  .number({ message: 'must be a positive integer' })
  .int({ message: 'must be a positive integer' })
  .min(1, { message: 'must be a positive integer' });

export const responsesRequestSchema = z.looseObject({
  model: z.string({ message: 'is required' }).min(1, { message: 'must not be empty' }),
  input: z
    .union([z.string(), z.array(z.looseObject({}), { message: 'must be an array of input items' })], {
      message: 'must be a string or an array of input items',
    })
    .optional(),
  instructions: z.string({ message: 'must be a string' }).nullable().optional(),
  stream: z.boolean({ message: 'must be a boolean' }).nullable().optional(),
  user: userIdSchema.optional(),
  max_output_tokens: positiveInt.nullable().optional(),
  tools: z
    .array(z.looseObject({ type: z.string({ message: 'must be a string' }) }))
    .nullable()
    .optional(),
  /** A chain: its recorded size is held (src/metering/chains.ts). */
  previous_response_id: z.string({ message: 'must be a string' }).min(1).max(512).nullable().optional(),
  conversation: z
    .union(
      [
        z.string().min(1).max(512),
        z.looseObject({ id: z.string({ message: 'must be a string' }).min(1).max(512) }),
      ],
      { message: 'must be a conversation id or an object with its `id`' },
    )
    .nullable()
    .optional(),
});
export type ResponsesRequest = z.infer<typeof responsesRequestSchema>;
