import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Bounds of every admission (issue 35):
 * - a model's output and context limits (src/models/output-limits.ts; null: its family's published
 *   figures);
 * - `response_chains`: for each Responses request Tollgate settled, the provider's response id (and
 *   conversation id) with the tokens charged (input + output), so a request continuing that chain
 *   (`previous_response_id` / `conversation`) is held at the chain's size.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE models ADD COLUMN max_output_tokens integer
      CONSTRAINT models_max_output_tokens_positive CHECK (max_output_tokens > 0);
    ALTER TABLE models ADD COLUMN context_window integer
      CONSTRAINT models_context_window_positive CHECK (context_window > 0);
    CREATE TABLE response_chains (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      response_id text NOT NULL,
      conversation_id text,
      tokens bigint NOT NULL CHECK (tokens >= 0),
      created_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (project_id, response_id)
    );
    CREATE INDEX response_chains_conversation
      ON response_chains (project_id, conversation_id, created_at DESC)
      WHERE conversation_id IS NOT NULL;
    `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    DROP TABLE response_chains;
    ALTER TABLE models DROP COLUMN context_window;
    ALTER TABLE models DROP COLUMN max_output_tokens;
    `,
  );
}
