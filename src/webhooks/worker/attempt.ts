import type { Config } from '../../config/index.ts';
import type { Sealer } from '../../core/crypto.ts';
import { failed, linkTo, SpanKind, type Tracing } from '../../tracing/index.ts';
import {
  backoffMs,
  buildRequest,
  PERMANENT_FAILURES,
  type Sender,
  type SendResult,
  type SignedRequest,
} from '../deliver.ts';
import type { AttemptResult, ClaimedDelivery } from '../queue.ts';

/**
 * One delivery attempt, as svix's worker runs it: prepare → call → handle success | handle failure, each
 * stage returning a typed value. Nothing here touches the database; the result writer records what
 * `runAttempt` returns.
 */

/** After prepare: the signed request to send, or an outcome decided without sending. */
export type Prepared =
  | { state: 'ready'; delivery: ClaimedDelivery; request: SignedRequest }
  | { state: 'decided'; delivery: ClaimedDelivery; completed: Completed };

/** After the call: the receiver took it (2xx), or it did not (to retry or to give up on). */
export type Completed =
  | { state: 'successful'; delivery: ClaimedDelivery; result: AttemptResult & { outcome: 'success' } }
  | {
      state: 'failed';
      delivery: ClaimedDelivery;
      result: AttemptResult & { outcome: 'retry' | 'error' };
    };

export interface AttemptDeps {
  config: Pick<Config, 'WEBHOOK_BACKOFF_BASE_MS'>;
  sender: Pick<Sender, 'send'>;
  /** The plaintext signing secret of a sealed one (cached by the caller). */
  openSecret(sealed: string): string;
  /** Aborted when the worker stops for good: requests in flight end, and are retried at once. */
  signal: AbortSignal;
}

export function prepare(deps: AttemptDeps, delivery: ClaimedDelivery, startedAt: Date): Prepared {
  if (!delivery.is_active)
    return {
      state: 'decided',
      delivery,
      completed: handleFailure(delivery, {
        outcome: 'error',
        error: 'the subscription is inactive',
        durationMs: 0,
        startedAt,
      }),
    };
  const request = buildRequest(
    {
      id: delivery.id,
      subscriptionId: delivery.subscription_id,
      attempts: delivery.attempts,
      createdAt: delivery.created_at.toISOString(),
      updatedAt: delivery.updated_at.toISOString(),
    },
    delivery.envelope,
    deps.openSecret(delivery.secret_sealed),
    delivery.custom_headers,
  );
  return { state: 'ready', delivery, request };
}

export async function call(
  deps: AttemptDeps,
  prepared: Extract<Prepared, { state: 'ready' }>,
): Promise<SendResult> {
  return deps.sender.send(prepared.delivery.url, prepared.request, deps.signal);
}

/** Classifies the answer: 2xx succeeded; a permanent refusal or the last attempt ends; else retry. */
export function complete(
  deps: AttemptDeps,
  delivery: ClaimedDelivery,
  sent: SendResult,
  startedAt: Date,
): Completed {
  const base = {
    status: sent.status,
    excerpt: sent.excerpt,
    error: sent.error,
    durationMs: sent.durationMs,
    startedAt,
  };
  if (sent.status !== undefined && sent.status >= 200 && sent.status < 300)
    return handleSuccess(delivery, { ...base, outcome: 'success' });
  if (
    (sent.status !== undefined && PERMANENT_FAILURES.has(sent.status)) ||
    delivery.attempts >= delivery.attempt_limit
  )
    return handleFailure(delivery, { ...base, outcome: 'error' });
  const retryInMs = deps.signal.aborted
    ? 0
    : (sent.retryAfterMs ?? backoffMs(deps.config.WEBHOOK_BACKOFF_BASE_MS, delivery.attempts));
  return handleFailure(delivery, { ...base, outcome: 'retry', retryInMs });
}

function handleSuccess(delivery: ClaimedDelivery, result: AttemptResult & { outcome: 'success' }): Completed {
  return { state: 'successful', delivery, result };
}

function handleFailure(
  delivery: ClaimedDelivery,
  result: AttemptResult & { outcome: 'retry' | 'error' },
): Completed {
  return { state: 'failed', delivery, result };
}

/** The whole attempt. Never rejects: a send failure is a failed attempt. */
export async function runAttempt(deps: AttemptDeps, delivery: ClaimedDelivery): Promise<Completed> {
  const startedAt = new Date();
  const prepared = prepare(deps, delivery, startedAt);
  if (prepared.state === 'decided') return prepared.completed;
  return complete(deps, delivery, await call(deps, prepared), startedAt);
}

/**
 * The whole attempt; with tracing, in a span of its own trace, linked to the trace of the request that
 * caused the event (the event's `metadata.traceparent`).
 */
export function tracedAttempt(tracing: Tracing, deps: AttemptDeps, d: ClaimedDelivery): Promise<Completed> {
  if (!tracing.enabled) return runAttempt(deps, d);
  const span = tracing.start(
    'tollgate.webhook.delivery',
    {
      'tollgate.event.id': d.envelope.id,
      'tollgate.event.type': d.envelope.type,
      'tollgate.project.id': d.project_id,
      'tollgate.webhook.subscription_id': d.subscription_id,
      'tollgate.webhook.delivery_id': d.id,
      'tollgate.webhook.attempt': d.attempts,
    },
    { kind: SpanKind.CLIENT, root: true, links: linkTo(d.envelope.metadata?.traceparent) },
  )!;
  return runAttempt(deps, d).then(
    (completed) => {
      span.setAttribute('tollgate.outcome', completed.result.outcome);
      if (completed.result.status !== undefined)
        span.setAttribute('http.response.status_code', completed.result.status);
      if (completed.state === 'failed') failed(span, completed.result.error ?? 'delivery failed');
      span.end();
      return completed;
    },
    (err) => {
      failed(span, err);
      span.end();
      throw err;
    },
  );
}

/** Opens sealed signing secrets, keeping the plaintexts of the recent ones (bounded). */
export function cachedSecrets(sealer: Pick<Sealer, 'open'>): (sealed: string) => string {
  const secrets = new Map<string, string>();
  return (sealed) => {
    let secret = secrets.get(sealed);
    if (secret === undefined) {
      secret = sealer.open(sealed);
      if (secrets.size > 10_000) secrets.clear();
      secrets.set(sealed, secret);
    }
    return secret;
  };
}
