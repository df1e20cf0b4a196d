import type { IncomingHttpHeaders } from 'node:http';
import type { z } from 'zod';
import type { Trigger } from '../billing/ledger.ts';
import type { Hold } from '../billing/service.ts';
import type { ApiError } from '../core/errors.ts';
import type { ModelEndpoint, ModelRow } from '../db/schema.ts';
import type { LinkReply } from '../paywall/replies.ts';
import type { ProjectContext } from '../projects/directory.ts';
import type { TextCounter } from '../tokens/count.ts';
import type { Span } from '../tracing/index.ts';
import type { SseMessage } from '../upstream/types.ts';
import type { MeteredPricing, TokenUsage } from './cost.ts';

/**
 * One of the APIs the metered flow (flow.ts) serves. The flow owns what every API shares — the end
 * user, the paywall decision and hold, forwarding, settling from usage, and the observers (limits,
 * metrics, events, tracing) — and asks its adapter (src/chat/api.ts, src/responses/api.ts,
 * src/embeddings/api.ts, src/messages/api.ts) for the rest:
 * how to parse and count a request, where it goes upstream, how to read usage from the answer, how a
 * refused user is answered, and how a stream is relayed.
 */
export interface MeteredApi<B extends MeteredBody = MeteredBody> {
  /** The ledger source and the `api` of events; also the model capability needed unless `endpoint` says. */
  readonly name: ModelEndpoint | 'messages';
  /** The model capability the API needs (`endpoints` of the pricing file) when it is not `name`. */
  readonly endpoint?: ModelEndpoint;
  /** For messages: "Chat Completions", "Responses", "Embeddings". */
  readonly title: string;
  /** Path under the provider's base URL. */
  readonly upstreamPath: string;
  /** The request body's schema: the route validates with it before the flow runs. */
  readonly schema: z.ZodType<B>;
  /**
   * Input tokens as Tollgate counts them (the hold; the charge when the provider reports none), every
   * text through `count` (exact by default; bounded for the hold).
   */
  countInput(body: B, count?: TextCounter): number;
  /**
   * The output bound the client set (per choice); `undefined` when it set none (the model's
   * `maxOutputTokens`, capped by the project's `maxCompletionTokens`, applies); `0` for APIs that
   * produce no output tokens. `upstreamBody` sends the provider this bound, and no other.
   */
  requestedBound(body: B): number | undefined;
  /** Completions asked for (chat's `n`): the output bound is per completion. */
  choices(body: B): number;
  /** The provider's request: the client's body as received, with the provider's model and the bound. */
  upstreamBody(body: B, model: ModelRow, bound: number | undefined): Record<string, unknown>;
  /** Checks a non-streaming answer (UpstreamError `malformed` when it is not one) and reads it. */
  read(json: Record<string, unknown>): AnswerReading;
  /** The answer of a refused user (not connected, cannot pay), in a shape this API's clients accept. */
  refusal(link: LinkReply, x: Exchange<B>): RefusalReply;
  /** A reader of the provider's stream (APIs that stream). */
  streamReader?(x: Exchange<B>): StreamReader;
  /**
   * The end user named in the body when it is not `user` (the Messages API's `metadata.user_id`);
   * `undefined` lets the `X-Service-User` header name it.
   */
  endUser?(body: B, client: ClientHeaders): string | undefined;
  /** Client headers to forward to the provider. */
  upstreamHeaders?(client: ClientHeaders): Record<string, string> | undefined;
  /**
   * The earlier answer the request continues (Responses: `previous_response_id`, `conversation`): its
   * recorded size is added to the hold's input (chains.ts).
   */
  chain?(body: B): ChainRef | undefined;
  /** The input is a batch of independent inputs (embeddings): the context window bounds each, not the sum. */
  readonly batched?: boolean;
  /**
   * The longest cache write the body asks for (`cache_control` on the Messages API: '1h' when any asks
   * for `ttl: "1h"`): the worst case prices every input token as such a write.
   */
  cacheWrite?(body: B): '5m' | '1h' | undefined;
  /** The hold counts the prompt times this factor (a provider whose tokenizer counts more than o200k). */
  readonly inputMargin?: number;
  /** An error inside a stream (or before its first event) in this API's shape; OpenAI's otherwise. */
  renderError?(error: ApiError): { event: string | undefined; body: unknown };
}

/** The client's request as an API reads it: its headers (the route passes the request itself). */
export interface ClientHeaders {
  readonly headers: IncomingHttpHeaders;
}

export interface MeteredBody {
  model: string;
  user?: string | undefined;
  stream?: boolean | null | undefined;
}

/** Usage as the provider reported it; missing fields are counted by Tollgate. */
export type ReportedUsage = Partial<TokenUsage>;

/** Usage from a provider's fields, keeping only those it reported as numbers. */
export function reportedUsage(fields: { [K in keyof TokenUsage]?: unknown }): ReportedUsage {
  const out: ReportedUsage = {};
  for (const [name, value] of Object.entries(fields)) {
    if (typeof value === 'number') out[name as keyof TokenUsage] = value;
  }
  return out;
}

/** The earlier answer a request continues. */
export interface ChainRef {
  previousResponseId?: string | undefined;
  conversationId?: string | undefined;
}

/** The provider's ids of an answer (Responses): recorded with the tokens charged, for the chain's hold. */
export interface AnswerIds {
  responseId: string;
  conversationId?: string | undefined;
}

/** Usage above the bounds of a request: the tokens reported beyond them (charged up to the bounds). */
export interface UsageAnomaly {
  /** Input tokens reported above the model's context window. */
  excessInput: number;
  /** Output tokens reported above the bound the provider received (× choices). */
  excessOutput: number;
  reportedInput: number;
  reportedOutput: number;
  inputBound: number | undefined;
  outputBound: number | undefined;
}

export interface AnswerReading {
  usage: ReportedUsage | undefined;
  /** The provider's ids of the answer (Responses). */
  ids?: AnswerIds | undefined;
  /** Output tokens counted by Tollgate from the answer (when the usage has none). */
  produced: number;
  finishReason: string | null;
  /** The id of an answer the provider is still working on (see Ending.pending). */
  pending?: string | undefined;
}

export type RefusalReply = { kind: 'json'; status: number; body: unknown } | { kind: 'stream'; body: string };

/** What the flow knows about one request while serving it. */
export interface Exchange<B extends MeteredBody = MeteredBody> {
  api: MeteredApi<B>;
  requestId: string;
  project: ProjectContext;
  model: ModelRow;
  pricing: MeteredPricing;
  body: B;
  externalId: string;
  userId: string;
  stream: boolean;
  trigger: Trigger;
  started: number;
  /** Completions asked for (chat's `n`). */
  choices: number;
  hold: Hold | undefined;
  /** Input tokens counted by Tollgate (per-token pricing). */
  inputCount: number | undefined;
  /** Output tokens the hold pays for, per choice (per-token pricing): the bound the provider receives. */
  bound: number | undefined;
  /** The most input tokens charged: the model's context window (per-token pricing, unbatched APIs). */
  inputBound: number | undefined;
  /** The provider's ids of the answer, once read (Responses). */
  ids?: AnswerIds | undefined;
  startedEvent: Promise<unknown> | undefined;
  /** Client headers forwarded to the provider (`upstreamHeaders`). */
  upstreamHeaders?: Record<string, string> | undefined;
  /** The request's server span, when tracing is on (src/tracing). */
  span?: Span | undefined;
}

/**
 * Reads a provider's stream event by event: what to forward, how many output tokens each event adds,
 * the usage and finish reason seen, and how to end the stream (normally, or cut at the bound).
 */
export interface StreamReader {
  /** Throws UpstreamError for an event that is malformed or reports an error. */
  next(message: SseMessage): StreamStep;
  readonly usage: ReportedUsage | undefined;
  readonly finishReason: string | null;
  /** The provider's ids of the answer, once seen (Responses). */
  readonly ids?: AnswerIds | undefined;
  /** The provider said the answer is complete (`[DONE]`, a finish reason, `response.completed`). */
  readonly finished: boolean;
  /** Whether a stream can be stopped at the bound and still end validly. */
  readonly canCut: boolean;
  /** The id of an answer the provider goes on with after the stream broke off (see Ending.pending). */
  readonly pending?: string | undefined;
  /** SSE text that ends the relayed stream; `cut` when Tollgate stopped it at the bound. */
  tail(cut: boolean, counted: TokenUsage): string;
}

export type StreamStep =
  /** Forward the event (re-encoded as received) and count its output tokens. */
  | { action: 'forward'; tokens: number }
  /** Do not forward (e.g. the usage chunk Tollgate asked for and the client did not). */
  | { action: 'skip' }
  /** The provider's end marker: stop reading; the tail ends the stream. */
  | { action: 'end' };

/** The client of a metered request, as the route hands it over (a FastifyRequest is one). */
export interface MeteredClient {
  /** The authenticated project. */
  readonly project: ProjectContext;
  readonly apiKeyId: string;
  /** The user of the end-user key that authenticated the request, if it was one (end-user.ts). */
  readonly endUser?: string | undefined;
  /** The end user (`X-Service-User`), `traceparent`, the headers an API forwards. */
  readonly headers: IncomingHttpHeaders;
}

/** An unmetered call as the route hands it over. */
export interface PassthroughRequest {
  readonly project: ProjectContext;
  readonly method: string;
  readonly body: unknown;
  /** Another provider than `default` (a model's route), and client headers it gets (count_tokens). */
  readonly upstreamProvider?: string | undefined;
  readonly upstreamHeaders?: Record<string, string> | undefined;
}
