import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Retention of the Responses bookkeeping (src/retention, RETENTION_RESPONSES_DAYS): `response_chains`
 * (a row per Responses answer) and finished `background_responses` are pruned by age. Both are keyed
 * by the provider's ids, which do not sort by time: an index on their creation time finds the old rows.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE INDEX response_chains_created ON response_chains (created_at);
    CREATE INDEX background_responses_finished ON background_responses (created_at) WHERE status <> 'pending';
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP INDEX background_responses_finished;
    DROP INDEX response_chains_created;
    `,
  );
}
