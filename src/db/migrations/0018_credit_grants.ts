import { type Kysely, sql } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Credit grants: credit that is not money — promotional, trial or goodwill — with an optional expiry and
 * a priority. A wallet's `balance` is what it can spend (paid money and unspent grants); `granted` is the
 * grants' part of it (the sum of their `remaining`), so the paid part is `balance - granted`. Charges draw
 * on grants first — highest priority, then soonest expiry — through `tollgate_draw_grants`, always while
 * the wallet's row is locked, so a grant is never spent twice; the expiry job takes an expired grant's
 * unspent rest, under the same lock, as its own ledger entry (`grant_expiry`). A grant is a ledger entry
 * of kind `grant`, kept apart from deposits (grants are not refundable money).
 *
 * `low_balance_threshold` overrides the project's threshold for `balance.low` per user;
 * `trial_granted_at` records that a user had the project's trial grant (given once, ever).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users ADD COLUMN granted numeric NOT NULL DEFAULT 0;
    ALTER TABLE end_users ADD COLUMN low_balance_threshold numeric;
    ALTER TABLE end_users ADD COLUMN trial_granted_at timestamptz;
    ALTER TABLE end_users ADD CONSTRAINT end_users_granted_not_negative CHECK (granted >= 0);

    CREATE TABLE credit_grants (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      amount numeric NOT NULL CHECK (amount > 0),
      remaining numeric NOT NULL CHECK (remaining >= 0 AND remaining <= amount),
      priority integer NOT NULL DEFAULT 0,
      reason text NOT NULL,
      expires_at timestamptz,
      expired_amount numeric,
      expired_at timestamptz,
      entry_id text NOT NULL,
      metadata jsonb NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX credit_grants_user_open ON credit_grants (user_id, priority DESC, expires_at) WHERE remaining > 0;
    CREATE INDEX credit_grants_expiry ON credit_grants (expires_at) WHERE remaining > 0 AND expires_at IS NOT NULL;

    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
      CHECK (kind IN ('deposit', 'charge', 'hold', 'release', 'grant', 'grant_expiry'));
  `,
  );
  // One statement with a body of several lines ending in ';': not for runStatements' splitter.
  await sql
    .raw(`
    CREATE OR REPLACE FUNCTION tollgate_draw_grants(p_user text, p_amount numeric) RETURNS jsonb
    LANGUAGE plpgsql VOLATILE AS $fn$
    -- Draws p_amount from the user's unspent, unexpired grants — highest priority first, then soonest
    -- expiry — and returns what it drew: [{"grant": id, "amount": "…"}]. The caller holds the wallet's
    -- row lock and takes the sum drawn off end_users.granted in the same statement.
    DECLARE
      g record;
      rest numeric := p_amount;
      take numeric;
      draws jsonb := '[]'::jsonb;
    BEGIN
      IF p_amount IS NULL OR p_amount <= 0 THEN
        RETURN draws;
      END IF;
      FOR g IN
        SELECT id, remaining FROM credit_grants
         WHERE user_id = p_user AND remaining > 0 AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, expires_at ASC NULLS LAST, id
         FOR UPDATE
      LOOP
        EXIT WHEN rest <= 0;
        take := least(g.remaining, rest);
        UPDATE credit_grants SET remaining = remaining - take WHERE id = g.id;
        rest := rest - take;
        draws := draws || jsonb_build_array(jsonb_build_object('grant', g.id, 'amount', trim_scale(take)::text));
      END LOOP;
      RETURN draws;
    END
    $fn$`)
    .execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP FUNCTION tollgate_draw_grants(text, numeric);
    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
      CHECK (kind IN ('deposit', 'charge', 'hold', 'release'));
    DROP TABLE credit_grants;
    ALTER TABLE end_users DROP COLUMN trial_granted_at, DROP COLUMN low_balance_threshold, DROP COLUMN granted;
  `,
  );
}
