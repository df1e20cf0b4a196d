import { type Kysely, sql } from 'kysely';
import type { AppContext } from '../app/context.ts';
import type { DB } from '../db/schema.ts';

/**
 * Retention: pruning by age, in small batches that never block the hot path. Each batch is one
 * `DELETE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)` in its own transaction: rows another
 * transaction holds (a delivery being claimed, an event being fanned out) are skipped, not waited for,
 * and no lock is held between batches. Between batches it pauses at least as long as the batch took, so
 * pruning never takes more than half of one connection's time. Any number of pods may run it at once.
 *
 * - webhook deliveries finished (`success`/`error`) more than RETENTION_DELIVERIES_DAYS ago, with their
 *   attempts (ON DELETE CASCADE);
 * - outbox events older than RETENTION_EVENTS_DAYS that were fanned out and have no delivery left (their
 *   deliveries are pruned first; an event is never deleted from under a delivery, so the delete never
 *   cascades into a row a worker holds);
 * - idempotency keys that expired and are older than RETENTION_IDEMPOTENCY_HOURS;
 * - holds closed (settled, released, expired) more than RETENTION_HOLDS_DAYS ago. Ledger entries are
 *   never pruned: `ledger_entries.hold_id` keeps the id of the hold (no foreign key since 0008).
 * A setting of 0 keeps that kind of row forever.
 */

export type PrunedKind = 'deliveries' | 'events' | 'idempotencyKeys' | 'holds';
export type PruneCounts = Record<PrunedKind, number>;

export interface PruneOptions {
  /** Rows per statement; default RETENTION_BATCH_SIZE. */
  batchSize?: number;
  /** Batches per kind in one pass at most (the next pass continues); default 1000. */
  maxBatches?: number;
  /** The clock (tests). */
  now?: Date;
  /** Stops between batches when aborted. */
  signal?: AbortSignal;
  /**
   * Pause after each batch at least this long (default 20 ms), and at least as long as the batch took:
   * pruning uses at most half of one database connection's time, leaving the rest to the hot path.
   */
  minPauseMs?: number;
}

type Statement = (db: Kysely<DB>, cutoff: string, limit: number) => Promise<number>;

const affected = (res: { numAffectedRows?: bigint }) => Number(res.numAffectedRows ?? 0);

const statements: Record<PrunedKind, Statement> = {
  deliveries: async (db, cutoff, limit) =>
    affected(
      await sql`
        DELETE FROM webhook_deliveries WHERE id IN (
          SELECT id FROM webhook_deliveries
          WHERE status <> 'pending' AND finished_at < ${cutoff}::timestamptz
          ORDER BY finished_at
          LIMIT ${limit}
          FOR UPDATE SKIP LOCKED)`.execute(db),
    ),
  // The oldest events first, from the created_at index, a bounded window at a time: each batch costs
  // the same however many old events there are (an anti-join over the whole table would not).
  events: async (db, cutoff, limit) =>
    affected(
      await sql`
        WITH oldest AS MATERIALIZED (
          SELECT id FROM events
          WHERE created_at < ${cutoff}::timestamptz AND dispatched_at IS NOT NULL
          ORDER BY created_at
          LIMIT ${limit * 4}
        )
        DELETE FROM events WHERE id IN (
          SELECT e.id FROM events e
          WHERE e.id IN (SELECT id FROM oldest)
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
          LIMIT ${limit}
          FOR UPDATE OF e SKIP LOCKED)`.execute(db),
    ),
  idempotencyKeys: async (db, cutoff, limit) =>
    affected(
      await sql`
        DELETE FROM idempotency_keys WHERE (project_id, endpoint, key) IN (
          SELECT project_id, endpoint, key FROM idempotency_keys
          WHERE created_at < ${cutoff}::timestamptz AND expires_at <= now()
          ORDER BY created_at
          LIMIT ${limit}
          FOR UPDATE SKIP LOCKED)`.execute(db),
    ),
  holds: async (db, cutoff, limit) =>
    affected(
      await sql`
        DELETE FROM holds WHERE id IN (
          SELECT id FROM holds
          WHERE status <> 'open' AND closed_at < ${cutoff}::timestamptz
          ORDER BY closed_at
          LIMIT ${limit}
          FOR UPDATE SKIP LOCKED)`.execute(db),
    ),
};

/** The age past which each kind is pruned, in milliseconds (undefined: kept forever). */
export function retentionAges(config: AppContext['config']): Record<PrunedKind, number | undefined> {
  const days = (d: number) => (d > 0 ? d * 24 * 3600_000 : undefined);
  return {
    deliveries: days(config.RETENTION_DELIVERIES_DAYS),
    events: days(config.RETENTION_EVENTS_DAYS),
    idempotencyKeys:
      config.RETENTION_IDEMPOTENCY_HOURS > 0 ? config.RETENTION_IDEMPOTENCY_HOURS * 3600_000 : undefined,
    holds: days(config.RETENTION_HOLDS_DAYS),
  };
}

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * One retention pass: each kind in turn, batch after batch until a batch comes back short (or
 * `maxBatches`). Deliveries go before events, which wait for their deliveries to be gone.
 */
export async function pruneOnce(ctx: AppContext, options: PruneOptions = {}): Promise<PruneCounts> {
  const limit = options.batchSize ?? ctx.config.RETENTION_BATCH_SIZE;
  const maxBatches = options.maxBatches ?? 1000;
  const minPauseMs = options.minPauseMs ?? 20;
  const now = (options.now ?? new Date()).getTime();
  const ages = retentionAges(ctx.config);
  const counts: PruneCounts = { deliveries: 0, events: 0, idempotencyKeys: 0, holds: 0 };
  for (const kind of ['deliveries', 'events', 'idempotencyKeys', 'holds'] as const) {
    const age = ages[kind];
    if (age === undefined) continue;
    const cutoff = new Date(now - age).toISOString();
    for (let batch = 0; batch < maxBatches && !options.signal?.aborted; batch++) {
      const started = performance.now();
      const deleted = await statements[kind](ctx.db, cutoff, limit);
      counts[kind] += deleted;
      if (deleted > 0) ctx.metrics.pruned.inc({ kind }, deleted);
      if (deleted < limit) break;
      await pause(Math.max(minPauseMs, performance.now() - started));
    }
  }
  return counts;
}
