import type { Statement } from '../db/index.ts';
import { balanceEventConditionSql, balanceEventDataSql } from './balance-events.ts';

/**
 * The statements of the metered hot path (escrow.ts): taking a slice and applying changes to slices.
 * Each serves a whole batch (group commit: every request that arrived while the previous batch was in
 * flight) of one project in one round trip, over arrays with a per-row condition. A batch never names
 * one wallet twice (the queue defers a second request of a wallet to the next batch), so a row's
 * condition sees the wallet as every earlier change left it.
 *
 * Wallets are locked in id order before they are changed, so batches of several pods never deadlock.
 * Every statement names its project: on a database distributed by project (Citus) each stays on one
 * shard.
 */

/** One request's take (`takeSlices`). */
export interface TakeItem {
  externalId: string;
  /** The least the slice must grow by to admit the request. */
  need: string;
  /** What it grows by when the available balance allows. */
  want: string;
  sliceId: string;
  /** The API of the request. */
  purpose: string;
  /** How far below zero the wallet may be taken (the project's `debtLimit`; '0': not at all). */
  debtLimit: string;
  /** The slice's change number (see `ApplyItem.seq`): orders the `reserved` it writes. */
  seq: string;
  /** What the slice's requests in flight reserve once this one is admitted. */
  reserved: string;
}

/** A row of `takeSlices`. */
export interface TakeRow {
  slice_id: string;
  user_id: string | null;
  /** What the slice grew by; null when the wallet could not pay (or is not connected or unknown). */
  take: string | null;
  /** The wallet's held amount before the statement (all pods' slices). */
  held: string | null;
  /** The slice was closed (by the sweeper): take a new one. */
  gone: boolean;
}

/** The row of a take the statement returned none for (an unknown wallet). */
export const NOT_FOUND: TakeRow = { slice_id: '', user_id: null, take: null, held: null, gone: false };

/**
 * Takes (more of) a slice for each request (escrow.ts): grows the pod's slice of a connected wallet by
 * `want`, or by what the wallet's allowance (balance + debt limit − held) allows when that is less —
 * refused when it is less than `need`. A slice's first take writes its `holds` row (owned by the pod); a
 * slice the sweeper closed is `gone` and grows no more. Commits durably: a pod admits requests from a
 * slice only once the database has it. One row per request: `take` is null when refused, and `held`
 * (the wallet's held amount before this statement) then tells whether slices stand in the way.
 *
 * A take that succeeds also writes the slice's `reserved` (its requests in flight, this one included)
 * when no later change of the slice wrote it already (`reserved_seq`), and moves the wallet's `reserved`
 * (the held amount the API shows) by the difference.
 *
 * Locks the slices, then the wallets (in id order), as every statement changing both.
 *
 * $1 project id · $2 external ids · $3 needs · $4 wants · $5 slice ids · $6 the pod · $7 time to live (s)
 * $8 purposes (the API of the request that first takes the slice) · $9 debt limits · $10 change numbers
 * $11 the slices' reserved amounts
 */
/** The parameters of `takeSlices` for a batch of one project's takes by this pod. */
export function takeParameters(
  projectId: string,
  items: readonly TakeItem[],
  owner: string,
  ttlSeconds: number,
): unknown[] {
  return [
    projectId,
    items.map((i) => i.externalId),
    items.map((i) => i.need),
    items.map((i) => i.want),
    items.map((i) => i.sliceId),
    owner,
    ttlSeconds,
    items.map((i) => i.purpose),
    items.map((i) => i.debtLimit),
    items.map((i) => i.seq),
    items.map((i) => i.reserved),
  ];
}

export const takeSlices: Statement = {
  name: 'tollgate_take_slices_v2',
  text: `
    WITH r AS (
      SELECT * FROM unnest($2::text[], $3::numeric[], $4::numeric[], $5::text[], $8::text[], $9::numeric[],
                           $10::bigint[], $11::numeric[])
        AS r(external_id, need, want, slice_id, purpose, debt_limit, seq, reserved)
    ), s AS (
      SELECT h.id, h.status, h.reserved, h.reserved_seq FROM holds h
      WHERE h.project_id = $1 AND h.id = ANY($5::text[])
      ORDER BY h.id FOR NO KEY UPDATE
    ), w AS (
      -- locked after the slices (the scalar subquery runs s first); FOR NO KEY UPDATE returns the row's
      -- latest version, so the take below is computed from the balance as it is now
      SELECT e.id, e.external_id, e.balance, e.held, e.connected FROM end_users e
      WHERE e.project_id = $1 AND e.external_id = ANY($2::text[]) AND (SELECT count(*) FROM s) >= 0
      ORDER BY e.id FOR NO KEY UPDATE
    ), t AS (
      SELECT w.id, r.slice_id, r.purpose, r.seq, r.reserved,
             least(w.balance + r.debt_limit - w.held, r.want) AS take,
             CASE WHEN coalesce(s.reserved_seq, 0) < r.seq THEN r.reserved - coalesce(s.reserved, 0) ELSE 0 END
               AS reserving
      FROM r JOIN w ON w.external_id = r.external_id LEFT JOIN s ON s.id = r.slice_id
      WHERE w.connected AND w.balance + r.debt_limit - w.held >= r.need AND coalesce(s.status, 'open') = 'open'
    ), u AS (
      UPDATE end_users e SET held = e.held + t.take, reserved = e.reserved + t.reserving, updated_at = now()
      FROM t WHERE e.id = t.id
      RETURNING e.id, t.slice_id, t.take, t.purpose, t.seq, t.reserved
    ), h AS (
      INSERT INTO holds (id, project_id, user_id, amount, status, purpose, owner, expires_at, reserved, reserved_seq)
      SELECT slice_id, $1, id, take, 'open', purpose, $6, now() + make_interval(secs => $7::int), reserved, seq
      FROM u
      ON CONFLICT (id) DO UPDATE SET amount = holds.amount + excluded.amount, expires_at = excluded.expires_at,
        reserved = CASE WHEN holds.reserved_seq < excluded.reserved_seq THEN excluded.reserved ELSE holds.reserved END,
        reserved_seq = greatest(holds.reserved_seq, excluded.reserved_seq)
    )
    SELECT r.slice_id, w.id AS user_id, u.take, w.held, coalesce(s.status, 'open') <> 'open' AS gone
    FROM r LEFT JOIN w ON w.external_id = r.external_id LEFT JOIN s ON s.id = r.slice_id
         LEFT JOIN u ON u.slice_id = r.slice_id`,
};

/** What a settle statement records with a non-zero charge (see `applySlices`). */
export interface ChargeRecord {
  charged: string;
  entryId: string;
  source: string;
  description: string | null;
  /** JSON text. */
  metadata: string;
  /** A JSON array of event envelopes, or null. */
  events: string | null;
  /** The project's low-balance threshold, or null. */
  threshold: string | null;
}

/** One change of a slice (`applySlices`): a settle, or a slice given back. */
export interface ApplyItem extends ChargeRecord {
  sliceId: string;
  userId: string;
  /** The slice's change number ('0' for a charge only, on a slice this pod no longer holds). */
  seq: string;
  /** What comes off the slice (and the wallet's `held`). */
  released: string;
  /** The slice closes (its rest is in `released`). */
  close: boolean;
  /** What the slice's requests in flight reserve after this change ('0' when it closes). */
  reserved: string;
}

/** A wallet after a settle statement changed it. */
export interface ApplyRow {
  slice_id: string;
  /** Whether the slice was open when the change was applied. */
  open: boolean;
  user_id: string | null;
  external_id: string | null;
  charged: string | null;
  balance: string | null;
  held: string | null;
  /** The wallet's reserved amount (what its requests in flight reserved): the held amount it shows. */
  reserved: string | null;
  granted: string | null;
}

/** The row of a change the statement returned none for: the wallet did not change. */
export const NO_ROW: Omit<ApplyRow, 'slice_id'> = {
  open: true,
  user_id: null,
  external_id: null,
  charged: null,
  balance: null,
  held: null,
  reserved: null,
  granted: null,
};

/**
 * The columns of `applySlices`'s changes, in the order of their parameters (from $2, one array each,
 * of one value per change): the statement's text and its parameters (`applyParameters`) are both
 * written from this list.
 */
export const APPLY_COLUMNS = [
  { name: 'slice_id', type: 'text', field: 'sliceId' },
  { name: 'user_id', type: 'text', field: 'userId' },
  { name: 'seq', type: 'bigint', field: 'seq' },
  /** The charge (the provider's usage × the price), '0' for none. */
  { name: 'charged', type: 'numeric', field: 'charged' },
  { name: 'released', type: 'numeric', field: 'released' },
  { name: 'close', type: 'boolean', field: 'close' },
  /** What the slice's requests in flight reserve after the change. */
  { name: 'reserved', type: 'numeric', field: 'reserved' },
  /** The charge's ledger entry, its source, description and metadata (JSON text). */
  { name: 'entry_id', type: 'text', field: 'entryId' },
  { name: 'source', type: 'text', field: 'source' },
  { name: 'description', type: 'text', field: 'description' },
  { name: 'metadata', type: 'text', field: 'metadata' },
  /** The event envelopes to write with the charge (a JSON array), or null. */
  { name: 'events', type: 'text', field: 'events' },
  /** The project's low-balance threshold, or null. */
  { name: 'threshold', type: 'numeric', field: 'threshold' },
] as const satisfies ReadonlyArray<{ name: string; type: string; field: keyof ApplyItem }>;

type ApplyColumn = (typeof APPLY_COLUMNS)[number]['name'];

/** The parameter of a column of `applySlices` (`$2::text[]`, …). */
function applyParam(name: ApplyColumn): string {
  const i = APPLY_COLUMNS.findIndex((c) => c.name === name);
  return `$${i + 2}::${APPLY_COLUMNS[i]!.type}[]`;
}

/** The parameter after the columns: `synchronous_commit` for the transaction. */
const COMMIT_PARAM = `$${APPLY_COLUMNS.length + 2}::text`;

/**
 * The parameters of `applySlices`: the project, one array per column (`APPLY_COLUMNS`) of the changes,
 * and `synchronous_commit` for its transaction: 'on', or 'off' (SETTLE_COMMIT=async).
 */
export function applyParameters(
  projectId: string,
  items: readonly ApplyItem[],
  commit: 'on' | 'off',
): unknown[] {
  const values: unknown[] = [projectId];
  for (const column of APPLY_COLUMNS) values.push(items.map((i) => i[column.field]));
  values.push(commit);
  return values;
}

/**
 * Applies one change to each slice (escrow.ts) — the settle of a request, or a slice given back — all in
 * one transaction, durably unless SETTLE_COMMIT=async:
 * - `released` comes off the slice and off the wallet's `held`; `close` closes the slice (its rest is in
 *   `released`). `reserved` (what the slice's requests in flight reserve after the change; 0 when it
 *   closes) is written unless a later change (a take) wrote it already, and the wallet's `reserved` (the
 *   held amount the API shows) moves by the difference. (Its expiry is left alone: changing it would make every settle a non-HOT update of
 *   `holds`; the pod renews its slices every third of their time to live instead.)
 * - `charged` (the provider's usage × the price, which may exceed the request's reservation) comes off
 *   the balance, below zero when the balance does not cover it (a debt), with one `charge` ledger entry
 *   and the events that describe it — so an event exists exactly when its charge does.
 *
 * Each change is applied once: on an open slice only when its `seq` is above the slice's (a retry after
 * an ambiguous failure is skipped); a charge whose slice is no longer open (the sweeper took it back, or
 * `seq` 0: the pod lost track of it) still charges the wallet, unless its entry already exists.
 *
 * Credit grants are spent first: for a wallet with grants, `tollgate_draw_grants` (migration 0018) draws
 * the charge from them — highest priority, then soonest expiry — after the wallet's row is locked, and
 * the entry's metadata lists the draws (`grants`).
 *
 * The balance events among the envelopes are written only when their rule holds over the wallet after
 * the charge, with their amounts filled in (balance-events.ts: `balance.charge.created` for a charge,
 * `balance.debt.created` when it left the balance below zero, `balance.low` when it crossed below the
 * threshold — the user's own, else the project's — and `balance.depleted` when it reached zero from
 * above); other envelopes are written as they are.
 *
 * Every ledger entry takes the wallet's next number (`entries`, in the update that locks the wallet).
 *
 * One row per change: `open` (the slice was open), and the wallet after it when the wallet changed.
 *
 * $1 project id · $2… the changes' columns (`APPLY_COLUMNS`) · then `synchronous_commit` for this
 * transaction (`applyParameters`)
 */
export const applySlices: Statement = {
  name: 'tollgate_apply_slices_v5',
  text: `
    WITH r AS (
      SELECT * FROM unnest(${APPLY_COLUMNS.map((c) => applyParam(c.name)).join(', ')})
        AS r(${APPLY_COLUMNS.map((c) => c.name).join(', ')})
      -- SETTLE_COMMIT: 'on' (durable, the default) or 'off' (visible at once, flushed within moments)
      CROSS JOIN (SELECT set_config('synchronous_commit', ${COMMIT_PARAM}, true)) AS commit_mode
    ), hl AS (
      SELECT h.id, h.status, h.seq, h.reserved, h.reserved_seq FROM holds h
      WHERE h.project_id = $1 AND h.id = ANY(${applyParam('slice_id')})
      ORDER BY h.id FOR NO KEY UPDATE
    ), h AS (
      -- a closed slice keeps its last amount as its record (status: settled when its last change charged)
      UPDATE holds SET amount = CASE WHEN r.close THEN holds.amount ELSE holds.amount - r.released END,
                       seq = r.seq,
                       status = CASE WHEN NOT r.close THEN 'open' WHEN r.charged > 0 THEN 'settled' ELSE 'released' END,
                       closed_at = CASE WHEN r.close THEN now() END,
                       reserved = CASE WHEN r.close THEN 0 WHEN hl.reserved_seq < r.seq THEN r.reserved
                                       ELSE hl.reserved END,
                       reserved_seq = greatest(hl.reserved_seq, r.seq)
      FROM r, hl
      WHERE holds.id = hl.id AND r.slice_id = hl.id AND hl.status = 'open' AND r.seq > 0 AND hl.seq < r.seq
      RETURNING holds.id, holds.reserved - hl.reserved AS reserving
    ), x AS (
      SELECT r.*, (h.id IS NOT NULL) AS on_slice, coalesce(h.reserving, 0) AS reserving
      FROM r LEFT JOIN h ON h.id = r.slice_id
      WHERE h.id IS NOT NULL
         OR (r.charged > 0
             AND (r.seq = 0 OR NOT EXISTS (SELECT 1 FROM hl WHERE hl.id = r.slice_id AND hl.status = 'open'))
             AND NOT EXISTS (SELECT 1 FROM ledger_entries le
                             WHERE le.id = ANY(${applyParam('entry_id')}) AND le.id = r.entry_id))
    ), w AS (
      SELECT e.id, e.granted FROM end_users e
      -- by the changes' wallet ids (the primary key): a generic plan would otherwise scan the project's
      -- wallets to find the few in x
      WHERE e.project_id = $1 AND e.id = ANY(${applyParam('user_id')}) AND e.id IN (SELECT user_id FROM x)
      ORDER BY e.id FOR NO KEY UPDATE
    ), g AS (
      -- credit grants first: drawn once the wallet's row is locked (w), for wallets that have any
      SELECT x.user_id, d.draws,
             (SELECT coalesce(sum((j->>'amount')::numeric), 0) FROM jsonb_array_elements(d.draws) AS j) AS drawn
      FROM x JOIN w ON w.id = x.user_id
      CROSS JOIN LATERAL (SELECT tollgate_draw_grants(x.user_id, x.charged) AS draws) AS d
      WHERE x.charged > 0 AND w.granted > 0
    ), u AS (
      UPDATE end_users e SET balance = e.balance - x.charged,
                             held = e.held - CASE WHEN x.on_slice THEN x.released ELSE 0 END,
                             reserved = e.reserved + x.reserving,
                             entries = e.entries + CASE WHEN x.charged > 0 THEN 1 ELSE 0 END,
                             granted = e.granted - coalesce(g.drawn, 0), updated_at = now()
      FROM x JOIN w ON w.id = x.user_id LEFT JOIN g ON g.user_id = x.user_id
      WHERE e.id = x.user_id AND e.id = ANY(${applyParam('user_id')})
      RETURNING e.id, e.external_id, e.balance, e.held, e.reserved, e.entries, e.granted, x.slice_id, x.charged,
                x.entry_id,
                x.source, x.description, x.metadata, x.events, g.draws,
                coalesce(e.low_balance_threshold, x.threshold) AS threshold
    ), l AS (
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, held_delta, balance_after, held_after,
                                  hold_id, source, description, metadata, seq)
      SELECT entry_id, $1, id, 'charge', -charged, 0, balance, reserved, slice_id, source, description,
             CASE WHEN jsonb_array_length(coalesce(draws, '[]'::jsonb)) > 0
                  THEN metadata::jsonb || jsonb_build_object('grants', draws)
                  ELSE metadata::jsonb END,
             entries
      FROM u WHERE charged > 0
    ), ev AS (
      -- the balance events' rules and amounts: balance-events.ts
      INSERT INTO events (id, project_id, type, version, envelope, created_at)
      SELECT j->>'id', $1, j->>'type', j->>'version', ${balanceEventDataSql()}, (j->>'createdAt')::timestamptz
      FROM u CROSS JOIN LATERAL jsonb_array_elements(u.events::jsonb) AS j
      WHERE u.events IS NOT NULL AND ${balanceEventConditionSql()}
    )
    SELECT r.slice_id, coalesce(hl.status = 'open', false) AS open, u.id AS user_id, u.external_id, u.charged,
           u.balance, u.held, u.reserved, u.granted
    FROM r LEFT JOIN hl ON hl.id = r.slice_id LEFT JOIN u ON u.slice_id = r.slice_id`,
};

/**
 * Renews a pod's open slices (their pod is alive); returns the ids still open.
 *
 * $1 project id · $2 slice ids · $3 time to live (s)
 */
export const renewSlices: Statement = {
  name: 'tollgate_renew_slices_v1',
  text: `
    UPDATE holds SET expires_at = now() + make_interval(secs => $3::int)
    WHERE project_id = $1 AND id = ANY($2::text[]) AND status = 'open'
    RETURNING id`,
};

/**
 * The sweeper: closes the given slices that are still open and past their expiry (their pod died) as
 * `expired`, and gives their amounts (and their reservations) back to the wallets' available balance.
 * Returns the ids closed.
 *
 * $1 project id · $2 slice ids
 */
export const expireSlices: Statement = {
  name: 'tollgate_expire_slices_v2',
  text: `
    WITH hl AS (
      SELECT h.id, h.reserved FROM holds h
      WHERE h.project_id = $1 AND h.id = ANY($2::text[]) AND h.status = 'open' AND h.expires_at < now()
      ORDER BY h.id FOR NO KEY UPDATE
    ), h AS (
      UPDATE holds SET status = 'expired', closed_at = now(), reserved = 0
      FROM hl WHERE holds.id = hl.id
      RETURNING holds.id, holds.user_id, holds.amount, hl.reserved
    ), s AS (
      SELECT user_id, sum(amount) AS amount, sum(reserved) AS reserved FROM h GROUP BY user_id
    ), w AS (
      SELECT e.id FROM end_users e
      WHERE e.project_id = $1 AND e.id IN (SELECT user_id FROM s)
      ORDER BY e.id FOR NO KEY UPDATE
    ), u AS (
      UPDATE end_users e SET held = e.held - s.amount, reserved = e.reserved - s.reserved, updated_at = now()
      FROM s JOIN w ON w.id = s.user_id WHERE e.id = s.user_id
      RETURNING e.id
    )
    SELECT h.id FROM h`,
};
