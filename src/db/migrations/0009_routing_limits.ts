import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Routing and limits (issue 13): several named providers per project (each with its sealed key and its
 * own time-outs), routes per model, the project's rate and spend limits (from the pricing file) and
 * per-user spend cap overrides. The single upstream of a project becomes its provider `default`, in
 * place (the old columns stay, mirrored, for readers that still look at them).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE providers (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      name text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
      base_url text NOT NULL,
      key_sealed text,
      connect_timeout_ms integer CHECK (connect_timeout_ms > 0),
      response_timeout_ms integer CHECK (response_timeout_ms > 0),
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (project_id, name)
    );
    INSERT INTO providers (project_id, name, base_url, key_sealed)
      SELECT id, 'default', upstream_base_url, upstream_key_sealed FROM projects
      WHERE upstream_base_url IS NOT NULL;
    ALTER TABLE models ADD COLUMN routes jsonb;
    ALTER TABLE projects ADD COLUMN limits jsonb;
    CREATE TABLE spend_caps (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      external_id text NOT NULL,
      daily numeric CHECK (daily >= 0),
      monthly numeric CHECK (monthly >= 0),
      updated_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (project_id, external_id)
    );
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE spend_caps;
    ALTER TABLE projects DROP COLUMN limits;
    ALTER TABLE models DROP COLUMN routes;
    DROP TABLE providers;
  `,
  );
}
