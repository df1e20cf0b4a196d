/**
 * A model provider as the chat service sees it: OpenAI's chat completions API, non-streaming (the
 * completion's JSON text) or streaming (the `data:` payloads of its server-sent events, `[DONE]`
 * included). Providers throw UpstreamError for every failure except the caller's own abort.
 */
export interface UpstreamCall {
  /** The body to send: the client's request with the provider's model name and Tollgate's bounds. */
  body: Record<string, unknown>;
  /** Aborted when the client goes away or Tollgate stops a stream at its bound. */
  signal: AbortSignal;
}

export interface Completion {
  /** The provider's JSON exactly as received (returned to the client as is). */
  text: string;
  json: CompletionJson;
}

export interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
}

export interface CompletionJson {
  id?: string;
  model?: string;
  choices: Array<{
    index?: number;
    message?: Record<string, unknown>;
    finish_reason?: string | null;
    [key: string]: unknown;
  }>;
  usage?: Usage | null;
  [key: string]: unknown;
}

export interface ChatProvider {
  complete(call: UpstreamCall): Promise<Completion>;
  /** Resolves once the provider accepted the request; iterating yields each event's data. */
  stream(call: UpstreamCall): Promise<AsyncIterable<string>>;
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

/** True for the error an aborted upstream request ends with (our own abort, not a provider failure). */
export function isAbort(err: unknown): boolean {
  const e = err as { name?: string; code?: string } | null;
  return e?.name === 'AbortError' || e?.code === 'UND_ERR_ABORTED' || e?.code === 'ABORT_ERR';
}
