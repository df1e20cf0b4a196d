import type { AppContext } from '../app/context.ts';
import { channels } from '../bus/index.ts';
import { backoffMs, buildRequest, PERMANENT_FAILURES, Sender, type SendResult } from './deliver.ts';
import { fanOut } from './fanout.ts';
import {
  type AttemptResult,
  type ClaimedDelivery,
  claimDue,
  EnvelopeCache,
  expireAbandoned,
  queueStats,
  type RecordItem,
  recordResults,
  releaseClaim,
} from './queue.ts';

export interface WorkerOptions {
  /** Deliveries in flight (claimed and not finished) at once; default WEBHOOK_WORKER_CONCURRENCY. */
  concurrency?: number;
  /** Deliveries in flight per subscription; default WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY. */
  perSubscription?: number;
  /** Default WEBHOOK_CLAIM_LEASE_MS. */
  leaseMs?: number;
  /** Default WEBHOOK_POLL_INTERVAL_MS. */
  pollIntervalMs?: number;
  /** Events fanned out per transaction. */
  fanoutBatch?: number;
  /** How often the queue gauges are refreshed and abandoned final attempts ended. */
  statsIntervalMs?: number;
}

export interface DeliveryWorker {
  /** Resolves once the worker listens for wake-ups. */
  readonly ready: Promise<void>;
  /** Looks for new events and due deliveries now. */
  wake(): void;
  /**
   * Stops claiming, gives back claimed deliveries not yet sent, lets requests in flight finish within
   * `graceMs` (default 10 s; after that they are aborted and retried later), then returns.
   */
  stop(graceMs?: number): Promise<void>;
}

/**
 * The delivery worker: fans outbox events out into deliveries and sends due deliveries, with bounded
 * concurrency per worker and per subscription. Wakes on the bus (`events.written`, `deliveries.due`)
 * and polls as a fallback. Any number may run at once (in `tollgate dev`, `tollgate worker`, or the
 * operator while it leads); Postgres row locks keep them from sending the same attempt twice.
 */
export function startDeliveryWorker(ctx: AppContext, opts: WorkerOptions = {}): DeliveryWorker {
  const { config, log } = ctx;
  const concurrency = opts.concurrency ?? config.WEBHOOK_WORKER_CONCURRENCY;
  const perSubscription = opts.perSubscription ?? config.WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY;
  const leaseMs = opts.leaseMs ?? config.WEBHOOK_CLAIM_LEASE_MS;
  const pollMs = opts.pollIntervalMs ?? config.WEBHOOK_POLL_INTERVAL_MS;
  const fanoutBatch = opts.fanoutBatch ?? 200;
  const statsMs = opts.statsIntervalMs ?? Math.max(5000, pollMs);
  // Deliveries of one subscription claimed at once: those in flight plus a short local queue, so that a
  // busy subscription is served from one claim instead of one claim per delivery. The queue is short
  // enough to be sent well within the lease.
  const perSubscriptionClaimed = perSubscription * 4;

  const sender = new Sender(config);
  const abort = new AbortController();
  const secrets = new Map<string, string>();
  const envelopes = new EnvelopeCache();
  let stopping = false;

  let claimed = 0;
  const sending = new Map<string, number>();
  const waiting = new Map<string, ClaimedDelivery[]>();
  const tasks = new Set<Promise<void>>();

  const secretOf = (sealed: string) => {
    let secret = secrets.get(sealed);
    if (secret === undefined) {
      secret = ctx.sealer.open(sealed);
      if (secrets.size > 10_000) secrets.clear();
      secrets.set(sealed, secret);
    }
    return secret;
  };

  function classify(d: ClaimedDelivery, sent: SendResult, startedAt: Date): AttemptResult {
    const base = {
      status: sent.status,
      excerpt: sent.excerpt,
      error: sent.error,
      durationMs: sent.durationMs,
      startedAt,
    };
    if (sent.status !== undefined && sent.status >= 200 && sent.status < 300)
      return { ...base, outcome: 'success' };
    if (sent.status !== undefined && PERMANENT_FAILURES.has(sent.status))
      return { ...base, outcome: 'error' };
    if (d.attempts >= d.attempt_limit) return { ...base, outcome: 'error' };
    const retryInMs = abort.signal.aborted
      ? 0
      : (sent.retryAfterMs ?? backoffMs(config.WEBHOOK_BACKOFF_BASE_MS, d.attempts));
    return { ...base, outcome: 'retry', retryInMs };
  }

  /** Sends one attempt and classifies the answer. */
  async function attempt(d: ClaimedDelivery): Promise<AttemptResult> {
    const startedAt = new Date();
    let result: AttemptResult;
    if (!d.is_active) {
      result = { outcome: 'error', error: 'the subscription is inactive', durationMs: 0, startedAt };
    } else {
      const updatedAt = d.updated_at.toISOString();
      const signed = buildRequest(
        {
          id: d.id,
          subscriptionId: d.subscription_id,
          attempts: d.attempts,
          createdAt: d.created_at.toISOString(),
          updatedAt,
        },
        d.envelope,
        secretOf(d.secret_sealed),
        d.custom_headers,
      );
      result = classify(d, await sender.send(d.url, signed, abort.signal), startedAt);
    }
    return result;
  }

  /** Records an attempt's result under its claim (in a group with others), then counts it. */
  async function finish(d: ClaimedDelivery, result: AttemptResult): Promise<void> {
    let recorded = false;
    try {
      recorded = await writeResult(d, result);
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
    if (result.outcome !== 'retry')
      ctx.metrics.deliveryAttempts.observe({ outcome: result.outcome }, d.attempts);
    if (result.outcome === 'retry') wakeIn(result.retryInMs ?? 0);
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

  // ---- results, written in groups: whatever finished while the previous write ran goes in the next ----
  const results: Array<{ item: RecordItem; resolve: (ok: boolean) => void; reject: (err: unknown) => void }> =
    [];
  let writing: Promise<void> | undefined;

  function writeResult(d: ClaimedDelivery, result: AttemptResult): Promise<boolean> {
    return new Promise((resolve, reject) => {
      results.push({ item: { delivery: d, result }, resolve, reject });
      kickWriter();
    });
  }

  function kickWriter(): void {
    if (writing || results.length === 0) return;
    writing = (async () => {
      while (results.length) {
        const batch = results.splice(0, 500);
        try {
          const recorded = await recordResults(
            ctx.db,
            batch.map((b) => b.item),
          );
          for (const b of batch) b.resolve(recorded.has(b.item.delivery.id));
        } catch (err) {
          for (const b of batch) b.reject(err);
        }
      }
    })().finally(() => {
      writing = undefined;
      kickWriter();
    });
  }

  function start(d: ClaimedDelivery): void {
    sending.set(d.subscription_id, (sending.get(d.subscription_id) ?? 0) + 1);
    // The request's slot is given back as soon as the answer is in; the result is written after.
    const task: Promise<void> = attempt(d)
      .finally(() => release(d))
      .then((result) => finish(d, result))
      .catch((err) => log.error({ err, delivery: d.id }, 'delivery failed unexpectedly'))
      .finally(() => tasks.delete(task));
    tasks.add(task);
  }

  function release(d: ClaimedDelivery): void {
    const wasFull = localLoad(d.subscription_id) >= perSubscriptionClaimed;
    claimed--;
    const left = (sending.get(d.subscription_id) ?? 1) - 1;
    if (left > 0) sending.set(d.subscription_id, left);
    else sending.delete(d.subscription_id);
    const queue = waiting.get(d.subscription_id);
    const next = queue?.shift();
    if (queue && queue.length === 0) waiting.delete(d.subscription_id);
    if (next) {
      if (!stopping) start(next);
      else {
        claimed--;
        const give: Promise<void> = releaseClaim(ctx.db, next)
          .catch(() => {})
          .finally(() => tasks.delete(give));
        tasks.add(give);
      }
    }
    // Claim again in batches: when enough slots are free and there may be more due work (the last
    // claim was full, or a subscription left out of it for being busy has room again).
    if (wasFull) lastClaimShort = false;
    if (!lastClaimShort && concurrency - claimed >= minClaim) requestPump(false);
  }

  /** Deliveries of a subscription this worker holds (sending or queued). */
  function localLoad(subscriptionId: string): number {
    return (sending.get(subscriptionId) ?? 0) + (waiting.get(subscriptionId)?.length ?? 0);
  }

  function dispatch(d: ClaimedDelivery): void {
    claimed++;
    if ((sending.get(d.subscription_id) ?? 0) < perSubscription) start(d);
    else {
      const queue = waiting.get(d.subscription_id) ?? [];
      queue.push(d);
      waiting.set(d.subscription_id, queue);
    }
  }

  // ---- the claim loop ----
  let pumping: Promise<void> | undefined;
  let pumpAgain = false;
  /** The last claim found less due work than it could take; set back by wake-ups. */
  let lastClaimShort = false;
  const minClaim = Math.max(1, Math.min(8, Math.floor(concurrency / 4)));

  /** Runs the claim loop (once more if it is running); a wake-up says new work may be due. */
  function requestPump(wakeUp = true): void {
    if (wakeUp) lastClaimShort = false;
    if (stopping) return;
    if (pumping) {
      pumpAgain = true;
      return;
    }
    pumping = runPump().finally(() => {
      pumping = undefined;
    });
  }

  async function runPump(): Promise<void> {
    try {
      do {
        pumpAgain = false;
        while (!stopping) {
          const want = Math.min(concurrency - claimed, 100);
          if (want <= 0) break;
          const full = new Set<string>();
          for (const sub of sending.keys()) {
            if (localLoad(sub) >= perSubscriptionClaimed) full.add(sub);
          }
          const batch = await claimDue(
            ctx.db,
            {
              limit: want,
              leaseMs,
              perSubscription: perSubscriptionClaimed,
              excludeSubscriptions: [...full],
            },
            envelopes,
          );
          if (stopping) {
            await Promise.allSettled(batch.map((d) => releaseClaim(ctx.db, d)));
            break;
          }
          for (const d of batch) dispatch(d);
          lastClaimShort = batch.length < want;
          if (batch.length < want) break;
        }
      } while (pumpAgain && !stopping);
    } catch (err) {
      if (!stopping) log.warn({ err }, 'claiming deliveries failed; retrying at the next poll');
    }
  }

  // ---- the fan-out loop ----
  let fanning: Promise<void> | undefined;
  let fanAgain = false;

  function requestFanout(): void {
    if (stopping) return;
    if (fanning) {
      fanAgain = true;
      return;
    }
    fanning = runFanout().finally(() => {
      fanning = undefined;
    });
  }

  async function runFanout(): Promise<void> {
    try {
      do {
        fanAgain = false;
        while (!stopping) {
          const result = await fanOut(ctx, fanoutBatch, envelopes);
          if (result.deliveries > 0) {
            requestPump();
            ctx.bus.publish(channels.deliveriesDue, '').catch(() => {});
          }
          if (result.events < fanoutBatch) break;
        }
      } while (fanAgain && !stopping);
    } catch (err) {
      if (!stopping) log.warn({ err }, 'fanning out events failed; retrying at the next poll');
    }
  }

  // ---- timers ----
  let wakeTimer: NodeJS.Timeout | undefined;
  let wakeAt = Number.POSITIVE_INFINITY;
  function wakeIn(ms: number): void {
    const at = Date.now() + ms;
    if (wakeTimer && at >= wakeAt) return;
    if (wakeTimer) clearTimeout(wakeTimer);
    wakeAt = at;
    wakeTimer = setTimeout(() => {
      wakeTimer = undefined;
      wakeAt = Number.POSITIVE_INFINITY;
      requestPump();
    }, Math.max(ms, 0) + 5);
    wakeTimer.unref();
  }

  const poll = setInterval(() => {
    requestFanout();
    requestPump();
  }, pollMs);
  poll.unref();

  let statsRunning = false;
  const refreshStats = async () => {
    if (statsRunning || stopping) return;
    statsRunning = true;
    try {
      const ended = await expireAbandoned(ctx.db);
      if (ended) log.info({ count: ended }, 'ended deliveries whose final attempt was abandoned');
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
      unsubscribers.push(await ctx.bus.subscribe(channels.eventsWritten, () => requestFanout()));
      unsubscribers.push(await ctx.bus.subscribe(channels.deliveriesDue, () => requestPump()));
    } catch (err) {
      log.warn({ err }, 'delivery worker could not subscribe to wake-ups; polling only');
    }
    requestFanout();
    requestPump();
    void refreshStats();
  })();

  return {
    ready,
    wake() {
      requestFanout();
      requestPump();
    },
    async stop(graceMs = 10_000) {
      if (stopping) return;
      stopping = true;
      clearInterval(poll);
      clearInterval(stats);
      if (wakeTimer) clearTimeout(wakeTimer);
      await ready;
      await Promise.allSettled(unsubscribers.map((u) => u()));
      await Promise.allSettled([pumping, fanning]);
      const unsent = [...waiting.values()].flat();
      waiting.clear();
      await Promise.allSettled(unsent.map((d) => releaseClaim(ctx.db, d)));
      claimed -= unsent.length;
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
      await writing;
      await sender.close();
    },
  };
}
