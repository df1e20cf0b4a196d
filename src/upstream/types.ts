/**
 * A model provider as the metered APIs see it: OpenAI's HTTP APIs (`/chat/completions`, `/responses`,
 * `/embeddings`) under one base URL, non-streaming (the JSON text of the answer) or streaming (each
 * server-sent event's name and data, `[DONE]` included). Providers throw UpstreamError for every
 * failure except the caller's own abort.
 */
export interface UpstreamCall {
  /** Path under the provider's base URL, e.g. `/chat/completions`. */
  path: string;
  /** The body to send: the client's request with the provider's model name and Tollgate's bounds. */
  body: Record<string, unknown>;
  /** Aborted when the client goes away or Tollgate stops a stream at its bound. */
  signal: AbortSignal;
  /** Client headers forwarded to the provider (the Messages API's `anthropic-version`, `anthropic-beta`). */
  headers?: Record<string, string> | undefined;
  /**
   * Told by a translation (./anthropic/) the request fields it left out as hints (none: `[]`, also told
   * by a provider that takes the call as is), once per attempt: the caller names them in the answer's
   * DROPPED_HINTS_HEADER.
   */
  onDropped?: ((hints: readonly string[]) => void) | undefined;
}

/** The response header naming the hints a translation left out: `context_management, defer_loading`. */
export const DROPPED_HINTS_HEADER = 'x-tollgate-dropped-hints';

export interface UpstreamAnswer {
  /** The provider's JSON exactly as received (returned to the client as is). */
  text: string;
  json: Record<string, unknown>;
}

/** One server-sent event: its `event:` name (Responses streams name theirs) and its data. */
export interface SseMessage {
  event: string | undefined;
  data: string;
  /**
   * Set by a translation (./anthropic/) whose event carries usage Tollgate wrote, not the provider's
   * (a translated `message_start` has no provider usage yet): the reader must not record it as reported.
   */
  placeholderUsage?: true;
  /**
   * Set by a translation to a client API that carries usage only at its end (Chat Completions): the
   * provider's usage as reported so far, so a stream that breaks off is charged from it. A message with
   * empty `data` carries only this and is not relayed.
   */
  usage?: ChatUsage;
}

/** A request passed through unmetered (e.g. `GET /responses/{id}`). */
export interface PassthroughCall {
  method: string;
  /** Path and query under the provider's base URL. */
  path: string;
  body: string | undefined;
  signal: AbortSignal;
  /** Client headers sent with the provider's own (the Messages API's `anthropic-version`, `anthropic-beta`). */
  headers?: Record<string, string> | undefined;
}

export interface PassthroughAnswer {
  status: number;
  contentType: string | undefined;
  body: AsyncIterable<Uint8Array>;
}

export interface Provider {
  complete(call: UpstreamCall): Promise<UpstreamAnswer>;
  /** Resolves once the provider accepted the request; iterating yields each event. */
  stream(call: UpstreamCall): Promise<AsyncIterable<SseMessage>>;
  passthrough(call: PassthroughCall): Promise<PassthroughAnswer>;
}

/** Chat completions' usage as providers report it (the fields Tollgate reads). */
export interface ChatUsage {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number | null } | null;
  completion_tokens_details?: { reasoning_tokens?: number | null } | null;
  /**
   * Cache writes, part of `prompt_tokens`, as Anthropic reports them: the chat usage of a translated
   * Anthropic answer carries them (as LiteLLM's does), so they are priced as cache writes.
   */
  cache_creation_input_tokens?: number | null;
  cache_creation?: CacheCreation | null;
}

/** Anthropic's split of cache writes by lifetime. */
export interface CacheCreation {
  ephemeral_5m_input_tokens?: number | null;
  ephemeral_1h_input_tokens?: number | null;
}

export type UpstreamFailure = 'status' | 'timeout' | 'connection' | 'malformed';

export class UpstreamError extends Error {
  readonly kind: UpstreamFailure;
  /** The provider's HTTP status, for `status` failures. */
  readonly upstreamStatus: number | undefined;
  /** The provider's error body (truncated), for `status` failures. */
  readonly body: string | undefined;
  readonly retryAfter: string | undefined;

  constructor(
    kind: UpstreamFailure,
    message: string,
    options: { status?: number; body?: string; retryAfter?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.upstreamStatus = options.status;
    this.body = options.body;
    this.retryAfter = options.retryAfter;
  }
}

/** The JSON object of one stream event; a `malformed` UpstreamError when it is not one. */
export function streamEventJson<T extends object = Record<string, unknown>>(data: string): T {
  let json: unknown;
  try {
    json = JSON.parse(data);
  } catch {
    throw new UpstreamError('malformed', 'The provider sent a stream event that is not JSON.');
  }
  if (json === null || typeof json !== 'object') {
    throw new UpstreamError('malformed', 'The provider sent a stream event that is not a JSON object.');
  }
  return json as T;
}

/** A provider's error inside a stream (`overloaded`: Anthropic's `overloaded_error`, a 529). */
export function streamError(body: string, overloaded = false): UpstreamError {
  return new UpstreamError('status', 'The provider reported an error in the stream.', {
    status: overloaded ? 529 : 500,
    body,
  });
}

/** True for the error an aborted upstream request ends with (our own abort, not a provider failure). */
export function isAbort(err: unknown): boolean {
  const e = err as { name?: string; code?: string } | null;
  return e?.name === 'AbortError' || e?.code === 'UND_ERR_ABORTED' || e?.code === 'ABORT_ERR';
}
