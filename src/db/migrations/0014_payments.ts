import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Payments (issue 23): a payment provider connected per project (its key and webhook signing secret
 * sealed at rest), the top-ups made through it, and the ledger movements each provider object caused —
 * one row per movement key, so a replayed or concurrent webhook can never move money twice.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE payment_connections (
      project_id text PRIMARY KEY REFERENCES projects(id) ON DELETE CASCADE,
      provider text NOT NULL CHECK (provider IN ('stripe')),
      key_sealed text NOT NULL,
      key_hint text NOT NULL,
      livemode boolean NOT NULL DEFAULT false,
      webhook_endpoint_id text,
      webhook_secret_sealed text NOT NULL,
      settings jsonb NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE payments (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      external_id text NOT NULL,
      provider text NOT NULL,
      status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'paid', 'refunded', 'disputed', 'failed')),
      amount numeric NOT NULL CHECK (amount > 0),
      currency text NOT NULL,
      checkout_id text UNIQUE,
      payment_intent_id text,
      charge_id text,
      receipt_url text,
      refunded numeric NOT NULL DEFAULT 0 CHECK (refunded >= 0),
      disputed numeric NOT NULL DEFAULT 0 CHECK (disputed >= 0),
      uncollected numeric NOT NULL DEFAULT 0 CHECK (uncollected >= 0),
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      paid_at timestamptz
    );
    CREATE INDEX payments_user ON payments (project_id, user_id, id);
    CREATE INDEX payments_intent ON payments (payment_intent_id) WHERE payment_intent_id IS NOT NULL;

    CREATE TABLE payment_movements (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      key text NOT NULL,
      payment_id text NOT NULL REFERENCES payments(id) ON DELETE CASCADE,
      kind text NOT NULL CHECK (kind IN ('deposit', 'refund', 'dispute', 'dispute_won')),
      amount numeric NOT NULL,
      entry_id text,
      created_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (project_id, key)
    );
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE payment_movements;
    DROP TABLE payments;
    DROP TABLE payment_connections;
  `,
  );
}
