import { deleteExpiredSessions } from '../admin/accounts.ts';
import { sweepExpiredHolds } from '../billing/ledger.ts';
import { deleteExpiredIdempotencyKeys } from '../idempotency/index.ts';
import { deleteExpiredLinkNonces } from '../users/service.ts';
import type { AppContext } from './context.ts';

/**
 * Periodic maintenance every serving process runs. Each job is idempotent and safe to run on many pods
 * at once (rows are claimed by conditional updates).
 */
export interface Job {
  name: string;
  intervalMs: number;
  run(ctx: AppContext): Promise<number | undefined>;
}

export const maintenanceJobs: Job[] = [
  {
    name: 'hold-sweeper',
    intervalMs: 30_000,
    run: (ctx) => sweepExpiredHolds(ctx.db),
  },
  {
    name: 'idempotency-key-cleanup',
    intervalMs: 10 * 60_000,
    run: (ctx) => deleteExpiredIdempotencyKeys(ctx.db),
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
    const timer = setInterval(tick, job.intervalMs);
    timer.unref();
    return timer;
  });
  return async () => {
    for (const timer of timers) clearInterval(timer);
    await Promise.allSettled([...running]);
  };
}
