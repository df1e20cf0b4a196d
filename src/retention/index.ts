import { type Kysely, type RawBuilder, sql } from 'kysely';
import type { Config } from '../config/index.ts';
import { idBound } from '../core/ids.ts';
import type { DB } from '../db/schema.ts';
import type { Metrics } from '../metrics/registry.ts';

/**
 * Retention: pruning by age, in small batches that never block the hot path. Each batch is one
 * `DELETE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)` in its own transaction: rows another
 * transaction holds (a delivery being claimed, an event being fanned out) are skipped, not waited for,
 * and no lock is held between batches. Between batches it pauses at least as long as the batch took, so
 * pruning never takes more than half of one connection's time. Any number of pods may run it at once.
 *
 * - webhook deliveries finished (`success`/`error`) more than RETENTION_DELIVERIES_DAYS ago, with their
 *   attempts (ON DELETE CASCADE);
 * - outbox events older than RETENTION_EVENTS_DAYS — and at least a day older than the deliveries kept,
 *   whose log shows them — that were fanned out and have no pending delivery;
 * - idempotency keys that expired and are older than RETENTION_IDEMPOTENCY_HOURS;
 * - holds closed (settled, released, expired) more than RETENTION_HOLDS_DAYS ago. Ledger entries are
 *   never pruned: `ledger_entries.hold_id` keeps the id of the hold (no foreign key since 0008);
 * - Responses chain sizes (`response_chains`) recorded more than RETENTION_RESPONSES_DAYS ago — a request
 *   continuing an older chain is held at the model's context window, as any chain Tollgate has no record
 *   of (src/metering/chains.ts) — and background responses settled or expired that were created as long
 *   ago (never a pending one).
 * The audit log (`audit_log`, src/audit) is never pruned either: it is append-only, and the database
 * refuses deleting from it.
 * A setting of 0 keeps that kind of row forever.
 */

export type PrunedKind =
  | 'deliveries'
  | 'events'
  | 'idempotencyKeys'
  | 'holds'
  | 'responseChains'
  | 'backgroundResponses';
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

/** What pruning uses: the database, the retention settings, and the counter of rows pruned. */
export interface RetentionContext {
  db: Kysely<DB>;
  config: RetentionSettings;
  metrics: Pick<Metrics, 'pruned'>;
}

export type RetentionSettings = Pick<
  Config,
  | 'RETENTION_BATCH_SIZE'
  | 'RETENTION_DELIVERIES_DAYS'
  | 'RETENTION_EVENTS_DAYS'
  | 'RETENTION_IDEMPOTENCY_HOURS'
  | 'RETENTION_HOLDS_DAYS'
  | 'RETENTION_RESPONSES_DAYS'
>;

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * A kind of row pruned: its table, the rows older than the cutoff (`where`), and the key and order its
 * batches go by (default: the id).
 */
interface Prunable {
  table: string;
  where: (cutoffMs: number) => RawBuilder<unknown>;
  key?: string[];
  orderBy?: string;
}

// Old rows are found by primary key range: ids sort by creation time (src/core/ids.ts), so everything
// made before the cutoff sorts below `idBound(prefix, cutoff)`. No extra index on the hot tables.
const prunable: Record<PrunedKind, Prunable> = {
  deliveries: {
    table: 'webhook_deliveries',
    where: (cutoff) =>
      sql`id < ${idBound('dlv', cutoff)} AND status <> 'pending' AND finished_at < ${iso(cutoff)}::timestamptz`,
  },
  // An event goes once its deliveries may have gone (see retentionAges) and none of them is pending.
  events: {
    table: 'events',
    where: (cutoff) => sql`id < ${idBound('evt', cutoff)} AND dispatched_at IS NOT NULL
      AND id NOT IN (SELECT event_id FROM webhook_deliveries WHERE status = 'pending')`,
  },
  idempotencyKeys: {
    table: 'idempotency_keys',
    key: ['project_id', 'endpoint', 'key'],
    orderBy: 'expires_at',
    where: (cutoff) => sql`expires_at <= now() AND created_at < ${iso(cutoff)}::timestamptz`,
  },
  holds: {
    table: 'holds',
    where: (cutoff) =>
      sql`id < ${idBound('hold', cutoff)} AND status <> 'open' AND closed_at < ${iso(cutoff)}::timestamptz`,
  },
  // Keyed by the provider's ids: found by their creation time (indexes of migration 0031).
  responseChains: {
    table: 'response_chains',
    key: ['project_id', 'response_id'],
    orderBy: 'created_at',
    where: (cutoff) => sql`created_at < ${iso(cutoff)}::timestamptz`,
  },
  backgroundResponses: {
    table: 'background_responses',
    key: ['project_id', 'response_id'],
    orderBy: 'created_at',
    where: (cutoff) => sql`status <> 'pending' AND created_at < ${iso(cutoff)}::timestamptz`,
  },
};

/** One batch: up to `limit` rows of a kind older than the cutoff, in key order, rows locked elsewhere skipped. */
async function deleteBatch(db: Kysely<DB>, kind: Prunable, cutoffMs: number, limit: number): Promise<number> {
  const key = sql.join((kind.key ?? ['id']).map((column) => sql.ref(column)));
  const res = await sql`
    DELETE FROM ${sql.table(kind.table)} WHERE (${key}) IN (
      SELECT ${key} FROM ${sql.table(kind.table)}
      WHERE ${kind.where(cutoffMs)}
      ORDER BY ${sql.ref(kind.orderBy ?? 'id')}
      LIMIT ${limit}
      FOR UPDATE SKIP LOCKED)`.execute(db);
  return Number(res.numAffectedRows ?? 0);
}

/** The age past which each kind is pruned, in milliseconds (undefined: kept forever). */
export function retentionAges(config: RetentionSettings): Record<PrunedKind, number | undefined> {
  const days = (d: number) => (d > 0 ? d * 24 * 3600_000 : undefined);
  const deliveries = days(config.RETENTION_DELIVERIES_DAYS);
  const events = days(config.RETENTION_EVENTS_DAYS);
  return {
    deliveries,
    // The delivery log shows each delivery's event: an event stays at least a day longer than the
    // deliveries made from it (their last attempt may come hours after the event), and forever when
    // they do.
    events: events === undefined || deliveries === undefined ? undefined : Math.max(events, deliveries + DAY),
    idempotencyKeys:
      config.RETENTION_IDEMPOTENCY_HOURS > 0 ? config.RETENTION_IDEMPOTENCY_HOURS * 3600_000 : undefined,
    holds: days(config.RETENTION_HOLDS_DAYS),
    responseChains: days(config.RETENTION_RESPONSES_DAYS),
    backgroundResponses: days(config.RETENTION_RESPONSES_DAYS),
  };
}

const DAY = 24 * 3600_000;
const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * One retention pass: each kind in turn, batch after batch until a batch comes back short (or
 * `maxBatches`). Deliveries go before events, which wait for their deliveries to be gone.
 */
export async function pruneOnce(ctx: RetentionContext, options: PruneOptions = {}): Promise<PruneCounts> {
  const limit = options.batchSize ?? ctx.config.RETENTION_BATCH_SIZE;
  const maxBatches = options.maxBatches ?? 1000;
  const minPauseMs = options.minPauseMs ?? 20;
  const now = (options.now ?? new Date()).getTime();
  const ages = retentionAges(ctx.config);
  const counts: PruneCounts = {
    deliveries: 0,
    events: 0,
    idempotencyKeys: 0,
    holds: 0,
    responseChains: 0,
    backgroundResponses: 0,
  };
  for (const kind of Object.keys(counts) as PrunedKind[]) {
    const age = ages[kind];
    if (age === undefined) continue;
    const cutoff = now - age;
    for (let batch = 0; batch < maxBatches && !options.signal?.aborted; batch++) {
      const started = performance.now();
      const deleted = await deleteBatch(ctx.db, prunable[kind], cutoff, limit);
      counts[kind] += deleted;
      if (deleted > 0) ctx.metrics.pruned.inc({ kind }, deleted);
      if (deleted < limit) break;
      await pause(Math.max(minPauseMs, performance.now() - started));
    }
  }
  return counts;
}
