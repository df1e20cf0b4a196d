import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * The projects whose pricing or limits a custom resource manages, found by its marker: a PriceList's
 * or a LimitPolicy's release (src/operator/stores.ts `managedProjects`) looks them up on every resync,
 * once per resource, so without an index every resync read the whole `projects` table once per
 * resource. Partial: only managed projects are in them.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE INDEX projects_pricing_managed_by ON projects (pricing_managed_by) WHERE pricing_managed_by IS NOT NULL;
    CREATE INDEX projects_limits_managed_by ON projects (limits_managed_by) WHERE limits_managed_by IS NOT NULL;
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP INDEX projects_limits_managed_by;
    DROP INDEX projects_pricing_managed_by;
    `,
  );
}
