import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Rows a Kubernetes resource manages (src/operator/resources): the resource that owns a row is stored on
 * it (`<Kind> <namespace>/<name>`), and every other writer (admin API, dashboard, CLI) gets a 409 naming
 * it (src/core/managed.ts). A project's models and limits are managed as a whole (a PriceList, a
 * LimitPolicy), so they are recorded on the project. NULL: made by hand, editable as before.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE projects ADD COLUMN managed_by text;
    ALTER TABLE projects ADD COLUMN pricing_managed_by text;
    ALTER TABLE projects ADD COLUMN limits_managed_by text;
    CREATE UNIQUE INDEX projects_managed_by ON projects (managed_by) WHERE managed_by IS NOT NULL;
    ALTER TABLE api_keys ADD COLUMN managed_by text;
    CREATE UNIQUE INDEX api_keys_managed_by ON api_keys (managed_by)
      WHERE managed_by IS NOT NULL AND revoked_at IS NULL;
    ALTER TABLE providers ADD COLUMN managed_by text;
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE providers DROP COLUMN managed_by;
    DROP INDEX api_keys_managed_by;
    ALTER TABLE api_keys DROP COLUMN managed_by;
    DROP INDEX projects_managed_by;
    ALTER TABLE projects DROP COLUMN limits_managed_by;
    ALTER TABLE projects DROP COLUMN pricing_managed_by;
    ALTER TABLE projects DROP COLUMN managed_by;
  `,
  );
}
