import { deleteExpiredSessions } from '../admin/accounts.ts';
import { deleteExpiredIdempotencyKeys } from '../idempotency/index.ts';
import { pruneOnce } from '../retention/index.ts';
import { deleteExpiredLinkNonces } from '../users/sessions.ts';
import type { AppContext } from './context.ts';

/**
 * Periodic maintenance every serving process runs. Each job is idempotent and safe to run on many pods
 * at once (rows are claimed by conditional updates).
 */
export interface Job {
  name: string;
  intervalMs: number;
  /** The interval from the configuration, when it is a setting (else intervalMs). */
  intervalOf?: (ctx: AppContext) => number;
  run(ctx: AppContext): Promise<number | undefined>;
}

export const maintenanceJobs: Job[] = [
  {
    name: 'hold-sweeper',
    intervalMs: 30_000,
    run: (ctx) => ctx.billing.sweep(),
  },
  {
    // Credit grants past their expiry: the unspent rest leaves the balance (src/billing/ledger.ts).
    name: 'credit-grant-expiry',
    intervalMs: 60_000,
    run: (ctx) => ctx.billing.expireGrants(),
  },
  {
    // Auto-recharge of wallets below their threshold that no debit on this pod saw (src/payments/recharge.ts).
    name: 'auto-recharge',
    intervalMs: 60_000,
    run: (ctx) => ctx.payments.recharges.scan(),
  },
  {
    name: 'idempotency-key-cleanup',
    intervalMs: 10 * 60_000,
    run: (ctx) => deleteExpiredIdempotencyKeys(ctx.db),
  },
  {
    // Pruning by age (src/retention): small SKIP LOCKED batches, safe on every pod at once.
    name: 'retention',
    intervalMs: 300_000,
    intervalOf: (ctx) => ctx.config.RETENTION_INTERVAL_SECONDS * 1000,
    run: async (ctx) => {
      const counts = await pruneOnce(ctx);
      return Object.values(counts).reduce((a, b) => a + b, 0);
    },
  },
  {
    name: 'link-nonce-cleanup',
    intervalMs: 60 * 60_000,
    run: (ctx) => deleteExpiredLinkNonces(ctx.db),
  },
  {
    name: 'admin-session-cleanup',
    intervalMs: 60 * 60_000,
    run: (ctx) => deleteExpiredSessions(ctx.db),
  },
];

/** Starts the jobs on timers; returns a function that stops them and waits for runs in flight. */
export function startJobs(ctx: AppContext, jobs: Job[] = maintenanceJobs): () => Promise<void> {
  const running = new Set<Promise<unknown>>();
  const timers = jobs.map((job) => {
    let busy = false;
    const tick = () => {
      if (busy) return;
      busy = true;
      const run = job
        .run(ctx)
        .then((count) => {
          if (count) ctx.log.info({ job: job.name, count }, `${job.name}: ${count} done`);
        })
        .catch((err) => ctx.log.warn({ job: job.name, err }, `${job.name} failed; will retry`))
        .finally(() => {
          busy = false;
          running.delete(run);
        });
      running.add(run);
    };
    const timer = setInterval(tick, job.intervalOf?.(ctx) ?? job.intervalMs);
    timer.unref();
    return timer;
  });
  return async () => {
    for (const timer of timers) clearInterval(timer);
    await Promise.allSettled([...running]);
  };
}
