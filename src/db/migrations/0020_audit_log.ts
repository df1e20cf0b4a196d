import { type Kysely, sql } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * The audit log: one row per change to projects, prices, providers, keys, limits, payment settings,
 * webhook subscriptions and admin tokens, and per manual deposit, charge, refund or credit grant — who,
 * when, from where, what, and before/after with secrets redacted (src/audit). Append-only: a trigger
 * refuses UPDATE, DELETE and TRUNCATE, so not even the application's own role can rewrite history.
 * No foreign keys: an entry outlives what it names. Kept out of the retention job.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE audit_log (
      id text PRIMARY KEY,
      created_at timestamptz NOT NULL DEFAULT now(),
      project_id text,
      actor_type text NOT NULL,
      actor_id text NOT NULL,
      actor_email text,
      developer_id text,
      ip text,
      via text NOT NULL,
      action text NOT NULL,
      target_type text NOT NULL,
      target_id text,
      before jsonb,
      after jsonb
    );
    CREATE INDEX audit_log_project ON audit_log (project_id, id DESC);
  `,
  );
  await sql
    .raw(`
    CREATE OR REPLACE FUNCTION tollgate_audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
    BEGIN
      RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
    END
    $fn$`)
    .execute(db);
  await runStatements(
    db,
    `
    CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
      FOR EACH ROW EXECUTE FUNCTION tollgate_audit_log_append_only();
    CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
      FOR EACH STATEMENT EXECUTE FUNCTION tollgate_audit_log_append_only();
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE audit_log;
    DROP FUNCTION tollgate_audit_log_append_only();
  `,
  );
}
