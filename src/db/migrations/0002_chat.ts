import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Subscription periods of the chat paywall: one row per user and subscription-priced model, holding the
 * current (or last) period. A period starts when its fee is charged; requests are free until it ends.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE model_subscriptions (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      model_id text NOT NULL,
      fee numeric NOT NULL CHECK (fee >= 0),
      period_start timestamptz NOT NULL,
      period_end timestamptz NOT NULL,
      charge_entry_id text REFERENCES ledger_entries(id),
      periods integer NOT NULL DEFAULT 1,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (user_id, model_id),
      CHECK (period_end > period_start)
    );
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'DROP TABLE model_subscriptions');
}
