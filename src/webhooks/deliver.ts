import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { rootCertificates } from 'node:tls';
import { Agent, request } from 'undici';
import { type Config, ConfigError } from '../config/index.ts';
import type { EventEnvelope } from '../events/outbox.ts';
import { guardedLookup, hostOf, isPrivateAddress } from '../net/destination.ts';

/** Bytes of a response body read at most; the rest is dropped with the connection. */
export const RESPONSE_READ_LIMIT = 64 * 1024;
/** Characters of the response body kept in the delivery log. */
export const RESPONSE_EXCERPT_LIMIT = 2048;
/** Longest delay a `Retry-After` header may impose. */
export const RETRY_AFTER_MAX_MS = 3600_000;
/** Statuses that end a delivery at once: the receiver will not accept it however often it is sent. */
export const PERMANENT_FAILURES = new Set([400, 401, 403, 404, 410, 422]);

/** The spec's Delivery object inside a payload. */
export interface DeliveryObject {
  id: string;
  subscriptionId: string;
  attempts: number;
  createdAt: string;
  updatedAt: string;
}

/** The Event object of a payload in the spec's field order, `status` always `pending`. */
export function eventObject(envelope: EventEnvelope): EventEnvelope {
  return {
    id: envelope.id,
    paywallId: envelope.paywallId,
    ownerUserId: envelope.ownerUserId,
    type: envelope.type,
    version: envelope.version,
    status: 'pending',
    createdAt: envelope.createdAt,
    trigger: envelope.trigger,
    subject: envelope.subject,
    data: envelope.data,
    metadata: envelope.metadata ?? {},
  };
}

export function sign(secret: string, body: string | Buffer): string {
  return createHmac('sha256', secret).update(body).digest('hex');
}

export interface SignedRequest {
  body: string;
  headers: Record<string, string>;
}

/**
 * The exact bytes and headers of one attempt. `X-Service-Timestamp` equals `delivery.updatedAt` inside
 * the signed body, so a receiver can tell the timestamp was not altered.
 */
export function buildRequest(
  delivery: DeliveryObject,
  envelope: EventEnvelope,
  secret: string,
  customHeaders: Record<string, string>,
): SignedRequest {
  const event = eventObject(envelope);
  const body = JSON.stringify({ delivery, event });
  return {
    body,
    headers: {
      ...customHeaders,
      'content-type': 'application/json',
      'user-agent': 'Tollgate-Webhooks/1.0',
      'x-service-event': `${event.type}@${event.version}`,
      'x-service-signature': sign(secret, body),
      'x-service-timestamp': delivery.updatedAt,
    },
  };
}

export interface SendResult {
  /** HTTP status, when a response arrived. */
  status?: number;
  /** The start of the response body. */
  excerpt?: string;
  /** Time-out, connection or refusal reason, when no response arrived. */
  error?: string;
  durationMs: number;
  /** Delay asked for by `Retry-After` on 429/503, bounded. */
  retryAfterMs?: number;
}

/** Parses `Retry-After` (seconds or an HTTP date) into milliseconds, bounded; undefined when absent. */
export function parseRetryAfter(value: string | undefined, now = Date.now()): number | undefined {
  if (!value) return undefined;
  const trimmed = value.trim();
  let ms: number;
  if (/^\d+$/.test(trimmed)) ms = Number(trimmed) * 1000;
  else {
    const at = Date.parse(trimmed);
    if (Number.isNaN(at)) return undefined;
    ms = at - now;
  }
  return Math.min(Math.max(ms, 0), RETRY_AFTER_MAX_MS);
}

/** Delay before the attempt after `attempts` failed ones: base · 2^(attempts−1), ±20 % jitter. */
export function backoffMs(base: number, attempts: number, random = Math.random): number {
  const exp = Math.min(base * 2 ** Math.max(attempts - 1, 0), 24 * 3600_000);
  return Math.round(exp * (0.8 + 0.4 * random()));
}

function describeError(err: unknown): string {
  const e = err as NodeJS.ErrnoException & { cause?: NodeJS.ErrnoException };
  const cause = e.cause && typeof e.cause === 'object' ? e.cause : undefined;
  if (e.name === 'TimeoutError' || e.code === 'UND_ERR_HEADERS_TIMEOUT' || e.code === 'UND_ERR_BODY_TIMEOUT')
    return 'timeout: no complete response within the delivery time-out';
  if (e.code === 'UND_ERR_CONNECT_TIMEOUT') return 'timeout: connecting took too long';
  if (e.name === 'AbortError') return `aborted: ${String((e as { reason?: unknown }).reason ?? 'stopped')}`;
  const code = cause?.code ?? e.code;
  const message = cause?.message ?? e.message;
  if (code === 'EPRIVATEADDRESS') return message;
  return `connection error: ${code ? `${code} ` : ''}${message}`.slice(0, 500);
}

/**
 * Sends webhook requests over its own connection pool: connect time-out, the request time-out over
 * the whole exchange, no redirects (a 3xx is a failed attempt), response bodies read up to a bound,
 * and, unless private networks are allowed, the DNS answer checked inside the connection's lookup.
 */
export class Sender {
  readonly #agent: Agent;
  readonly #timeoutMs: number;
  readonly #allowPrivate: boolean;

  constructor(config: Config) {
    this.#timeoutMs = config.WEBHOOK_TIMEOUT_MS;
    this.#allowPrivate = config.WEBHOOK_ALLOW_PRIVATE_NETWORKS;
    let ca: string[] | undefined;
    if (config.WEBHOOK_CA_FILE) {
      try {
        ca = [...rootCertificates, readFileSync(config.WEBHOOK_CA_FILE, 'utf8')];
      } catch (err) {
        throw new ConfigError(
          'WEBHOOK_CA_FILE',
          `cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`,
        );
      }
    }
    this.#agent = new Agent({
      connect: {
        timeout: Math.min(config.WEBHOOK_TIMEOUT_MS, 10_000),
        ...(ca ? { ca } : {}),
        ...(this.#allowPrivate ? {} : { lookup: guardedLookup as never }),
      },
      allowH2: false,
      // The request's own AbortSignal enforces the time-out precisely; these are only a backstop.
      headersTimeout: config.WEBHOOK_TIMEOUT_MS + 1000,
      bodyTimeout: config.WEBHOOK_TIMEOUT_MS + 1000,
      keepAliveTimeout: 4_000,
      connections: 64,
    });
  }

  async send(url: string, signed: SignedRequest, signal?: AbortSignal): Promise<SendResult> {
    const started = performance.now();
    const elapsed = () => Math.round(performance.now() - started);
    let target: URL;
    try {
      target = new URL(url);
    } catch {
      return { error: 'invalid destination URL', durationMs: 0 };
    }
    const host = hostOf(target);
    if (!this.#allowPrivate && isIP(host) && isPrivateAddress(host))
      return { error: `refused: ${host} is a private, loopback or reserved address`, durationMs: 0 };
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    try {
      const res = await request(target, {
        method: 'POST',
        dispatcher: this.#agent,
        headers: signed.headers,
        body: signed.body,
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
      });
      const chunks: Buffer[] = [];
      let size = 0;
      try {
        for await (const chunk of res.body) {
          const buf = chunk as Buffer;
          chunks.push(buf);
          size += buf.length;
          if (size >= RESPONSE_READ_LIMIT) break;
        }
      } catch {
        // A body cut off or too slow still leaves the status, which decides the outcome.
      }
      if (size >= RESPONSE_READ_LIMIT) res.body.destroy();
      const text = Buffer.concat(chunks)
        .subarray(0, RESPONSE_EXCERPT_LIMIT * 4)
        .toString('utf8');
      const excerpt = text.slice(0, RESPONSE_EXCERPT_LIMIT);
      const result: SendResult = { status: res.statusCode, excerpt, durationMs: elapsed() };
      if (res.statusCode === 429 || res.statusCode === 503) {
        const header = res.headers['retry-after'];
        const retryAfter = parseRetryAfter(Array.isArray(header) ? header[0] : header);
        if (retryAfter !== undefined) result.retryAfterMs = retryAfter;
      }
      return result;
    } catch (err) {
      if (signal?.aborted) {
        const reason = signal.reason instanceof Error ? signal.reason.message : String(signal.reason);
        return { error: `aborted: ${reason}`, durationMs: elapsed() };
      }
      return { error: describeError(err), durationMs: elapsed() };
    }
  }

  async close(): Promise<void> {
    await this.#agent.close().catch(() => {});
  }
}
