import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Anthropic providers (issue 24): a provider's `kind` says which API it speaks — `openai-compatible`
 * (Chat Completions, Responses, Embeddings under its base URL; every provider so far) or `anthropic`
 * (the Messages API at `{baseUrl}/v1/messages` with `x-api-key` and `anthropic-version`).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `ALTER TABLE providers ADD COLUMN kind text NOT NULL DEFAULT 'openai-compatible'
       CHECK (kind IN ('openai-compatible', 'anthropic'))`,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'ALTER TABLE providers DROP COLUMN kind');
}
