import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * The metering engine (group commit, lean holds): a hold is no longer a ledger entry but only its
 * `holds` row, and wallets and holds are updated in place many times per second: room on each page lets
 * those updates stay heap-only (no index writes, less WAL).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users SET (fillfactor = 80);
    ALTER TABLE holds SET (fillfactor = 80);
    COMMENT ON COLUMN ledger_entries.held_delta IS
      'Change of the held amount: written by entries before migration 0007; a hold is now only its holds row (held = sum of open holds)';
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users RESET (fillfactor);
    ALTER TABLE holds RESET (fillfactor);
    COMMENT ON COLUMN ledger_entries.held_delta IS NULL;
  `,
  );
}
