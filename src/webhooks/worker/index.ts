import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { channels } from '../../bus/index.ts';
import type { Config } from '../../config/index.ts';
import type { Sealer } from '../../core/crypto.ts';
import type { Metrics } from '../../metrics/registry.ts';
import type { Tracing } from '../../tracing/index.ts';
import { Sender } from '../deliver.ts';
import { type FanoutContext, fanOut } from '../fanout.ts';
import type { EndpointHealthContext } from '../health.ts';
import { EnvelopeCache, releaseOwnership } from '../queue.ts';
import { type AttemptDeps, cachedSecrets, tracedAttempt } from './attempt.ts';
import { ClaimLoop } from './claim-loop.ts';
import { Dispatcher } from './dispatcher.ts';
import { Housekeeping } from './housekeeping.ts';
import { SerialLoop } from './serial-loop.ts';
import { SubscriptionSlots } from './subscription-slots.ts';
import { WakeTimer } from './wake-timer.ts';

/**
 * The webhook delivery worker, in parts:
 * - `claim-loop.ts`: the claim loop (batches of due deliveries, of subscriptions this worker owns);
 * - `subscription-slots.ts`: per-subscription slots (at most N requests at once per subscription, the
 *   rest waiting);
 * - `dispatcher.ts`: sending what was claimed as slots allow, results written and counted;
 * - `attempt.ts`: one attempt, prepare → call → success | failure, each with its typed state;
 * - `result-writer.ts`: results written in groups;
 * - `housekeeping.ts`: ownership renewal, abandoned deliveries, failing endpoints, queue gauges;
 * - `wake-timer.ts`: the claim loop woken when a retry falls due;
 * - this file: the fan-out loop, wake-ups, and start/stop.
 */

/** What the worker uses of the application context (callers pass the context). */
export interface WorkerContext extends FanoutContext, EndpointHealthContext {
  config: Config;
  log: Logger;
  sealer: Sealer;
  metrics: Metrics;
  tracing: Tracing;
}

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
export function startDeliveryWorker(ctx: WorkerContext, opts: WorkerOptions = {}): DeliveryWorker {
  const { config, log } = ctx;
  const leaseMs = opts.leaseMs ?? config.WEBHOOK_CLAIM_LEASE_MS;
  const ownerLeaseMs = opts.ownerLeaseMs ?? Math.min(leaseMs, 15_000);
  const pollMs = opts.pollIntervalMs ?? config.WEBHOOK_POLL_INTERVAL_MS;
  const fanoutBatch = opts.fanoutBatch ?? 200;
  const owner = opts.identity ?? `${hostname()}-${randomBytes(4).toString('hex')}`;

  const sender = new Sender(config);
  const abort = new AbortController();
  const envelopes = new EnvelopeCache();
  const slots = new SubscriptionSlots(opts.perSubscription ?? config.WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY);
  let stopping = false;

  const attemptDeps: AttemptDeps = {
    config,
    sender,
    signal: abort.signal,
    openSecret: cachedSecrets(ctx.sealer),
  };
  const retries = new WakeTimer(() => claims.wake());
  const dispatcher = new Dispatcher({
    db: ctx.db,
    log,
    metrics: ctx.metrics,
    slots,
    attempt: (d) => tracedAttempt(ctx.tracing, attemptDeps, d),
    freed: (roomAgain) => claims.freed(roomAgain),
    retryIn: (ms) => retries.in(ms),
  });
  const claims = new ClaimLoop({
    db: ctx.db,
    log,
    slots,
    envelopes,
    owner,
    concurrency: opts.concurrency ?? config.WEBHOOK_WORKER_CONCURRENCY,
    leaseMs,
    ownerLeaseMs,
    dispatch: (d) => dispatcher.dispatch(d),
  });

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

  // ---- wake-ups: the poll, the bus ----
  const wake = () => {
    fanout.request();
    claims.wake();
  };
  const poll = setInterval(wake, pollMs);
  poll.unref();
  const housekeeping = new Housekeeping({
    ctx,
    slots,
    owner,
    ownerLeaseMs,
    statsMs: opts.statsIntervalMs ?? Math.max(5000, pollMs),
  });

  const unsubscribers: Array<() => Promise<void>> = [];
  const ready = (async () => {
    try {
      unsubscribers.push(await ctx.bus.subscribe(channels.eventsWritten, () => fanout.request()));
      unsubscribers.push(await ctx.bus.subscribe(channels.deliveriesDue, () => claims.wake()));
    } catch (err) {
      log.warn({ err }, 'delivery worker could not subscribe to wake-ups; polling only');
    }
    wake();
    void housekeeping.refresh();
  })();

  return {
    ready,
    wake,
    async stop(graceMs = 10_000) {
      if (stopping) return;
      stopping = true;
      dispatcher.halt();
      clearInterval(poll);
      housekeeping.stop();
      retries.stop();
      await ready;
      await Promise.allSettled(unsubscribers.map((u) => u()));
      await Promise.allSettled([claims.stop(), fanout.stop()]);
      await dispatcher.finish(graceMs, () => abort.abort(new Error('the worker is stopping')));
      await releaseOwnership(ctx.db, owner).catch((err) =>
        log.debug({ err }, 'giving up subscription ownership failed; it runs out by itself'),
      );
      await sender.close();
    },
  };
}
