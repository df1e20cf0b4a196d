import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * OpenAI compatibility: which of OpenAI's APIs a model serves (`chat`, `responses`, `embeddings`), and
 * an optional per-token price for cached input tokens (providers report them in `usage`).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE models
      ADD COLUMN cached_input_per_million numeric CHECK (cached_input_per_million >= 0),
      ADD COLUMN endpoints text[] NOT NULL DEFAULT '{chat,responses}'
        CHECK (cardinality(endpoints) > 0 AND endpoints <@ '{chat,responses,embeddings}'::text[]);
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'ALTER TABLE models DROP COLUMN cached_input_per_million, DROP COLUMN endpoints');
}
