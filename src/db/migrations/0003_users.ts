import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Users: the nonces of connect links that were used (a connect link works once), kept until the link
 * would have expired anyway.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE used_link_tokens (
      nonce text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      kind text NOT NULL,
      external_id text NOT NULL,
      used_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL
    );
    CREATE INDEX used_link_tokens_expiry ON used_link_tokens (expires_at);
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'DROP TABLE used_link_tokens');
}
