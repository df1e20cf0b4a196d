import type { Logger } from 'pino';
import type { Database } from '../db/index.ts';
import type { AnswerIds, ChainRef } from './api.ts';

/**
 * The known size of Responses chains. A request with `previous_response_id` or `conversation` makes
 * the provider read the earlier turns as input, which the request's body does not show: for each
 * Responses answer Tollgate settles, the provider's response id (and conversation id) is recorded with
 * the tokens charged for it (input + output) — the size of the chain up to and including that answer.
 * The next request's hold adds that size to its own input; a chain Tollgate has no record of (another
 * project's, made directly at the provider, or recorded after its turn was settled elsewhere) is held
 * at the model's context window. Written right after the settle, off the response path; read once at
 * admission (one primary-key or index lookup).
 */
export class ResponseChains {
  readonly #db: Database;
  readonly #log: Logger;

  constructor(ctx: { db: Database; log: Logger }) {
    this.#db = ctx.db;
    this.#log = ctx.log;
  }

  /** The chain's recorded size in tokens; undefined when Tollgate has no record of it. */
  async size(projectId: string, ref: ChainRef): Promise<number | undefined> {
    let size: number | undefined;
    if (ref.previousResponseId) {
      const row = await this.#db
        .selectFrom('response_chains')
        .select('tokens')
        .where('project_id', '=', projectId)
        .where('response_id', '=', ref.previousResponseId)
        .executeTakeFirst();
      if (!row) return undefined;
      size = Number(row.tokens);
    }
    if (ref.conversationId) {
      // the conversation's latest recorded answer: its input held every earlier turn
      const row = await this.#db
        .selectFrom('response_chains')
        .select('tokens')
        .where('project_id', '=', projectId)
        .where('conversation_id', '=', ref.conversationId)
        .orderBy('created_at', 'desc')
        .limit(1)
        .executeTakeFirst();
      if (!row) return undefined;
      size = Math.max(size ?? 0, Number(row.tokens));
    }
    return size;
  }

  /** Records an answer's size (the tokens charged for it); a failure is logged, never thrown. */
  async record(projectId: string, ids: AnswerIds, tokens: number): Promise<void> {
    try {
      await this.#db
        .insertInto('response_chains')
        .values({
          project_id: projectId,
          response_id: ids.responseId,
          conversation_id: ids.conversationId ?? null,
          tokens,
        })
        .onConflict((oc) =>
          oc.columns(['project_id', 'response_id']).doUpdateSet({
            tokens,
            conversation_id: ids.conversationId ?? null,
          }),
        )
        .execute();
    } catch (err) {
      this.#log.error({ err, projectId, responseId: ids.responseId }, 'recording a response chain failed');
    }
  }
}
