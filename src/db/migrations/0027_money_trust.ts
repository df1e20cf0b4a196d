import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Money round two (issue 35):
 * - Stripe credits only what Tollgate created: one payment credits once whatever names it (movement key
 *   `deposit:<payment id>`; every payment already credited gets that key here), and refunds and disputes
 *   are capped at the payment's amount less its earlier reversals (`payments.reversed`, cumulative; a
 *   movement's own share in `payment_movements.reversed`, given back when a dispute is won). A payment the
 *   provider reports that Tollgate did not create is kept `uncredited`, once per PaymentIntent.
 * - Spend caps with Redis down are checked against Postgres: `spend_reservations` are the hold amounts of
 *   requests admitted that way, until they settle (or expire, when their pod died).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE payments ADD COLUMN reversed numeric NOT NULL DEFAULT 0;
    UPDATE payments SET reversed = least(amount, refunded + disputed) WHERE refunded > 0 OR disputed > 0;
    ALTER TABLE payment_movements ADD COLUMN reversed numeric NOT NULL DEFAULT 0;
    UPDATE payment_movements SET reversed = amount WHERE kind IN ('refund', 'dispute');
    INSERT INTO payment_movements (project_id, key, payment_id, kind, amount, entry_id, created_at)
      SELECT project_id, 'deposit:' || payment_id, payment_id, 'deposit', amount, entry_id, created_at
      FROM payment_movements WHERE kind = 'deposit'
      ON CONFLICT DO NOTHING;
    CREATE UNIQUE INDEX payments_foreign_intent ON payments (payment_intent_id)
      WHERE status = 'uncredited' AND checkout_id IS NULL;

    CREATE TABLE spend_reservations (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      external_id text NOT NULL,
      amount numeric NOT NULL CHECK (amount >= 0),
      expires_at timestamptz NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX spend_reservations_user ON spend_reservations (project_id, external_id, expires_at);
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE spend_reservations;
    DROP INDEX payments_foreign_intent;
    DELETE FROM payment_movements WHERE kind = 'deposit' AND key = 'deposit:' || payment_id
      AND EXISTS (SELECT 1 FROM payment_movements o WHERE o.payment_id = payment_movements.payment_id
        AND o.kind = 'deposit' AND o.key <> payment_movements.key);
    ALTER TABLE payment_movements DROP COLUMN reversed;
    ALTER TABLE payments DROP COLUMN reversed;
    `,
  );
}
