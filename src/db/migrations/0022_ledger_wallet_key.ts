import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * A ledger entry names its wallet by (project, user): one foreign key to `end_users (project_id, id)`
 * instead of one to `projects` and one to `end_users`. It is stricter (an entry's project is its
 * wallet's) and it is cheaper on the hot path: the check of the project key took a share lock on the
 * project's row for every charge, and concurrent settles of one project then shared that lock through
 * a multixact each time; the wallet's row is already locked by the charge itself. Deleting a project
 * still deletes its entries (through its wallets).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users ADD CONSTRAINT end_users_project_id_id_key UNIQUE (project_id, id);
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_wallet_fkey FOREIGN KEY (project_id, user_id)
      REFERENCES end_users (project_id, id) ON DELETE CASCADE NOT VALID;
    ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_wallet_fkey;
    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_project_id_fkey;
    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_user_id_fkey;
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_user_id_fkey FOREIGN KEY (user_id)
      REFERENCES end_users (id) ON DELETE CASCADE;
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_project_id_fkey FOREIGN KEY (project_id)
      REFERENCES projects (id) ON DELETE CASCADE;
    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_wallet_fkey;
    ALTER TABLE end_users DROP CONSTRAINT end_users_project_id_id_key;
    `,
  );
}
