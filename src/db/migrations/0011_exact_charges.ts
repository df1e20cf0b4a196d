import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Charges are the provider's usage × the price, always: a settle whose real cost exceeds its hold takes
 * the excess from the balance, and when even that does not cover it the wallet goes below zero (a debt,
 * every cent of it in the ledger). The database keeps `held >= 0`; admission alone keeps requests within
 * the available balance (every hold and charge is conditional on `balance - held` covering it), so only
 * the difference between an estimate and the provider's usage can make a debt.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users DROP CONSTRAINT end_users_no_overspend;
    ALTER TABLE end_users ADD CONSTRAINT end_users_held_not_negative CHECK (held >= 0);
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE end_users DROP CONSTRAINT end_users_held_not_negative;
    ALTER TABLE end_users ADD CONSTRAINT end_users_no_overspend CHECK (held >= 0 AND balance >= held);
  `,
  );
}
