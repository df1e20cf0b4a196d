import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Developers (dashboard accounts), their sessions and admin tokens. A project's `owner_user_id` is the id
 * of the developer who owns it (`acct_…`); projects made without one (the CLI on the database, the dev
 * demo) belong to no account and are seen only with a full-access admin token.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE developers (
      id text PRIMARY KEY,
      email text NOT NULL,
      password_hash text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE UNIQUE INDEX developers_email ON developers (lower(email));

    CREATE TABLE admin_sessions (
      id text PRIMARY KEY,
      developer_id text NOT NULL REFERENCES developers (id) ON DELETE CASCADE,
      token_hash text NOT NULL UNIQUE,
      csrf_token text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL
    );
    CREATE INDEX admin_sessions_expiry ON admin_sessions (expires_at);

    CREATE TABLE admin_tokens (
      id text PRIMARY KEY,
      developer_id text REFERENCES developers (id) ON DELETE CASCADE,
      name text NOT NULL,
      prefix text NOT NULL,
      token_hash text NOT NULL UNIQUE,
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    );

    CREATE INDEX projects_owner ON projects (owner_user_id, id);
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP INDEX projects_owner;
    DROP TABLE admin_tokens;
    DROP TABLE admin_sessions;
    DROP TABLE developers;
  `,
  );
}
