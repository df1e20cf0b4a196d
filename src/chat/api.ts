import type { ModelRow } from '../db/schema.ts';
import type { Exchange, MeteredApi, ReportedUsage, StreamReader, StreamStep } from '../metering/api.ts';
import { reportedUsage } from '../metering/api.ts';
import type { TokenUsage } from '../metering/cost.ts';
import { DONE, sseEvent } from '../metering/relay.ts';
import { type LinkReply, paywallField } from '../paywall/replies.ts';
import { countText } from '../tokens/count.ts';
import { countPromptTokens, producedText } from '../tokens/inputs.ts';
import { cacheWritesOf } from '../upstream/anthropic/provider.ts';
import {
  type ChatUsage,
  type SseMessage,
  streamError,
  streamEventJson,
  UpstreamError,
} from '../upstream/types.ts';
import { outputWithReasoning } from '../upstream/usage.ts';
import { type ChatRequest, chatRequestSchema } from './schema.ts';
import { type ChunkMeta, chunkJson, chunkMeta, messageStream, usageChunkJson } from './sse.ts';

/**
 * `POST /v1/chat/completions` as a metered API. The request is forwarded as received, with the
 * provider's model name, the completion bound the hold pays for in one field (the one the client used —
 * `max_completion_tokens` when it sent both, the other dropped — else the one the model takes) and, when streaming, `stream_options.include_usage`. Usage is read from `usage`
 * (`prompt_tokens`, `prompt_tokens_details.cached_tokens`, `completion_tokens`,
 * `completion_tokens_details.reasoning_tokens`). Streams pass through chunk by chunk — content,
 * `tool_calls` deltas, refusals, logprobs, audio alike — and are cut at the bound with a
 * `finish_reason: "length"` chunk for every unfinished choice.
 */
export const chatApi: MeteredApi<ChatRequest> = {
  name: 'chat',
  title: 'Chat Completions',
  upstreamPath: '/chat/completions',
  schema: chatRequestSchema,
  countInput: countPromptTokens,
  requestedBound: (body) => body.max_completion_tokens ?? body.max_tokens ?? undefined,
  choices: (body) => body.n ?? 1,

  upstreamBody(body, model, bound) {
    const out: Record<string, unknown> = { ...body, model: model.upstream_model };
    if (body.stream === true) out.stream_options = { ...body.stream_options, include_usage: true };
    // One bound upstream, the one held: a second field (`max_tokens` beside `max_completion_tokens`)
    // is dropped, never forwarded uncovered.
    delete out.max_tokens;
    delete out.max_completion_tokens;
    if (bound !== undefined) out[boundField(body, model)] = bound;
    return out;
  },

  read(json) {
    const choices = json.choices;
    if (!Array.isArray(choices)) {
      throw new UpstreamError('malformed', 'The provider returned a response without `choices`.');
    }
    const usage = chatUsage(json.usage as ChatUsage | null | undefined);
    let produced = 0;
    let finishReason: string | null = null;
    for (const choice of choices as Array<{
      message?: Record<string, unknown>;
      finish_reason?: string | null;
    }>) {
      if (usage?.output === undefined) produced += countText(producedText(choice?.message));
      finishReason ??= choice?.finish_reason ?? null;
    }
    return { usage, produced, finishReason };
  },

  refusal(link, x) {
    const meta = chunkMeta(x.model.id);
    if (!x.stream) return { kind: 'json', status: 200, body: linkCompletion(meta, link) };
    return {
      kind: 'stream',
      body: messageStream(meta, link.message, x.body.stream_options?.include_usage === true),
    };
  },

  streamReader: (x) => new ChatStreamReader(x),
};

/** A non-streaming completion whose assistant message carries the link (plus `paywall` for programs). */
export function linkCompletion(meta: ChunkMeta, link: LinkReply) {
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: link.message, refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 },
    paywall: paywallField(link),
  };
}

/**
 * Chat usage in Tollgate's terms. Reasoning tokens are part of `completion_tokens` (OpenAI, and most
 * providers) unless `total_tokens` says they are beside it (total = prompt + completion + reasoning, as
 * some OpenAI-compatible servers report): then the output is completion + reasoning. Cache writes are
 * read where a translated Anthropic answer (or LiteLLM) puts them: `cache_creation_input_tokens`.
 */
export function chatUsage(usage: ChatUsage | null | undefined): ReportedUsage | undefined {
  if (!usage) return undefined;
  const reasoning = usage.completion_tokens_details?.reasoning_tokens;
  const writes = cacheWritesOf(usage);
  return reportedUsage({
    input: usage.prompt_tokens,
    output: outputWithReasoning(usage.prompt_tokens, usage.completion_tokens, reasoning, usage.total_tokens),
    cachedInput: usage.prompt_tokens_details?.cached_tokens,
    reasoning,
    cacheWrite: writes?.write,
    cacheWrite1h: writes?.write1h,
  });
}

interface StreamChunk {
  id?: unknown;
  created?: unknown;
  model?: unknown;
  error?: unknown;
  usage?: ChatUsage | null;
  choices?: Array<{ index?: number; delta?: Record<string, unknown>; finish_reason?: string | null } | null>;
}

class ChatStreamReader implements StreamReader {
  readonly canCut = true;
  usage: ReportedUsage | undefined;
  finishReason: string | null = null;
  #done = false;
  #meta: ChunkMeta | undefined;
  /** Choices seen, and whether each has finished. */
  readonly #choices = new Map<number, boolean>();
  readonly #x: Exchange<ChatRequest>;
  readonly #wantsUsage: boolean;

  constructor(x: Exchange<ChatRequest>) {
    this.#x = x;
    this.#wantsUsage = x.body.stream_options?.include_usage === true;
  }

  get finished(): boolean {
    return this.#done || this.finishReason !== null;
  }

  next(message: SseMessage): StreamStep {
    const data = message.data;
    // The provider's usage as a translation learnt it (src/upstream/anthropic/chat-over-messages.ts).
    if (message.usage) this.usage = chatUsage(message.usage);
    if (data === '') return { action: 'skip' };
    if (data === '[DONE]') {
      this.#done = true;
      return { action: 'end' };
    }
    const chunk = streamEventJson<StreamChunk>(data);
    if (chunk.error) throw streamError(data);
    this.#meta ??= {
      id: String(chunk.id ?? ''),
      created: Number(chunk.created ?? 0),
      model: String(chunk.model ?? ''),
    };
    if (chunk.usage) this.usage = chatUsage(chunk.usage);
    const choices = chunk.choices;
    let tokens = 0;
    if (Array.isArray(choices) && choices.length > 0) {
      for (const choice of choices) {
        const index = typeof choice?.index === 'number' ? choice.index : 0;
        const text = producedText(choice?.delta);
        if (text) tokens += countText(text);
        if (choice?.finish_reason) {
          this.finishReason = choice.finish_reason;
          this.#choices.set(index, true);
        } else if (!this.#choices.has(index)) {
          this.#choices.set(index, false);
        }
      }
    } else if (chunk.usage && !this.#wantsUsage) {
      return { action: 'skip' }; // the usage chunk Tollgate asked for; the client did not
    }
    return { action: 'forward', tokens };
  }

  /**
   * Ends the stream: when cut at the bound, a `finish_reason: "length"` chunk for every choice still
   * open (so the SDKs' stream helpers can finalise every choice); the usage chunk the client asked for
   * when the provider sent none (or the stream was cut), counted; `[DONE]`.
   */
  tail(cut: boolean, counted: TokenUsage): string {
    const meta = this.#meta ?? chunkMeta(this.#x.model.upstream_model);
    let tail = '';
    if (cut) {
      const open = [...this.#choices].filter(([, finished]) => !finished).map(([index]) => index);
      for (const index of open.length || this.#choices.size ? open : [0]) {
        tail += sseEvent(chunkJson(meta, {}, 'length', index));
      }
    }
    if (this.#wantsUsage && (!this.usage || cut)) {
      tail += sseEvent(
        usageChunkJson(meta, {
          prompt_tokens: counted.input,
          completion_tokens: counted.output,
          total_tokens: counted.input + counted.output,
        }),
      );
    }
    return tail + DONE;
  }
}

/**
 * The field that carries the completion bound upstream: the one the client used, else
 * `max_completion_tokens` for OpenAI's reasoning models (which refuse `max_tokens`), else `max_tokens`.
 */
function boundField(body: ChatRequest, model: ModelRow): 'max_tokens' | 'max_completion_tokens' {
  if (body.max_completion_tokens != null) return 'max_completion_tokens';
  if (body.max_tokens != null) return 'max_tokens';
  return /^(o\d|gpt-5)/.test(model.upstream_model) ? 'max_completion_tokens' : 'max_tokens';
}
