import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Everything the provider bills is charged:
 * - cache writes have their own prices: per-token models may set the price of input tokens the provider
 *   writes to its cache for 5 minutes and for one hour (Anthropic's `cache_creation_input_tokens`);
 *   null means the default (1.25× / 2× the input price on Claude-family models, the input price
 *   otherwise);
 * - background responses (Responses `background: true`) are charged their hold when accepted and
 *   recorded here until they finish; then the hold above the real cost goes back
 *   (src/responses/background.ts). `held` is what was charged, `pricing` the model's per-token prices
 *   when it was accepted (a later price change does not apply to it).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE models
      ADD COLUMN cache_write_per_million numeric CHECK (cache_write_per_million >= 0),
      ADD COLUMN cache_write_1h_per_million numeric CHECK (cache_write_1h_per_million >= 0);
    CREATE TABLE background_responses (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      response_id text NOT NULL,
      user_id text NOT NULL,
      external_id text NOT NULL,
      model_id text NOT NULL,
      request_id text NOT NULL,
      held numeric NOT NULL CHECK (held >= 0),
      pricing jsonb NOT NULL,
      input_count integer NOT NULL DEFAULT 0,
      status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'settled', 'expired')),
      charged numeric,
      excess numeric,
      usage jsonb,
      attempts integer NOT NULL DEFAULT 0,
      next_check_at timestamptz NOT NULL DEFAULT now(),
      created_at timestamptz NOT NULL DEFAULT now(),
      settled_at timestamptz,
      PRIMARY KEY (project_id, response_id)
    );
    CREATE INDEX background_responses_due ON background_responses (next_check_at) WHERE status = 'pending';
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `DROP TABLE background_responses;
     ALTER TABLE models DROP COLUMN cache_write_per_million, DROP COLUMN cache_write_1h_per_million`,
  );
}
