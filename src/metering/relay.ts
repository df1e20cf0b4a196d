import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { ApiError } from '../core/errors.ts';
import { DROPPED_HINTS_HEADER, type PassthroughAnswer, type SseMessage } from '../upstream/types.ts';

/**
 * Everything that writes a metered request's response (the only code touching `reply.raw`): JSON
 * answers, server-sent event streams relayed as they arrive, errors before or inside a stream, and
 * watching for a client that goes away.
 */

/**
 * Server-sent events as OpenAI streams them: `data: <json>\n\n` per event (Responses events also carry
 * `event: <type>`). The headers keep proxies and ingress controllers (nginx's `X-Accel-Buffering`)
 * from buffering.
 */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache, no-transform',
  connection: 'keep-alive',
  'x-accel-buffering': 'no',
} as const;

export const DONE = 'data: [DONE]\n\n';

export function sseEvent(data: string, event?: string): string {
  return event ? `event: ${event}\ndata: ${data}\n\n` : `data: ${data}\n\n`;
}

export function sseMessage(message: SseMessage): string {
  return sseEvent(message.data, message.event);
}

/** Aborts the upstream call when the client goes away before its response is finished. */
export class ClientWatch {
  readonly #res: ServerResponse;
  readonly abort = new AbortController();
  gone = false;
  readonly #onClose = () => {
    if (!this.#res.writableFinished) {
      this.gone = true;
      this.abort.abort();
    }
  };

  constructor(reply: FastifyReply) {
    this.#res = reply.raw;
    this.#res.on('close', this.#onClose);
  }

  stop(): void {
    this.#res.off('close', this.#onClose);
  }
}

/**
 * A relayed stream: the head goes out with the first event; writes wait for the client to drain.
 *
 * The events of one read of the provider's answer leave in one write: `write` queues an event and the
 * queue is written at the end of the tick (once the events already read have been relayed), as one
 * chunk. One system call per event was a quarter of a streaming request's CPU; nothing waits longer
 * than the tick.
 */
export class SseSink {
  readonly #res: ServerResponse;
  readonly #headers: Record<string, string>;
  readonly #onHead: () => void;
  headSent = false;
  /** Events queued for the end of this tick. */
  #queued = '';
  #flushScheduled = false;
  /** Set while the client has not taken the last write: the next `write` waits for it. */
  #drain: Promise<void> | undefined;

  constructor(reply: FastifyReply, headers: Record<string, string>, onHead: () => void) {
    reply.hijack();
    this.#res = reply.raw;
    this.#headers = headers;
    this.#onHead = onHead;
  }

  get destroyed(): boolean {
    return this.#res.destroyed;
  }

  write(text: string): Promise<void> | undefined {
    this.#head();
    this.#queued += text;
    if (!this.#flushScheduled) {
      this.#flushScheduled = true;
      process.nextTick(() => this.#flush());
    }
    return this.#drain;
  }

  end(text: string): void {
    this.#head();
    this.#res.end(this.#take() + text);
  }

  /**
   * Ends with an error: an ordinary OpenAI-shaped error response before the first event, an SSE
   * `data: {"error": …}` event after it (the official clients raise it as an APIError).
   */
  fail(error: ApiError, render?: (error: ApiError) => { event: string | undefined; body: unknown }): void {
    const shaped = render?.(error) ?? { event: undefined, body: error.toBody() };
    if (this.headSent) {
      this.#res.end(this.#take() + sseEvent(JSON.stringify(shaped.body), shaped.event));
      return;
    }
    this.#res.writeHead(error.status, {
      'content-type': 'application/json; charset=utf-8',
      ...error.headers,
    });
    this.#res.end(JSON.stringify(shaped.body));
  }

  #flush(): void {
    this.#flushScheduled = false;
    const text = this.#take();
    if (!text || this.#res.writableEnded || this.#res.destroyed) return;
    if (!this.#res.write(text) && !this.#drain) {
      this.#drain = drained(this.#res).then(() => {
        this.#drain = undefined;
      });
    }
  }

  /** The queued events, taken off the queue. */
  #take(): string {
    const text = this.#queued;
    this.#queued = '';
    return text;
  }

  #head(): void {
    if (this.headSent) return;
    this.#res.writeHead(200, { ...SSE_HEADERS, ...this.#headers });
    this.headSent = true;
    this.#onHead();
  }
}

/** Resolves when the response can take more data, or when the client went away. */
export function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** A provider's JSON answer, as received. */
export function sendJsonText(reply: FastifyReply, text: string): FastifyReply {
  return reply.header('content-type', 'application/json; charset=utf-8').send(text);
}

/** A whole stream at once (link replies). */
export function sendStream(reply: FastifyReply, body: string): FastifyReply {
  for (const [name, value] of Object.entries(SSE_HEADERS)) reply.header(name, value);
  return reply.send(body);
}

/** Names the hints a translation left out in DROPPED_HINTS_HEADER (none: no header). */
export function droppedHints(reply: FastifyReply): (hints: readonly string[]) => void {
  return (hints) => {
    if (hints.length) reply.header(DROPPED_HINTS_HEADER, hints.join(', '));
    else reply.removeHeader(DROPPED_HINTS_HEADER);
  };
}

/** The headers of a stream Tollgate writes itself (SseSink): the request id, and the hints left out. */
export function streamHead(reply: FastifyReply, requestId: string): Record<string, string> {
  const hints = reply.getHeader(DROPPED_HINTS_HEADER);
  const head: Record<string, string> = { 'x-tollgate-request-id': requestId };
  if (typeof hints === 'string') head[DROPPED_HINTS_HEADER] = hints;
  return head;
}

/** No one to answer: the client left. */
export function abandon(reply: FastifyReply): FastifyReply {
  return reply.hijack();
}

/** An unmetered call's answer, streamed through as the provider sent it. */
export function sendPassthrough(reply: FastifyReply, answer: PassthroughAnswer): FastifyReply {
  reply.code(answer.status);
  if (answer.contentType) reply.header('content-type', answer.contentType);
  return reply.send(answer.body);
}
