import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * The hold margin of a per-token model (src/models/hold-margin.ts): the multiplier of Tollgate's prompt
 * estimate when it holds. Null: the default of the upstream model's tokenizer family.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE models ADD COLUMN hold_margin numeric
      CONSTRAINT models_hold_margin_range CHECK (hold_margin >= 1 AND hold_margin <= 10);
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, `ALTER TABLE models DROP COLUMN hold_margin;`);
}
