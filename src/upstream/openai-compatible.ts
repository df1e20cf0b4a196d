import { createParser } from 'eventsource-parser';
import { Agent, type Dispatcher } from 'undici';
import { guardedConnector } from '../net/destination.ts';
import {
  isAbort,
  type PassthroughAnswer,
  type PassthroughCall,
  type Provider,
  type SseMessage,
  type UpstreamAnswer,
  type UpstreamCall,
  UpstreamError,
} from './types.ts';

export interface UpstreamTimeouts {
  connectMs: number;
  /** For the response headers, and between two body chunks. */
  responseMs: number;
}

export interface UpstreamAgentOptions extends UpstreamTimeouts {
  /** TOLLGATE_ALLOW_PRIVATE_PROVIDERS: when false, every connection is judged by ../net/destination.ts. */
  allowPrivate: boolean;
}

/**
 * One undici Agent per process: a keep-alive connection pool per provider origin, shared by every
 * project that uses that provider. HTTP/1.1 (no pipelining) for predictable time-outs and aborts.
 * Unless private providers are allowed, each new connection is checked where it is made (address
 * literals before connecting, names inside the DNS lookup), so a base URL whose name later resolves to
 * a private address (DNS rebinding) still cannot reach it.
 */
export function createUpstreamAgent(options: UpstreamAgentOptions): Agent {
  return new Agent({
    connections: 512,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 120_000,
    ...(options.allowPrivate
      ? { connectTimeout: options.connectMs }
      : { connect: guardedConnector({ timeout: options.connectMs }) }),
    headersTimeout: options.responseMs,
    bodyTimeout: options.responseMs,
    allowH2: false,
  });
}

const MAX_ERROR_BODY = 8192;

export interface ProviderHttpOptions {
  /** How the key is sent: `Authorization: Bearer` (OpenAI-compatible) or `x-api-key` (Anthropic). */
  auth?: 'bearer' | 'x-api-key';
  /** Headers sent with every call (a call's own headers override them). */
  headers?: Record<string, string>;
}

/**
 * Any OpenAI-compatible provider: `POST {baseUrl}{path}` with a bearer key, for every API Tollgate
 * meters (`/chat/completions`, `/responses`, `/embeddings`), and other calls passed through as received.
 */
export class OpenAICompatibleProvider implements Provider {
  readonly #agent: Dispatcher;
  readonly #origin: string;
  readonly #basePath: string;
  readonly #headers: Record<string, string>;
  /** A provider's own response time-out (routing); the agent's otherwise. */
  readonly #timeouts: { headersTimeout?: number; bodyTimeout?: number };

  constructor(
    agent: Dispatcher,
    baseUrl: string,
    apiKey: string | undefined,
    responseMs?: number,
    options: ProviderHttpOptions = {},
  ) {
    const url = new URL(baseUrl.replace(/\/+$/, ''));
    this.#agent = agent;
    this.#origin = url.origin;
    this.#basePath = url.pathname.replace(/\/+$/, '');
    this.#timeouts = responseMs === undefined ? {} : { headersTimeout: responseMs, bodyTimeout: responseMs };
    const auth: Record<string, string> = !apiKey
      ? {}
      : options.auth === 'x-api-key'
        ? { 'x-api-key': apiKey }
        : { authorization: `Bearer ${apiKey}` };
    this.#headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...options.headers,
      ...auth,
    };
  }

  async complete(call: UpstreamCall): Promise<UpstreamAnswer> {
    const res = await this.#send(call);
    let text: string;
    try {
      text = await res.body.text();
    } catch (err) {
      throw failure(err);
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new UpstreamError('malformed', 'The provider returned a response that is not JSON.');
    }
    if (!json || typeof json !== 'object' || Array.isArray(json)) {
      throw new UpstreamError('malformed', 'The provider returned a response that is not a JSON object.');
    }
    return { text, json: json as Record<string, unknown> };
  }

  async stream(call: UpstreamCall): Promise<AsyncIterable<SseMessage>> {
    const res = await this.#send(call);
    const type = String(res.headers['content-type'] ?? '');
    if (!type.includes('text/event-stream')) {
      res.body.destroy();
      throw new UpstreamError(
        'malformed',
        `The provider answered a streaming request with ${type || 'no content type'}.`,
      );
    }
    return sseMessages(res.body);
  }

  async passthrough(call: PassthroughCall): Promise<PassthroughAnswer> {
    let res: Dispatcher.ResponseData;
    try {
      res = await this.#agent.request({
        origin: this.#origin,
        path: this.#basePath + call.path,
        method: call.method as Dispatcher.HttpMethod,
        headers: call.headers ? { ...this.#headers, ...call.headers } : this.#headers,
        ...(call.body !== undefined ? { body: call.body } : {}),
        signal: call.signal,
        ...this.#timeouts,
      });
    } catch (err) {
      throw failure(err);
    }
    const type = res.headers['content-type'];
    return {
      status: res.statusCode,
      contentType: typeof type === 'string' ? type : undefined,
      body: res.body,
    };
  }

  #auth(): Record<string, string> {
    const headers = this.#headers;
    if (headers.authorization) return { authorization: headers.authorization };
    if (headers['x-api-key']) return { 'x-api-key': headers['x-api-key'] };
    return {};
  }

  async #send(call: UpstreamCall): Promise<Dispatcher.ResponseData> {
    let res: Dispatcher.ResponseData;
    try {
      res = await this.#agent.request({
        origin: this.#origin,
        path: this.#basePath + call.path,
        method: 'POST',
        // The client's own headers (the Messages API's `anthropic-version`, …) go along, never the key.
        headers: call.headers ? { ...this.#headers, ...call.headers, ...this.#auth() } : this.#headers,
        body: JSON.stringify(call.body),
        signal: call.signal,
        ...this.#timeouts,
      });
    } catch (err) {
      throw failure(err);
    }
    if (res.statusCode !== 200) {
      let body = '';
      try {
        for await (const chunk of res.body) {
          body += chunk.toString();
          if (body.length > MAX_ERROR_BODY) break;
        }
      } catch {}
      res.body.destroy();
      const retryAfter = res.headers['retry-after'];
      throw new UpstreamError('status', `The provider answered ${res.statusCode}.`, {
        status: res.statusCode,
        body: body.slice(0, MAX_ERROR_BODY),
        ...(typeof retryAfter === 'string' ? { retryAfter } : {}),
      });
    }
    return res;
  }
}

/** Each server-sent event of a body, as it arrives (eventsource-parser does the framing). */
async function* sseMessages(body: Dispatcher.ResponseData['body']): AsyncGenerator<SseMessage> {
  const queue: SseMessage[] = [];
  const parser = createParser({ onEvent: (event) => queue.push({ event: event.event, data: event.data }) });
  const decoder = new TextDecoder();
  try {
    for await (const chunk of chunksOf(body)) {
      parser.feed(decoder.decode(chunk as Uint8Array, { stream: true }));
      if (queue.length) {
        for (const message of queue) yield message;
        queue.length = 0;
      }
    }
  } catch (err) {
    throw failure(err);
  } finally {
    if (!body.destroyed) body.destroy();
  }
  parser.feed(`${decoder.decode()}\n\n`);
  for (const message of queue) yield message;
}

/**
 * The chunks of a response body, with backpressure. Unlike a `for await` over the stream itself, leaving
 * early (the consumer stops after `[DONE]`, before the body's end was read) destroys the body without
 * building an AbortError and its stack trace — once per streamed request, a measurable share of the
 * proxy's CPU.
 */
async function* chunksOf(body: Dispatcher.ResponseData['body']): AsyncGenerator<Uint8Array> {
  const queue: Uint8Array[] = [];
  let ended = false;
  let failed: { err: unknown } | undefined;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const onData = (chunk: Uint8Array) => {
    queue.push(chunk);
    if (queue.length >= 16) body.pause();
    notify();
  };
  const onEnd = () => {
    ended = true;
    notify();
  };
  const onError = (err: unknown) => {
    failed = { err };
    notify();
  };
  body.on('data', onData).on('end', onEnd).on('error', onError);
  try {
    for (;;) {
      const chunk = queue.shift();
      if (chunk) {
        if (queue.length < 4 && body.isPaused()) body.resume();
        yield chunk;
        continue;
      }
      if (failed) throw failed.err;
      if (ended) return;
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
    }
  } finally {
    body.off('data', onData).off('end', onEnd).off('error', onError);
    body.on('error', () => {}); // nothing reads it any more; a late error must not end the process
    if (!body.destroyed) body.destroy();
  }
}

/**
 * What every failure to connect to a provider says, whatever the cause (refused, reset, not HTTP, a
 * refused private address, a connect time-out): the text must not tell a closed port from an open one.
 * The cause stays on the error for the logs.
 */
export const UNREACHABLE_MESSAGE = 'Could not connect to the model provider.';

/** Maps undici's errors to UpstreamError; our own abort is rethrown as is. */
export function failure(err: unknown): unknown {
  if (err instanceof UpstreamError || isAbort(err)) return err;
  const code = (err as { code?: string }).code ?? '';
  switch (code) {
    case 'UND_ERR_HEADERS_TIMEOUT':
      return new UpstreamError('timeout', 'The provider did not answer in time.', { cause: err });
    case 'UND_ERR_BODY_TIMEOUT':
      return new UpstreamError('timeout', 'The provider stopped sending its response.', { cause: err });
  }
  return new UpstreamError('connection', UNREACHABLE_MESSAGE, { cause: err });
}
