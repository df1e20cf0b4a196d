import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Cache writes have their own prices: per-token models may set the price of input tokens the provider
 * writes to its cache for 5 minutes and for one hour (Anthropic's `cache_creation_input_tokens`); null
 * means the default (1.25× / 2× the input price on Claude-family models, the input price otherwise).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE models
      ADD COLUMN cache_write_per_million numeric CHECK (cache_write_per_million >= 0),
      ADD COLUMN cache_write_1h_per_million numeric CHECK (cache_write_1h_per_million >= 0);
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    'ALTER TABLE models DROP COLUMN cache_write_per_million, DROP COLUMN cache_write_1h_per_million',
  );
}
