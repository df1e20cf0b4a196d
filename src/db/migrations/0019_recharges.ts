import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Auto-recharge (issue 25): a user's saved card (the provider's customer and payment method, kept when
 * they ticked "save this card" at checkout) with their auto-recharge choice, and the recharges made off
 * session. At most one recharge of a wallet is `pending` (a partial unique index), and a new one is
 * reserved under the saved card's row lock with the month's recharges summed in the same transaction,
 * so the monthly cap holds on any number of pods. A recharge's money moves through its `payments` row
 * (same id), credited once by the provider's webhook like a checkout.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE payment_customers (
      user_id text PRIMARY KEY REFERENCES end_users(id) ON DELETE CASCADE,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      provider text NOT NULL,
      customer_id text NOT NULL,
      payment_method_id text,
      auto_recharge boolean NOT NULL DEFAULT false,
      threshold numeric CHECK (threshold >= 0),
      amount numeric CHECK (amount > 0),
      failure_reason text,
      failed_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX payment_customers_auto ON payment_customers (project_id) WHERE auto_recharge;

    ALTER TABLE payments ADD COLUMN save_card boolean NOT NULL DEFAULT false;

    CREATE TABLE recharges (
      id text PRIMARY KEY REFERENCES payments(id) ON DELETE CASCADE,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
      amount numeric NOT NULL CHECK (amount > 0),
      currency text NOT NULL,
      payment_intent_id text,
      failure_code text,
      failure_reason text,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE UNIQUE INDEX recharges_one_pending ON recharges (user_id) WHERE status IN ('pending');
    CREATE INDEX recharges_user_month ON recharges (user_id, created_at);
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE recharges;
    ALTER TABLE payments DROP COLUMN save_card;
    DROP TABLE payment_customers;
  `,
  );
}
