import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Escrow (src/billing/escrow.ts): a hold is now a pod's slice of a wallet's available balance, from
 * which that pod admits the wallet's requests in memory. `owner` names the pod (asked to give a slice
 * back when another pod needs the balance); `seq` is the number of the last change the pod applied to
 * the slice, so a change retried after an ambiguous failure is applied once. The index finds a wallet's
 * open slices (who to ask).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE holds ADD COLUMN owner text;
    ALTER TABLE holds ADD COLUMN seq bigint NOT NULL DEFAULT 0;
    CREATE INDEX holds_open_user ON holds (user_id) WHERE status = 'open';
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `DROP INDEX holds_open_user; ALTER TABLE holds DROP COLUMN seq, DROP COLUMN owner;`,
  );
}
