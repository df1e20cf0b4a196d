import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Escrow as an implementation detail, and activity that replays.
 *
 * - `holds.reserved`: what the requests in flight on a pod's slice reserved, as the pod's last change of
 *   the slice said (`reserved_seq`: the number of that change, so a take and a settle of one slice that
 *   cross apply in the order the pod made them). `end_users.reserved` is the sum over the wallet's open
 *   slices: the `held` everything outside a pod shows (balance API, pages, events, auto-recharge);
 *   `end_users.held` keeps the whole slices, for the take's condition.
 * - `end_users.entries`: the wallet's number of ledger entries, incremented by the update that locks the
 *   wallet for a movement; `ledger_entries.seq` is the entry's number, so the activity in `seq` order
 *   replays (`balance_after` = the previous one's + `amount`) whatever the concurrency. Entries written
 *   before get numbers in the order of their time.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE holds ADD COLUMN reserved numeric NOT NULL DEFAULT 0;
    ALTER TABLE holds ADD COLUMN reserved_seq bigint NOT NULL DEFAULT 0;
    ALTER TABLE end_users ADD COLUMN reserved numeric NOT NULL DEFAULT 0;
    ALTER TABLE end_users ADD COLUMN entries bigint NOT NULL DEFAULT 0;
    ALTER TABLE ledger_entries ADD COLUMN seq bigint;
    UPDATE ledger_entries l SET seq = n.seq
      FROM (SELECT id, row_number() OVER (PARTITION BY user_id ORDER BY created_at, id) AS seq
            FROM ledger_entries) AS n
      WHERE l.id = n.id;
    UPDATE end_users e SET entries = c.entries
      FROM (SELECT user_id, max(seq) AS entries FROM ledger_entries GROUP BY user_id) AS c
      WHERE e.id = c.user_id;
    ALTER TABLE ledger_entries ALTER COLUMN seq SET NOT NULL;
    CREATE UNIQUE INDEX ledger_entries_user_seq ON ledger_entries (user_id, seq DESC);
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP INDEX ledger_entries_user_seq;
    ALTER TABLE ledger_entries DROP COLUMN seq;
    ALTER TABLE end_users DROP COLUMN entries, DROP COLUMN reserved;
    ALTER TABLE holds DROP COLUMN reserved_seq, DROP COLUMN reserved;
    `,
  );
}
