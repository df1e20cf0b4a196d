import { randomBytes } from 'node:crypto';
import { type Kysely, sql } from 'kysely';
import type { DB } from '../db/schema.ts';
import type { EventEnvelope } from '../events/outbox.ts';

/**
 * The delivery queue in Postgres. A due delivery is claimed by moving `next_attempt_at` one lease
 * ahead, counting the attempt and stamping a fresh claim id, under `FOR UPDATE SKIP LOCKED`: two
 * workers never claim the same attempt, and a claim whose worker died simply falls due again when the
 * lease runs out. A result is written only while the row still carries the claim id (a fence): a worker
 * whose lease ran out cannot overwrite the next claimant's result.
 */

export interface ClaimedDelivery {
  id: string;
  project_id: string;
  subscription_id: string;
  event_id: string;
  event_type: string;
  attempts: number;
  attempt_limit: number;
  created_at: Date;
  updated_at: Date;
  claim_id: string;
  url: string;
  secret_sealed: string;
  custom_headers: Record<string, string>;
  is_active: boolean;
  envelope: EventEnvelope;
}

export function newClaimId(): string {
  return randomBytes(12).toString('base64url');
}

export interface ClaimOptions {
  limit: number;
  leaseMs: number;
  perSubscription: number;
  /** Subscriptions this worker already has at its per-subscription bound. */
  excludeSubscriptions?: string[];
}

export async function claimDue(db: Kysely<DB>, options: ClaimOptions): Promise<ClaimedDelivery[]> {
  if (options.limit <= 0) return [];
  const claimId = newClaimId();
  const exclude = JSON.stringify(options.excludeSubscriptions ?? []);
  const scan = Math.max(options.limit * 4, 100);
  const { rows } = await sql<ClaimedDelivery>`
    WITH ranked AS MATERIALIZED (
      SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY subscription_id ORDER BY next_attempt_at, id) AS rn
        FROM (
          SELECT id, subscription_id, next_attempt_at FROM webhook_deliveries
          WHERE status = 'pending' AND next_attempt_at <= now() AND attempts < attempt_limit
            AND subscription_id NOT IN (SELECT jsonb_array_elements_text(${exclude}::jsonb))
          ORDER BY next_attempt_at
          LIMIT ${scan}
        ) due
      ) numbered
      WHERE rn <= ${options.perSubscription}
    ),
    locked AS MATERIALIZED (
      SELECT d.id FROM webhook_deliveries d
      WHERE d.id IN (SELECT id FROM ranked)
        AND d.status = 'pending' AND d.next_attempt_at <= now() AND d.attempts < d.attempt_limit
      ORDER BY d.next_attempt_at
      LIMIT ${options.limit}
      FOR UPDATE SKIP LOCKED
    )
    UPDATE webhook_deliveries d
    SET claim_id = ${claimId},
        attempts = d.attempts + 1,
        next_attempt_at = now() + ${options.leaseMs}::float8 * interval '1 millisecond',
        updated_at = now()
    FROM webhook_subscriptions s, events e
    WHERE d.id IN (SELECT id FROM locked) AND s.id = d.subscription_id AND e.id = d.event_id
    RETURNING d.id, d.project_id, d.subscription_id, d.event_id, d.event_type, d.attempts, d.attempt_limit,
      d.created_at, d.updated_at, d.claim_id, s.url, s.secret_sealed, s.custom_headers, s.is_active,
      e.envelope`.execute(db);
  return rows.map((r) => ({
    ...r,
    created_at: new Date(r.created_at),
    updated_at: new Date(r.updated_at),
    custom_headers: typeof r.custom_headers === 'string' ? JSON.parse(r.custom_headers) : r.custom_headers,
    envelope: typeof r.envelope === 'string' ? JSON.parse(r.envelope) : r.envelope,
  }));
}

export interface AttemptResult {
  outcome: 'success' | 'retry' | 'error';
  status?: number | undefined;
  excerpt?: string | undefined;
  error?: string | undefined;
  durationMs: number;
  startedAt: Date;
  /** For `retry`: when the next attempt is due, in milliseconds from now. */
  retryInMs?: number;
}

/**
 * Records the result of one attempt under its claim: the delivery's state, the attempt's row and the
 * subscription's health, in one statement. Returns false when the claim was lost (the result is
 * dropped; the attempt belongs to the next claimant).
 */
export async function recordResult(
  db: Kysely<DB>,
  delivery: Pick<ClaimedDelivery, 'id' | 'claim_id' | 'attempts'>,
  result: AttemptResult,
): Promise<boolean> {
  const status = result.outcome === 'retry' ? 'pending' : result.outcome;
  const excerpt = result.excerpt ?? null;
  const error = result.error ?? null;
  const httpStatus = result.status ?? null;
  const retryMs = result.retryInMs ?? 0;
  const success = result.outcome === 'success';
  const { rows } = await sql<{ n: number }>`
    WITH d AS (
      UPDATE webhook_deliveries
      SET status = ${status},
          claim_id = NULL,
          next_attempt_at = CASE WHEN ${status} = 'pending'
            THEN now() + ${retryMs}::float8 * interval '1 millisecond' ELSE next_attempt_at END,
          last_status = ${httpStatus}::int,
          last_response = ${excerpt}::text,
          last_error = ${error}::text,
          last_duration_ms = ${result.durationMs}::int,
          updated_at = now(),
          finished_at = CASE WHEN ${status} = 'pending' THEN NULL ELSE now() END
      WHERE id = ${delivery.id} AND claim_id = ${delivery.claim_id} AND attempts = ${delivery.attempts}
      RETURNING id, subscription_id
    ),
    a AS (
      INSERT INTO webhook_attempts
        (delivery_id, attempt, claim_id, outcome, response_status, response_excerpt, error, duration_ms, started_at)
      SELECT id, ${delivery.attempts}::int, ${delivery.claim_id}, ${result.outcome}, ${httpStatus}::int,
        ${excerpt}::text, ${error}::text, ${result.durationMs}::int, ${result.startedAt.toISOString()}::timestamptz
      FROM d
      ON CONFLICT (delivery_id, attempt) DO NOTHING
    ),
    s AS (
      UPDATE webhook_subscriptions
      SET consecutive_failures = CASE WHEN ${success} THEN 0 ELSE consecutive_failures + 1 END,
          last_delivered_at = CASE WHEN ${success} THEN now() ELSE last_delivered_at END
      WHERE id IN (SELECT subscription_id FROM d)
        AND (NOT ${success} OR consecutive_failures <> 0 OR last_delivered_at IS NULL
             OR last_delivered_at < now() - interval '1 second')
    )
    SELECT count(*)::int AS n FROM d`.execute(db);
  return Number(rows[0]?.n ?? 0) > 0;
}

/** Gives back a claimed delivery that was never sent (a worker stopping): due now, attempt uncounted. */
export async function releaseClaim(
  db: Kysely<DB>,
  delivery: Pick<ClaimedDelivery, 'id' | 'claim_id' | 'attempts'>,
): Promise<void> {
  await sql`
    UPDATE webhook_deliveries
    SET claim_id = NULL, attempts = attempts - 1, next_attempt_at = now(), updated_at = now()
    WHERE id = ${delivery.id} AND claim_id = ${delivery.claim_id} AND attempts = ${delivery.attempts}`.execute(
    db,
  );
}

/**
 * Ends deliveries whose last allowed attempt was claimed by a worker that died before recording a
 * result (their lease ran out and no attempt is left).
 */
export async function expireAbandoned(db: Kysely<DB>): Promise<number> {
  const res = await sql`
    UPDATE webhook_deliveries
    SET status = 'error', claim_id = NULL, finished_at = now(), updated_at = now(),
        last_error = coalesce(last_error, 'the worker sending the final attempt stopped before recording its result')
    WHERE status = 'pending' AND attempts >= attempt_limit AND next_attempt_at <= now()`.execute(db);
  return Number(res.numAffectedRows ?? 0);
}

export async function queueStats(db: Kysely<DB>): Promise<{ pending: number; oldestAgeSeconds: number }> {
  const { rows } = await sql<{ pending: number; oldest: number | null }>`
    SELECT count(*)::int AS pending,
      extract(epoch FROM now() - min(created_at))::float8 AS oldest
    FROM webhook_deliveries WHERE status = 'pending'`.execute(db);
  return { pending: Number(rows[0]?.pending ?? 0), oldestAgeSeconds: Number(rows[0]?.oldest ?? 0) };
}

/** When the next pending delivery falls due (for the worker's timer), or undefined. */
export async function nextDueAt(db: Kysely<DB>): Promise<Date | undefined> {
  const { rows } = await sql<{ at: Date | string | null }>`
    SELECT min(next_attempt_at) AS at FROM webhook_deliveries WHERE status = 'pending'`.execute(db);
  const at = rows[0]?.at;
  return at ? new Date(at) : undefined;
}
