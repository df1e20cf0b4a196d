import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { AppContext } from '../../app/context.ts';
import { channels } from '../../bus/index.ts';
import { failed, linkTo, SpanKind } from '../../tracing/index.ts';
import { Sender } from '../deliver.ts';
import { fanOut } from '../fanout.ts';
import { disableFailingSubscriptions } from '../health.ts';
import {
  type ClaimedDelivery,
  EnvelopeCache,
  expireAbandoned,
  queueStats,
  releaseClaim,
  releaseOwnership,
  renewOwnership,
} from '../queue.ts';
import { type AttemptDeps, type Completed, runAttempt } from './attempt.ts';
import { ClaimLoop } from './claim.ts';
import { SerialLoop } from './loop.ts';
import { ResultWriter } from './result-writer.ts';
import { SubscriptionSlots } from './slots.ts';

/**
 * The webhook delivery worker, in parts:
 * - `claim.ts`: the claim loop (batches of due deliveries, of subscriptions this worker owns);
 * - `slots.ts`: per-subscription slots (at most N requests at once per subscription, the rest waiting);
 * - `attempt.ts`: one attempt, prepare → call → success | failure, each with its typed state;
 * - `result-writer.ts`: results written in groups;
 * - this file: the fan-out loop, timers, wake-ups, and start/stop.
 */

export interface WorkerOptions {
  /** Deliveries held (claimed and not finished) at once; default WEBHOOK_WORKER_CONCURRENCY. */
  concurrency?: number;
  /** Deliveries in flight per subscription, across all workers; default WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY. */
  perSubscription?: number;
  /** Default WEBHOOK_CLAIM_LEASE_MS. */
  leaseMs?: number;
  /**
   * How long this worker keeps a subscription without renewing it (it renews while it holds deliveries
   * of it); default the smaller of the claim lease and 15 s.
   */
  ownerLeaseMs?: number;
  /** Default WEBHOOK_POLL_INTERVAL_MS. */
  pollIntervalMs?: number;
  /** Events fanned out per transaction. */
  fanoutBatch?: number;
  /** How often the queue gauges are refreshed, abandoned final attempts ended and failing endpoints disabled. */
  statsIntervalMs?: number;
  /** This worker's identity in the ownership rows (default: host name and a random suffix). */
  identity?: string;
}

/** What `tollgate dev`, `tollgate worker` and the operator (while it leads) run. */
export interface DeliveryWorker {
  /** Resolves once the worker listens for wake-ups. */
  readonly ready: Promise<void>;
  /** Looks for new events and due deliveries now. */
  wake(): void;
  /**
   * Stops claiming, gives back claimed deliveries not yet sent, lets requests in flight finish within
   * `graceMs` (default 10 s; after that they are aborted and retried later), gives up its subscriptions'
   * ownership, then returns.
   */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Starts a delivery worker: fans outbox events out into deliveries and sends due deliveries, with
 * bounded concurrency per worker and per subscription. Wakes on the bus (`events.written`,
 * `deliveries.due`) and polls as a fallback. Any number may run at once; Postgres row locks keep them
 * from sending the same attempt twice, and subscription ownership keeps the per-subscription limit.
 */
export function startDeliveryWorker(ctx: AppContext, opts: WorkerOptions = {}): DeliveryWorker {
  const { config, log } = ctx;
  const concurrency = opts.concurrency ?? config.WEBHOOK_WORKER_CONCURRENCY;
  const perSubscription = opts.perSubscription ?? config.WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY;
  const leaseMs = opts.leaseMs ?? config.WEBHOOK_CLAIM_LEASE_MS;
  const ownerLeaseMs = opts.ownerLeaseMs ?? Math.min(leaseMs, 15_000);
  const pollMs = opts.pollIntervalMs ?? config.WEBHOOK_POLL_INTERVAL_MS;
  const fanoutBatch = opts.fanoutBatch ?? 200;
  const statsMs = opts.statsIntervalMs ?? Math.max(5000, pollMs);
  const owner = opts.identity ?? `${hostname()}-${randomBytes(4).toString('hex')}`;

  const sender = new Sender(config);
  const abort = new AbortController();
  const secrets = new Map<string, string>();
  const envelopes = new EnvelopeCache();
  const slots = new SubscriptionSlots(perSubscription);
  const writer = new ResultWriter(ctx.db);
  const tasks = new Set<Promise<void>>();
  let stopping = false;

  const attemptDeps: AttemptDeps = {
    config,
    sender,
    signal: abort.signal,
    openSecret(sealed) {
      let secret = secrets.get(sealed);
      if (secret === undefined) {
        secret = ctx.sealer.open(sealed);
        if (secrets.size > 10_000) secrets.clear();
        secrets.set(sealed, secret);
      }
      return secret;
    },
  };

  const claims = new ClaimLoop({
    db: ctx.db,
    log,
    slots,
    envelopes,
    owner,
    concurrency,
    leaseMs,
    ownerLeaseMs,
    dispatch(d) {
      if (slots.admit(d)) send(d);
    },
  });

  /**
   * One attempt; with tracing, in a span of its own trace, linked to the trace of the request that caused
   * the event (the event's `metadata.traceparent`).
   */
  function attempt(d: ClaimedDelivery): Promise<Completed> {
    const tracing = ctx.tracing;
    if (!tracing.enabled) return runAttempt(attemptDeps, d);
    const span = tracing.start(
      'tollgate.webhook.delivery',
      {
        'tollgate.event.id': d.envelope.id,
        'tollgate.event.type': d.envelope.type,
        'tollgate.project.id': d.envelope.paywallId,
        'tollgate.webhook.subscription_id': d.subscription_id,
        'tollgate.webhook.delivery_id': d.id,
        'tollgate.webhook.attempt': d.attempts,
      },
      { kind: SpanKind.CLIENT, root: true, links: linkTo(d.envelope.metadata?.traceparent) },
    )!;
    return runAttempt(attemptDeps, d).then(
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

  /** Sends one held delivery; its slot is given back as soon as the answer is in, the result written after. */
  function send(d: ClaimedDelivery): void {
    const task: Promise<void> = attempt(d)
      .then(
        (completed) => {
          freeSlot(d);
          return record(completed);
        },
        (err) => {
          freeSlot(d);
          throw err;
        },
      )
      .catch((err) => log.error({ err, delivery: d.id }, 'delivery failed unexpectedly'))
      .finally(() => tasks.delete(task));
    tasks.add(task);
  }

  function freeSlot(d: ClaimedDelivery): void {
    const { next, roomAgain } = slots.release(d.subscription_id);
    if (next) {
      if (!stopping) send(next);
      else {
        slots.abandon(next.subscription_id);
        const give: Promise<void> = releaseClaim(ctx.db, next)
          .catch(() => {})
          .finally(() => tasks.delete(give));
        tasks.add(give);
      }
    }
    claims.freed(roomAgain);
  }

  /** Records an attempt's result under its claim (in a group with others), then counts it. */
  async function record({ delivery: d, result }: Completed): Promise<void> {
    let recorded: boolean;
    try {
      recorded = await writer.write({ delivery: d, result });
    } catch (err) {
      log.warn(
        { err, delivery: d.id },
        'could not record a delivery result; it is retried when its lease runs out',
      );
      return;
    }
    if (!recorded) {
      log.warn(
        { delivery: d.id, attempt: d.attempts },
        'delivery claim was taken over after its lease ran out; result dropped',
      );
      return;
    }
    ctx.metrics.deliveries.inc({ project: d.project_id, outcome: result.outcome });
    ctx.metrics.deliveryLatency.observe({ outcome: result.outcome }, result.durationMs / 1000);
    if (result.outcome === 'retry') wakeIn(result.retryInMs ?? 0);
    else ctx.metrics.deliveryAttempts.observe({ outcome: result.outcome }, d.attempts);
    log.debug(
      {
        delivery: d.id,
        subscription: d.subscription_id,
        attempt: d.attempts,
        outcome: result.outcome,
        status: result.status,
        error: result.error,
        ms: result.durationMs,
      },
      'webhook attempt',
    );
  }

  // ---- the fan-out loop ----
  const fanout = new SerialLoop(async () => {
    try {
      while (!stopping) {
        const result = await fanOut(ctx, fanoutBatch, envelopes);
        if (result.deliveries > 0) {
          claims.wake();
          ctx.bus.publish(channels.deliveriesDue, '').catch(() => {});
        }
        if (result.events < fanoutBatch) return;
      }
    } catch (err) {
      if (!stopping) log.warn({ err }, 'fanning out events failed; retrying at the next poll');
    }
  });

  // ---- timers ----
  let wakeTimer: NodeJS.Timeout | undefined;
  let wakeAt = Number.POSITIVE_INFINITY;
  function wakeIn(ms: number): void {
    if (stopping) return;
    const at = Date.now() + ms;
    if (wakeTimer && at >= wakeAt) return;
    if (wakeTimer) clearTimeout(wakeTimer);
    wakeAt = at;
    wakeTimer = setTimeout(() => {
      wakeTimer = undefined;
      wakeAt = Number.POSITIVE_INFINITY;
      claims.wake();
    }, Math.max(ms, 0) + 5);
    wakeTimer.unref();
  }

  const poll = setInterval(() => {
    fanout.request();
    claims.wake();
  }, pollMs);
  poll.unref();

  // Ownership of the subscriptions this worker holds deliveries of is renewed well within its lease.
  const renew = setInterval(
    () => {
      renewOwnership(ctx.db, owner, slots.busy(), ownerLeaseMs).catch((err) =>
        log.debug({ err }, 'renewing subscription ownership failed'),
      );
    },
    Math.max(250, Math.floor(ownerLeaseMs / 3)),
  );
  renew.unref();

  let statsRunning = false;
  const refreshStats = async () => {
    if (statsRunning || stopping) return;
    statsRunning = true;
    try {
      const ended = await expireAbandoned(ctx.db);
      if (ended) log.info({ count: ended }, 'ended deliveries whose final attempt was abandoned');
      await disableFailingSubscriptions(ctx);
      const stats = await queueStats(ctx.db);
      ctx.metrics.deliveriesPending.set(stats.pending);
      ctx.metrics.oldestPendingAge.set(stats.oldestAgeSeconds);
    } catch (err) {
      log.debug({ err }, 'refreshing webhook queue stats failed');
    } finally {
      statsRunning = false;
    }
  };
  const stats = setInterval(refreshStats, statsMs);
  stats.unref();

  const unsubscribers: Array<() => Promise<void>> = [];
  const ready = (async () => {
    try {
      unsubscribers.push(await ctx.bus.subscribe(channels.eventsWritten, () => fanout.request()));
      unsubscribers.push(await ctx.bus.subscribe(channels.deliveriesDue, () => claims.wake()));
    } catch (err) {
      log.warn({ err }, 'delivery worker could not subscribe to wake-ups; polling only');
    }
    fanout.request();
    claims.wake();
    void refreshStats();
  })();

  return {
    ready,
    wake() {
      fanout.request();
      claims.wake();
    },
    async stop(graceMs = 10_000) {
      if (stopping) return;
      stopping = true;
      clearInterval(poll);
      clearInterval(stats);
      clearInterval(renew);
      if (wakeTimer) clearTimeout(wakeTimer);
      await ready;
      await Promise.allSettled(unsubscribers.map((u) => u()));
      await Promise.allSettled([claims.stop(), fanout.stop()]);
      const unsent = slots.drainWaiting();
      await Promise.allSettled(unsent.map((d) => releaseClaim(ctx.db, d)));
      const inFlight = Promise.allSettled([...tasks]);
      let timer: NodeJS.Timeout | undefined;
      const expired = await Promise.race([
        inFlight.then(() => false),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(true), graceMs);
        }),
      ]);
      clearTimeout(timer);
      if (expired) {
        abort.abort(new Error('the worker is stopping'));
        await inFlight;
      }
      await writer.idle();
      await releaseOwnership(ctx.db, owner).catch((err) =>
        log.debug({ err }, 'giving up subscription ownership failed; it runs out by itself'),
      );
      await sender.close();
    },
  };
}
