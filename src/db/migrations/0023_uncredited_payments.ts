import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * A paid checkout that cannot be credited (paid in another currency than the project's, or naming a
 * payment or user Tollgate does not know) is kept as a payment with the status `uncredited` and the
 * reason in `problem`, so the developer sees it in the payments list (and can refund it), not only in
 * the log. A payment whose user is unknown has no wallet: `user_id` may be null.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE payments ADD COLUMN problem text;
    ALTER TABLE payments ALTER COLUMN user_id DROP NOT NULL;
    ALTER TABLE payments DROP CONSTRAINT payments_status_check;
    ALTER TABLE payments ADD CONSTRAINT payments_status_check
      CHECK (status IN ('pending', 'paid', 'refunded', 'disputed', 'failed', 'uncredited'));
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DELETE FROM payments WHERE status = 'uncredited' OR user_id IS NULL;
    ALTER TABLE payments DROP CONSTRAINT payments_status_check;
    ALTER TABLE payments ADD CONSTRAINT payments_status_check
      CHECK (status IN ('pending', 'paid', 'refunded', 'disputed', 'failed'));
    ALTER TABLE payments ALTER COLUMN user_id SET NOT NULL;
    ALTER TABLE payments DROP COLUMN problem;
    `,
  );
}
