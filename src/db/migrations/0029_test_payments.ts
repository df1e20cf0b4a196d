import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * The `test` payment provider (issue 38): a project may connect it (`payment_connections.provider`
 * `test`), and its account — webhook endpoints, checkouts, payments, saved cards, refunds — is kept in
 * `test_payment_objects`, one JSON object per row, keyed by the account (the connection's sealed key)
 * and, for calls made with one, the caller's idempotency key.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE payment_connections DROP CONSTRAINT IF EXISTS payment_connections_provider_check;
    ALTER TABLE payment_connections ADD CONSTRAINT payment_connections_provider_check
      CHECK (provider IN ('stripe', 'test'));
    CREATE TABLE test_payment_objects (
      id text PRIMARY KEY,
      account text NOT NULL,
      kind text NOT NULL,
      idempotency_key text,
      data jsonb NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      UNIQUE (account, idempotency_key)
    );
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE test_payment_objects;
    DELETE FROM payment_connections WHERE provider = 'test';
    ALTER TABLE payment_connections DROP CONSTRAINT payment_connections_provider_check;
    ALTER TABLE payment_connections ADD CONSTRAINT payment_connections_provider_check
      CHECK (provider IN ('stripe'));
    `,
  );
}
