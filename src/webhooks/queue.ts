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
 *
 * Each subscription has one owning worker at a time (`webhook_subscription_owners`): a worker claims
 * deliveries only of the subscriptions it owns, or whose ownership ran out (then it takes it over), and
 * renews ownership while it holds deliveries of them. So the per-subscription concurrency limit each
 * worker keeps is a limit across all workers: a receiver never sees more requests at once than it.
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
  /** The claiming worker: it takes ownership of the subscriptions it claims for. */
  owner: string;
  /** How long ownership lasts unless renewed. */
  ownerLeaseMs: number;
  /** Subscriptions this worker already has at its per-subscription bound. */
  excludeSubscriptions?: string[];
}

/**
 * Event envelopes by id. Events never change, so a worker keeps the recent ones: a fan-out to many
 * subscriptions reads its event once instead of once per delivery. Bounded; oldest entries go first.
 */
export class EnvelopeCache {
  readonly #entries = new Map<string, EventEnvelope>();
  readonly #max: number;

  constructor(max = 5000) {
    this.#max = max;
  }

  get(id: string): EventEnvelope | undefined {
    return this.#entries.get(id);
  }

  set(id: string, envelope: EventEnvelope): void {
    this.#entries.set(id, envelope);
    if (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next();
      if (!oldest.done) this.#entries.delete(oldest.value);
    }
  }
}

const parseJson = <T>(value: T | string): T => (typeof value === 'string' ? JSON.parse(value) : value);

async function loadEnvelopes(db: Kysely<DB>, ids: string[], cache: EnvelopeCache): Promise<void> {
  const missing = [...new Set(ids)].filter((id) => !cache.get(id));
  if (missing.length === 0) return;
  const { rows } = await sql<{ id: string; envelope: EventEnvelope | string }>`
    SELECT id, envelope FROM events
    WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(missing)}::jsonb)))`.execute(db);
  for (const row of rows) cache.set(row.id, parseJson(row.envelope));
}

export async function claimDue(
  db: Kysely<DB>,
  options: ClaimOptions,
  envelopes: EnvelopeCache = new EnvelopeCache(),
): Promise<ClaimedDelivery[]> {
  if (options.limit <= 0) return [];
  const claimId = newClaimId();
  const exclude = JSON.stringify(options.excludeSubscriptions ?? []);
  const scan = Math.max(options.limit * 4, 100);
  // Ownership rows are locked in id order with SKIP LOCKED before they are updated: a claim never waits
  // for another worker's claim or result write, so none can deadlock against it.
  const { rows } = await sql<Omit<ClaimedDelivery, 'envelope'>>`
    WITH due AS MATERIALIZED (
      SELECT d.id, d.subscription_id, d.next_attempt_at FROM webhook_deliveries d
      WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND d.attempts < d.attempt_limit
        AND d.subscription_id NOT IN (SELECT jsonb_array_elements_text(${exclude}::jsonb))
        AND NOT EXISTS (
          SELECT 1 FROM webhook_subscription_owners o
          WHERE o.subscription_id = d.subscription_id AND o.owner <> ${options.owner} AND o.expires_at > now())
      ORDER BY d.next_attempt_at
      LIMIT ${scan}
    ),
    -- Owned with more than half the lease left: no other worker can take these meanwhile (they take
    -- only expired rows), so they need neither a lock nor a write.
    mine AS MATERIALIZED (
      SELECT o.subscription_id FROM webhook_subscription_owners o
      WHERE o.subscription_id IN (SELECT subscription_id FROM due)
        AND o.owner = ${options.owner}
        AND o.expires_at > now() + ${options.ownerLeaseMs / 2}::float8 * interval '1 millisecond'
    ),
    takeable AS MATERIALIZED (
      SELECT o.subscription_id FROM webhook_subscription_owners o
      WHERE o.subscription_id IN (SELECT subscription_id FROM due)
        AND o.subscription_id NOT IN (SELECT subscription_id FROM mine)
        AND (o.owner = ${options.owner} OR o.owner IS NULL OR o.expires_at <= now())
      ORDER BY o.subscription_id
      FOR NO KEY UPDATE SKIP LOCKED
    ),
    taken AS (
      UPDATE webhook_subscription_owners o
      SET owner = ${options.owner}, expires_at = now() + ${options.ownerLeaseMs}::float8 * interval '1 millisecond'
      WHERE o.subscription_id IN (SELECT subscription_id FROM takeable)
    ),
    owned AS MATERIALIZED (
      SELECT subscription_id FROM mine UNION ALL SELECT subscription_id FROM takeable
    ),
    ranked AS MATERIALIZED (
      SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY subscription_id ORDER BY next_attempt_at, id) AS rn
        FROM due WHERE subscription_id IN (SELECT subscription_id FROM owned)
      ) numbered
      WHERE rn <= ${options.perSubscription}
    ),
    locked AS MATERIALIZED (
      SELECT d.id FROM webhook_deliveries d
      WHERE d.id = ANY (ARRAY(SELECT id FROM ranked))
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
    FROM webhook_subscriptions s
    WHERE d.id = ANY (ARRAY(SELECT id FROM locked)) AND s.id = d.subscription_id
    RETURNING d.id, d.project_id, d.subscription_id, d.event_id, d.event_type, d.attempts, d.attempt_limit,
      d.created_at, d.updated_at, d.claim_id, s.url, s.secret_sealed, s.custom_headers, s.is_active`.execute(
    db,
  );
  if (rows.length === 0) return [];
  await loadEnvelopes(
    db,
    rows.map((r) => r.event_id),
    envelopes,
  );
  return rows.map((r) => ({
    ...r,
    created_at: new Date(r.created_at),
    updated_at: new Date(r.updated_at),
    custom_headers: parseJson(r.custom_headers),
    envelope: envelopes.get(r.event_id)!,
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

export interface RecordItem {
  delivery: Pick<ClaimedDelivery, 'id' | 'claim_id' | 'attempts'> & { subscription_id?: string };
  result: AttemptResult;
}

/**
 * Records the results of attempts under their claims, many in one statement: each delivery's state
 * and its attempt's row together, only where the row still carries the claim id and attempt number
 * (a fence). Returns the ids recorded; a missing id lost its claim (the next claimant owns the attempt).
 * Then the subscriptions' health (consecutive failures, last delivery, failing since) follows in one more statement,
 * in the same transaction.
 */
export async function recordResults(db: Kysely<DB>, items: RecordItem[]): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  // Both statements commit together: a reader who sees a delivery's outcome sees its subscription's health.
  if (!db.isTransaction) return db.transaction().execute((tx) => recordResults(tx, items));
  const payload = JSON.stringify(
    items.map(({ delivery, result }) => ({
      id: delivery.id,
      c: delivery.claim_id,
      a: delivery.attempts,
      st: result.outcome === 'retry' ? 'pending' : result.outcome,
      o: result.outcome,
      hs: result.status ?? null,
      ex: result.excerpt ?? null,
      er: result.error ?? null,
      ms: result.durationMs,
      r: result.retryInMs ?? 0,
      sa: result.startedAt.toISOString(),
    })),
  );
  const { rows } = await sql<{ id: string; subscription_id: string }>`
    WITH x AS MATERIALIZED (
      SELECT * FROM jsonb_to_recordset(${payload}::jsonb)
        AS x(id text, c text, a int, st text, o text, hs int, ex text, er text, ms int, r float8, sa timestamptz)
    ),
    d AS (
      UPDATE webhook_deliveries w
      SET status = x.st,
          claim_id = NULL,
          next_attempt_at = CASE WHEN x.st = 'pending'
            THEN now() + x.r * interval '1 millisecond' ELSE w.next_attempt_at END,
          last_status = x.hs,
          last_response = x.ex,
          last_error = x.er,
          last_duration_ms = x.ms,
          updated_at = now(),
          finished_at = CASE WHEN x.st = 'pending' THEN NULL ELSE now() END
      FROM x
      WHERE w.id = x.id AND w.claim_id = x.c AND w.attempts = x.a
      RETURNING w.id, w.subscription_id
    ),
    a AS (
      INSERT INTO webhook_attempts
        (delivery_id, attempt, claim_id, outcome, response_status, response_excerpt, error, duration_ms, started_at)
      SELECT x.id, x.a, x.c, x.o, x.hs, x.ex, x.er, x.ms, x.sa FROM x JOIN d ON d.id = x.id
      ON CONFLICT (delivery_id, attempt) DO NOTHING
    )
    SELECT id, subscription_id FROM d`.execute(db);
  const recorded = new Set(rows.map((r) => r.id));
  const subscriptionOf = new Map(rows.map((r) => [r.id, r.subscription_id]));
  // Per subscription, in the order the results came: did one succeed, and how many failed after it.
  const health = new Map<string, { reset: boolean; fails: number }>();
  for (const { delivery, result } of items) {
    const sub = subscriptionOf.get(delivery.id);
    if (!sub) continue;
    const h = health.get(sub) ?? { reset: false, fails: 0 };
    if (result.outcome === 'success') {
      h.reset = true;
      h.fails = 0;
    } else h.fails++;
    health.set(sub, h);
  }
  if (health.size) {
    const stats = JSON.stringify([...health].map(([id, h]) => ({ id, reset: h.reset, fails: h.fails })));
    // Rows are locked in id order so that concurrent workers cannot deadlock on them.
    await sql`
      WITH y AS MATERIALIZED (
        SELECT * FROM jsonb_to_recordset(${stats}::jsonb) AS y(id text, reset boolean, fails int)
      ),
      locked AS MATERIALIZED (
        SELECT s.id FROM webhook_subscriptions s JOIN y ON y.id = s.id
        WHERE NOT y.reset OR y.fails > 0 OR s.consecutive_failures <> 0 OR s.last_delivered_at IS NULL
          OR s.failing_since IS NOT NULL OR s.last_delivered_at < now() - interval '1 second'
        ORDER BY s.id
        FOR UPDATE OF s
      )
      UPDATE webhook_subscriptions s
      SET consecutive_failures = CASE WHEN y.reset THEN y.fails ELSE s.consecutive_failures + y.fails END,
          last_delivered_at = CASE WHEN y.reset THEN now() ELSE s.last_delivered_at END,
          -- Endpoint health: failing since the first failure after the last success.
          failing_since = CASE
            WHEN y.reset AND y.fails = 0 THEN NULL
            WHEN y.reset THEN now()
            ELSE coalesce(s.failing_since, now()) END
      FROM y
      WHERE s.id = y.id AND s.id IN (SELECT id FROM locked)`.execute(db);
  }
  return recorded;
}

/** Records one attempt's result (see recordResults); false when the claim was lost. */
export async function recordResult(
  db: Kysely<DB>,
  delivery: Pick<ClaimedDelivery, 'id' | 'claim_id' | 'attempts'>,
  result: AttemptResult,
): Promise<boolean> {
  return (await recordResults(db, [{ delivery, result }])).has(delivery.id);
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

/** Extends this worker's ownership of the subscriptions it still holds deliveries of. */
export async function renewOwnership(
  db: Kysely<DB>,
  owner: string,
  subscriptionIds: string[],
  ownerLeaseMs: number,
): Promise<void> {
  if (subscriptionIds.length === 0) return;
  await sql`
    WITH mine AS MATERIALIZED (
      SELECT subscription_id FROM webhook_subscription_owners
      WHERE owner = ${owner}
        AND subscription_id = ANY (ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(subscriptionIds)}::jsonb)))
      ORDER BY subscription_id
      FOR NO KEY UPDATE SKIP LOCKED
    )
    UPDATE webhook_subscription_owners o
    SET expires_at = now() + ${ownerLeaseMs}::float8 * interval '1 millisecond'
    WHERE o.subscription_id IN (SELECT subscription_id FROM mine)`.execute(db);
}

/** Gives up this worker's ownerships (a worker stopping): another worker may take them at once. */
export async function releaseOwnership(db: Kysely<DB>, owner: string): Promise<void> {
  await sql`
    WITH mine AS MATERIALIZED (
      SELECT subscription_id FROM webhook_subscription_owners WHERE owner = ${owner}
      ORDER BY subscription_id
      FOR NO KEY UPDATE
    )
    UPDATE webhook_subscription_owners o SET owner = NULL, expires_at = '-infinity'
    WHERE o.subscription_id IN (SELECT subscription_id FROM mine)`.execute(db);
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
