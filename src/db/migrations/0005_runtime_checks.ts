import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * - `system_settings`: facts about the installation, one row per name. `encryption_key_check` holds a
 *   fingerprint of TOLLGATE_ENCRYPTION_KEY (an HMAC under a key derived from it, see Sealer.keyCheck),
 *   so a process started with another key is refused at start-up instead of failing every request.
 * - `idempotency_keys.response_body`: the exact bytes of the stored response, replayed as they were
 *   sent (jsonb would reorder the keys and respace them). Earlier rows keep jsonb's rendering.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE system_settings (
      name text PRIMARY KEY,
      value text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now()
    );
    ALTER TABLE idempotency_keys ADD COLUMN response_body text;
    UPDATE idempotency_keys SET response_body = response::text WHERE response IS NOT NULL;
    ALTER TABLE idempotency_keys DROP COLUMN response;
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE idempotency_keys ADD COLUMN response jsonb;
    UPDATE idempotency_keys SET response = response_body::jsonb WHERE response_body IS NOT NULL;
    ALTER TABLE idempotency_keys DROP COLUMN response_body;
    DROP TABLE system_settings;
    `,
  );
}
