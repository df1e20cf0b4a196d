import type { AnswerReading, MeteredApi, RefusalReply } from '../metering/api.ts';
import type { LinkReply } from '../paywall/replies.ts';
import { countEmbeddingInput } from '../tokens/inputs.ts';
import { UpstreamError } from '../upstream/types.ts';
import { type EmbeddingsRequest, embeddingsRequestSchema } from './schema.ts';

/**
 * `POST /v1/embeddings` as a metered API: per input token (a per-token price needs only
 * `inputPerMillion`), from the provider's `usage.prompt_tokens`, else counted (strings with
 * gpt-tokenizer, token arrays by their length). No output tokens, no streaming. A user who cannot pay
 * cannot be shown a message here: the answer is 402 in OpenAI's error shape, with the link in the message
 * and in `url`.
 */
export const embeddingsApi: MeteredApi<EmbeddingsRequest> = {
  name: 'embeddings',
  title: 'Embeddings',
  upstreamPath: '/embeddings',
  schema: embeddingsRequestSchema,
  countInput: countEmbeddingInput,
  requestedBound: () => 0,
  batched: true,
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
