import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * End-user keys (issue 36): a key that belongs to one end user of one project (`tgu_…`), so that a
 * coding agent configures a base URL and a key, nothing else. Only the SHA-256 hash is stored; the key
 * is shown once. `expires_at` NULL: it does not expire; `spend_cap` is the cap the key was given (it is
 * the user's monthly spend cap: src/users/keys.ts).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE end_user_keys (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      external_id text NOT NULL,
      name text NOT NULL,
      prefix text NOT NULL,
      key_hash text NOT NULL UNIQUE,
      spend_cap numeric CHECK (spend_cap >= 0),
      expires_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    );
    CREATE INDEX end_user_keys_user ON end_user_keys (project_id, external_id);
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'DROP TABLE end_user_keys');
}
