import { z } from 'zod';
import { userIdSchema } from '../users/schema.ts';

/** The body of `POST /v1/embeddings`, as OpenAI defines it; unknown fields pass through as received. */
const tokenArray = z.array(z.number().int().min(0), { message: 'must be an array of token ids' });

export const embeddingsRequestSchema = z.looseObject({
  model: z.string({ message: 'is required' }).min(1, { message: 'must not be empty' }),
  input: z.union(
    [z.string(), z.array(z.string()).min(1), tokenArray.min(1), z.array(tokenArray.min(1)).min(1)],
    { message: 'must be a string, an array of strings, an array of token ids or an array of those' },
  ),
  encoding_format: z.enum(['float', 'base64'], { message: "must be 'float' or 'base64'" }).optional(),
  dimensions: z.number({ message: 'must be a positive integer' }).int().min(1).optional(),
  user: userIdSchema.optional(),
});
export type EmbeddingsRequest = z.infer<typeof embeddingsRequestSchema>;
