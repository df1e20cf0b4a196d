import type { Statement } from '../db/index.ts';

/**
 * The two statements of the metered hot path. Each serves a whole batch (group commit: every request
 * that arrived while the previous batch was in flight) of one project in one round trip, over arrays
 * with a per-row condition. A batch never names one wallet twice (the queue defers a second request of
 * a wallet to the next batch), so a row's condition sees the wallet as every earlier hold left it.
 *
 * Wallets are locked in id order before they are changed, so batches of several pods never deadlock.
 * Every statement names its project: on a database distributed by project (Citus) each stays on one
 * shard.
 */

/**
 * Places holds: reserves each amount of a connected wallet whose available balance (balance − held)
 * covers it, and writes the hold rows. A hold moves no money, so it is no ledger entry; the `holds`
 * row is its record (open, then settled, released or expired). Returns one row per hold placed; a
 * request without a row was refused.
 *
 * Its transaction commits asynchronously (`synchronous_commit` off for this transaction only, set by the
 * statement itself, so it holds behind PgBouncer in transaction mode too): a hold lost in a database
 * crash is a lost reservation only — its settle then finds no open hold and charges nothing.
 *
 * $1 project id · $2 external ids · $3 amounts · $4 hold ids · $5 purposes · $6 time to live (s)
 */
export const placeHolds: Statement = {
  name: 'tollgate_place_holds_v2',
  text: `
    WITH r AS (
      SELECT r.* FROM unnest($2::text[], $3::numeric[], $4::text[], $5::text[])
        AS r(external_id, amount, hold_id, purpose)
      -- this statement's transaction commits without waiting for the WAL flush
      CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
    ), w AS (
      SELECT e.id FROM end_users e
      WHERE e.project_id = $1 AND e.external_id = ANY($2::text[])
      ORDER BY e.id FOR NO KEY UPDATE
    ), u AS (
      UPDATE end_users e SET held = e.held + r.amount, updated_at = now()
      FROM r, w
      WHERE w.id = e.id AND e.project_id = $1 AND e.external_id = r.external_id
        AND e.connected AND e.balance - e.held >= r.amount
      RETURNING e.id, e.balance, e.held, e.granted, r.hold_id, r.amount, r.purpose
    ), h AS (
      INSERT INTO holds (id, project_id, user_id, amount, status, purpose, expires_at)
      SELECT hold_id, $1, id, amount, 'open', purpose, now() + make_interval(secs => $6::int) FROM u
    )
    SELECT hold_id, id AS user_id, balance, held, granted FROM u`,
};

/**
 * Closes holds: charges each its amount — the provider's usage × the price, which may exceed the hold:
 * the excess comes from the balance in this same statement, and when even the balance does not cover it
 * the wallet goes below zero (a debt); zero releases the hold — and gives back the hold, writes one
 * `charge` ledger entry per non-zero charge and the events that describe it — all in one transaction, so
 * an event exists exactly when its charge does. A hold that is no longer open (closed by a retry, or
 * expired by the sweeper) is left alone and returns no row.
 *
 * Credit grants are spent first: for a wallet with grants, `tollgate_draw_grants` (migration 0018) draws
 * the charge from them — highest priority, then soonest expiry — after the wallet's row is locked, and
 * the entry's metadata lists the draws (`grants`).
 *
 * `balance.charge.created` envelopes get the wallet's balance after the charge in `data.balance`;
 * a `balance.debt.created` envelope is written only when the charge left the balance below zero, with
 * `data.balance`, `data.debt` (the whole debt) and `data.amount` (the part of this charge not covered);
 * `balance.low` only when the balance crossed below the threshold (the user's own, else $10's) and
 * `balance.depleted` only when it reached zero from above, each with `data.balance` and `data.available`.
 *
 * $1 project id · $2 hold ids · $3 charged amounts · $4 entry ids · $5 sources · $6 descriptions
 * $7 metadata (JSON text) · $8 events (a JSON array of envelopes, or null)
 * $9 the status a zero charge leaves (`released` by its request, `expired` by the sweeper)
 * $10 the project's low-balance thresholds (or null)
 */
export const closeHolds: Statement = {
  name: 'tollgate_close_holds_v3',
  text: `
    WITH r AS (
      SELECT * FROM unnest($2::text[], $3::numeric[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                           $9::text[], $10::numeric[])
        AS r(hold_id, charged, entry_id, source, description, metadata, events, zero_status, threshold)
    ), hl AS (
      SELECT h.id FROM holds h
      WHERE h.project_id = $1 AND h.id = ANY($2::text[]) AND h.status = 'open'
      ORDER BY h.id FOR NO KEY UPDATE
    ), h AS (
      UPDATE holds SET status = CASE WHEN r.charged > 0 THEN 'settled' ELSE r.zero_status END, closed_at = now()
      FROM r, hl
      WHERE holds.id = hl.id AND r.hold_id = hl.id AND holds.status = 'open'
      RETURNING holds.id, holds.user_id, holds.amount, r.charged,
                r.entry_id, r.source, r.description, r.metadata, r.events, r.threshold
    ), w AS (
      SELECT e.id, e.granted FROM end_users e
      WHERE e.project_id = $1 AND e.id IN (SELECT user_id FROM h)
      ORDER BY e.id FOR NO KEY UPDATE
    ), g AS (
      -- credit grants first: drawn once the wallet's row is locked (w), for wallets that have any
      SELECT h.user_id, d.draws,
             (SELECT coalesce(sum((x->>'amount')::numeric), 0) FROM jsonb_array_elements(d.draws) AS x) AS drawn
      FROM h JOIN w ON w.id = h.user_id
      CROSS JOIN LATERAL (SELECT tollgate_draw_grants(h.user_id, h.charged) AS draws) AS d
      WHERE h.charged > 0 AND w.granted > 0
    ), u AS (
      UPDATE end_users e SET balance = e.balance - h.charged, held = e.held - h.amount,
                             granted = e.granted - coalesce(g.drawn, 0), updated_at = now()
      FROM h JOIN w ON w.id = h.user_id LEFT JOIN g ON g.user_id = h.user_id
      WHERE e.id = h.user_id
      RETURNING e.id, e.external_id, e.balance, e.held, e.granted, h.id AS hold_id, h.charged, h.entry_id,
                h.source, h.description, h.metadata, h.events, g.draws,
                coalesce(e.low_balance_threshold, h.threshold) AS threshold
    ), l AS (
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, held_delta, balance_after, held_after,
                                  hold_id, source, description, metadata)
      SELECT entry_id, $1, id, 'charge', -charged, 0, balance, held, hold_id, source, description,
             CASE WHEN jsonb_array_length(coalesce(draws, '[]'::jsonb)) > 0
                  THEN metadata::jsonb || jsonb_build_object('grants', draws)
                  ELSE metadata::jsonb END
      FROM u WHERE charged > 0
    ), ev AS (
      INSERT INTO events (id, project_id, type, version, envelope, created_at)
      SELECT x->>'id', $1, x->>'type', x->>'version',
             CASE x->>'type'
               WHEN 'balance.charge.created'
                 THEN jsonb_set(x, '{data,balance}', to_jsonb(trim_scale(u.balance)::text))
               WHEN 'balance.debt.created'
                 THEN jsonb_set(jsonb_set(jsonb_set(x, '{data,balance}', to_jsonb(trim_scale(u.balance)::text)),
                                          '{data,debt}', to_jsonb(trim_scale(-u.balance)::text)),
                                '{data,amount}', to_jsonb(trim_scale(least(u.charged, -u.balance))::text))
               WHEN 'balance.low'
                 THEN jsonb_set(jsonb_set(jsonb_set(x, '{data,balance}', to_jsonb(trim_scale(u.balance)::text)),
                                          '{data,available}', to_jsonb(trim_scale(u.balance - u.held)::text)),
                                '{data,threshold}', to_jsonb(trim_scale(u.threshold)::text))
               WHEN 'balance.depleted'
                 THEN jsonb_set(jsonb_set(x, '{data,balance}', to_jsonb(trim_scale(u.balance)::text)),
                                '{data,available}', to_jsonb(trim_scale(u.balance - u.held)::text))
               ELSE x END,
             (x->>'createdAt')::timestamptz
      FROM u CROSS JOIN LATERAL jsonb_array_elements(u.events::jsonb) AS x
      WHERE u.events IS NOT NULL AND (u.charged > 0 OR x->>'type' <> 'balance.charge.created')
        AND (x->>'type' <> 'balance.debt.created' OR (u.charged > 0 AND u.balance < 0))
        AND (x->>'type' <> 'balance.low'
             OR (u.threshold IS NOT NULL AND u.balance < u.threshold AND u.balance + u.charged >= u.threshold))
        AND (x->>'type' <> 'balance.depleted' OR (u.balance <= 0 AND u.balance + u.charged > 0))
    )
    SELECT hold_id, id AS user_id, external_id, charged, balance, held, granted FROM u`,
};
