import { z } from 'zod';
import type { LinkReply } from '../chat/paywall.ts';
import { countText } from '../chat/tokens.ts';
import { badRequest } from '../core/errors.ts';
import { parseInput } from '../core/validation.ts';
import type { AnswerReading, MeteredApi, RefusalReply } from '../metering/api.ts';
import { UpstreamError } from '../upstream/types.ts';
import { userIdSchema } from '../users/routes.ts';

/**
 * `POST /v1/embeddings` as a metered API: per input token (a per-token price needs only
 * `inputPerMillion`), from the provider's `usage.prompt_tokens`, else counted (strings with
 * gpt-tokenizer, token arrays by their length). No output tokens, no streaming. A user who cannot pay
 * cannot be shown a message here: the answer is 402 in OpenAI's error shape, with the link in the message
 * and in `url`.
 */
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

export function parseEmbeddingsRequest(body: unknown): EmbeddingsRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw badRequest('Request body must be a JSON object.', null, 'invalid_request');
  }
  return parseInput(embeddingsRequestSchema, body, 'body');
}

export function countEmbeddingInput(body: EmbeddingsRequest): number {
  const input = body.input;
  if (typeof input === 'string') return countText(input);
  let tokens = 0;
  for (const item of input as Array<string | number | number[]>) {
    if (typeof item === 'string') tokens += countText(item);
    else if (typeof item === 'number') tokens += 1;
    else tokens += item.length;
  }
  return tokens;
}

export const embeddingsApi: MeteredApi<EmbeddingsRequest> = {
  name: 'embeddings',
  title: 'Embeddings',
  upstreamPath: '/embeddings',
  parse: parseEmbeddingsRequest,
  countInput: countEmbeddingInput,
  requestedBound: () => 0,
  choices: () => 1,
  upstreamBody: (body, model) => ({ ...body, model: model.upstream_model }),

  read(json): AnswerReading {
    if (!Array.isArray(json.data)) {
      throw new UpstreamError('malformed', 'The provider returned embeddings without `data`.');
    }
    const usage = json.usage as { prompt_tokens?: unknown } | null | undefined;
    const input = typeof usage?.prompt_tokens === 'number' ? usage.prompt_tokens : undefined;
    return { usage: input === undefined ? undefined : { input, output: 0 }, produced: 0, finishReason: null };
  },

  refusal: (link: LinkReply): RefusalReply => ({ kind: 'json', status: 402, body: paymentRequired(link) }),
};

/** The 402 of a refused embeddings request: OpenAI's error shape, plus the link in `url`. */
export function paymentRequired(link: LinkReply) {
  return {
    error: {
      message: link.message,
      type: 'payment_required',
      param: null,
      code: link.decision,
      url: link.url,
      ...(link.required ? { required: link.required, available: link.available } : {}),
    },
  };
}
