import { Readable } from 'node:stream';
import { sql, type Transaction } from 'kysely';
import type { Logger } from 'pino';
import type { BillingService } from '../billing/service.ts';
import { formatAmount, Money } from '../core/money.ts';
import type { Database } from '../db/index.ts';
import type { DB } from '../db/schema.ts';
import type { Exchange } from '../metering/api.ts';
import { type MeteredPricing, requestCost, type TokenUsage } from '../metering/cost.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { countText } from '../tokens/count.ts';
import type { PassthroughAnswer } from '../upstream/types.ts';
import { outputText, usageOfResponse } from './api.ts';

/**
 * Responses `background: true`: the provider accepts the request at once (`queued`) and works on it
 * afterwards; the output and its usage come through `GET /v1/responses/{id}`, which Tollgate passes
 * through unmetered. So that the work is charged, exactly:
 *
 * 1. When accepted (or when a background stream breaks off before its final event: the response goes
 *    on at the provider), the request's hold is settled at its full amount — the most the request can cost
 *    (its input estimate × margin plus the output bound it was sent with) — and the response is
 *    recorded in `background_responses` with what was charged and the model's prices at that moment.
 *    The money is taken (not left reserved): a reservation is a pod's memory, and a background
 *    response outlives requests, pods and restarts; a ledger charge does not.
 * 2. When the response is seen finished — a client's `GET /v1/responses/{id}` (or `POST …/cancel`)
 *    answering it `completed`, `incomplete`, `failed` or `cancelled`, or the poller below fetching it —
 *    its real cost is computed from the usage of that answer (Tollgate's count of its output when it
 *    has none; nothing when a failed or cancelled response reports no usage), and the difference
 *    `charged − cost` goes back to the wallet as a credit entry (kind `deposit`, source `responses`,
 *    metadata `backgroundResponseId`), in the same transaction that marks the record `settled`: once,
 *    whoever sees it first. A cost above the hold (a provider past the bound it was sent) is charged up
 *    to the hold; the rest is recorded as `excess`.
 * 3. The poller (every BACKGROUND_POLL_MS on each serving process; rows are claimed by conditional
 *    updates) fetches the responses no client fetched, backing off from 15 s to 10 min. A response never
 *    seen finished within BACKGROUND_GIVE_UP_MS, or that the provider no longer knows (404), is
 *    `expired`: its hold stays charged — Tollgate cannot know what the provider billed, and the hold
 *    was the most it could cost.
 */
export const BACKGROUND_POLL_MS = 30_000;
export const BACKGROUND_GIVE_UP_MS = 24 * 3600_000;
/** Largest retrieved Response Tollgate reads to settle from (the client still gets all of it). */
const MAX_READ_BYTES = 16 * 1024 * 1024;
const FINAL = new Set(['completed', 'incomplete', 'failed', 'cancelled']);
const TRIGGER = { source: 'background_response', actorType: 'system', actorId: 'tollgate' };

export interface BackgroundDeps {
  db: Database;
  billing: Pick<BillingService, 'transaction' | 'deposit'>;
  projects: { get(projectId: string): Promise<ProjectContext | undefined> };
  log: Logger;
  /** A GET of a provider path for the project (the router's passthrough). */
  retrieve(project: ProjectContext, path: string, signal: AbortSignal): Promise<PassthroughAnswer>;
}

/** How a background response was settled. */
export interface BackgroundSettle {
  responseId: string;
  held: string;
  charged: string;
  returned: string;
  excess: string;
}

type Row = DB['background_responses'] extends infer T ? { [K in keyof T]: unknown } : never;

export class BackgroundResponses {
  readonly #deps: BackgroundDeps;

  constructor(deps: BackgroundDeps) {
    this.#deps = deps;
  }

  /** Records a background response accepted and charged `charged` (its hold); per-token models only. */
  async open(x: Exchange, responseId: string, charged: string): Promise<void> {
    if (x.pricing.mode !== 'per_token') return; // per request: the price is the cost; subscription: free
    const p = x.pricing;
    const pricing = {
      mode: 'per_token',
      inputPerMillion: p.inputPerMillion.toFixed(),
      outputPerMillion: p.outputPerMillion.toFixed(),
      cachedInputPerMillion: p.cachedInputPerMillion.toFixed(),
      cacheWritePerMillion: p.cacheWritePerMillion.toFixed(),
      cacheWrite1hPerMillion: p.cacheWrite1hPerMillion.toFixed(),
    };
    await this.#deps.db
      .insertInto('background_responses')
      .values({
        project_id: x.project.id,
        response_id: responseId,
        user_id: x.userId,
        external_id: x.externalId,
        model_id: x.model.id,
        request_id: x.requestId,
        held: charged,
        pricing: JSON.stringify(pricing),
        input_count: x.inputCount ?? x.api.countInput(x.body),
        next_check_at: new Date(Date.now() + 15_000),
      })
      .onConflict((c) => c.columns(['project_id', 'response_id']).doNothing())
      .execute();
  }

  /**
   * Settles the project's background response `json` describes when it is finished and still pending
   * here: exactly once, the hold above its cost returned in the same transaction.
   */
  async settleFrom(projectId: string, json: Record<string, unknown>): Promise<BackgroundSettle | undefined> {
    if (typeof json.id !== 'string' || typeof json.status !== 'string' || !FINAL.has(json.status)) {
      return undefined;
    }
    const project = await this.#deps.projects.get(projectId);
    if (!project) return undefined;
    const responseId = json.id;
    return this.#deps.billing.transaction(async (tx) => {
      const row = await pendingRow(tx, projectId, responseId);
      if (!row) return undefined;
      const usage = costUsage(json, Number(row.input_count));
      const held = new Money(String(row.held));
      const cost = new Money(usage ? requestCost(pricingOf(row.pricing), usage) : '0');
      const charged = Money.min(cost, held);
      const settle: BackgroundSettle = {
        responseId,
        held: formatAmount(held),
        charged: formatAmount(charged),
        returned: formatAmount(held.minus(charged)),
        excess: formatAmount(cost.minus(charged)),
      };
      await tx
        .updateTable('background_responses')
        .set({
          status: 'settled',
          charged: settle.charged,
          excess: settle.excess,
          usage: usage ? JSON.stringify(usage) : null,
          settled_at: sql<Date>`now()`,
        })
        .where('project_id', '=', projectId)
        .where('response_id', '=', responseId)
        .execute();
      if (held.gt(charged)) {
        await this.#deps.billing.deposit(
          {
            project,
            externalId: String(row.external_id),
            amount: settle.returned,
            source: 'responses',
            trigger: TRIGGER,
            metadata: {
              backgroundResponseId: responseId,
              requestId: row.request_id,
              model: row.model_id,
              status: json.status,
              held: settle.held,
              charged: settle.charged,
              ...(usage
                ? {
                    inputTokens: usage.input,
                    cachedInputTokens: usage.cachedInput,
                    outputTokens: usage.output,
                    reasoningTokens: usage.reasoning,
                  }
                : {}),
            },
            description: `responses ${String(row.model_id)}: background response ${responseId} ${String(json.status)} at ${settle.charged}; the rest of its hold returned`,
          },
          tx,
        );
      }
      return settle;
    });
  }

  /**
   * A passthrough answer whose body, once relayed whole, is read for a finished background response to
   * settle (before the client's response ends, so what it reads next sees the money back).
   */
  observe(projectId: string, answer: PassthroughAnswer): PassthroughAnswer {
    if (answer.status !== 200 || !answer.contentType?.includes('json')) return answer;
    const body = answer.body;
    const settleFrom = (json: Record<string, unknown>) => this.settleFrom(projectId, json);
    const log = this.#deps.log;
    async function* tee(): AsyncGenerator<Uint8Array> {
      const chunks: Uint8Array[] = [];
      let size = 0;
      for await (const chunk of body) {
        size += chunk.byteLength;
        if (size <= MAX_READ_BYTES) chunks.push(chunk);
        yield chunk;
      }
      if (size > MAX_READ_BYTES) return;
      try {
        const json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
        if (json?.background === true) await settleFrom(json);
      } catch (err) {
        log.warn({ err, project: projectId }, 'could not settle a background response from its retrieval');
      }
    }
    return { ...answer, body: Readable.from(tee(), { objectMode: false }) };
  }

  /** Fetches the due background responses no client fetched; settles or expires them. Returns how many. */
  async poll(limit = 50, now = new Date()): Promise<number> {
    const due = await this.#deps.db
      .selectFrom('background_responses')
      .select(['project_id', 'response_id', 'attempts', 'created_at', 'next_check_at'])
      .where('status', '=', 'pending')
      .where('next_check_at', '<=', now)
      .orderBy('next_check_at')
      .limit(limit)
      .execute();
    let done = 0;
    for (const row of due) {
      // Claimed by moving its next check (another pod that read the same row claims nothing).
      const backoff = Math.min(15_000 * 2 ** Math.min(row.attempts, 10), 600_000);
      const claimed = await this.#deps.db
        .updateTable('background_responses')
        .set({ attempts: row.attempts + 1, next_check_at: new Date(now.getTime() + backoff) })
        .where('project_id', '=', row.project_id)
        .where('response_id', '=', row.response_id)
        .where('status', '=', 'pending')
        .where('attempts', '=', row.attempts)
        .executeTakeFirst();
      if (Number(claimed.numUpdatedRows) !== 1) continue;
      if (await this.#check(row.project_id, row.response_id, now.getTime() - row.created_at.getTime()))
        done++;
    }
    return done;
  }

  /** One due response: settled from the provider's answer, expired, or left for the next check. */
  async #check(projectId: string, responseId: string, age: number): Promise<boolean> {
    if (age > BACKGROUND_GIVE_UP_MS) return this.#expire(projectId, responseId);
    const project = await this.#deps.projects.get(projectId);
    if (!project) return this.#expire(projectId, responseId);
    try {
      const answer = await this.#deps.retrieve(
        project,
        `/responses/${encodeURIComponent(responseId)}`,
        AbortSignal.timeout(30_000),
      );
      const text = await readText(answer.body);
      if (answer.status === 404) return this.#expire(projectId, responseId);
      if (answer.status !== 200) return false;
      return (await this.settleFrom(projectId, JSON.parse(text) as Record<string, unknown>)) !== undefined;
    } catch (err) {
      this.#deps.log.warn(
        { err, project: projectId, responseId },
        'background response check failed; will retry',
      );
      return false;
    }
  }

  /** Gives up on a response: its hold stays charged. */
  async #expire(projectId: string, responseId: string): Promise<boolean> {
    const result = await this.#deps.db
      .updateTable('background_responses')
      .set({ status: 'expired', charged: sql`held`, settled_at: sql<Date>`now()` })
      .where('project_id', '=', projectId)
      .where('response_id', '=', responseId)
      .where('status', '=', 'pending')
      .executeTakeFirst();
    return Number(result.numUpdatedRows) === 1;
  }
}

/** The record of a pending background response, locked for this transaction. */
function pendingRow(tx: Transaction<DB>, projectId: string, responseId: string): Promise<Row | undefined> {
  return tx
    .selectFrom('background_responses')
    .selectAll()
    .where('project_id', '=', projectId)
    .where('response_id', '=', responseId)
    .where('status', '=', 'pending')
    .forUpdate()
    .executeTakeFirst() as Promise<Row | undefined>;
}

/**
 * The tokens a finished background response is charged: its usage (Tollgate's count of the input when
 * accepted, and of the output, for fields it lacks); none when it reports no usage and produced
 * nothing (a failed or cancelled response: nothing is charged).
 */
function costUsage(json: Record<string, unknown>, inputCount: number): TokenUsage | undefined {
  const usage = usageOfResponse(json);
  const produced = countText(outputText(json.output));
  if (!usage && (json.status === 'failed' || json.status === 'cancelled') && produced === 0) return undefined;
  const input = usage?.input ?? inputCount;
  return {
    input,
    cachedInput: Math.min(usage?.cachedInput ?? 0, input),
    output: usage?.output ?? produced,
    reasoning: usage?.reasoning ?? 0,
  };
}

/** The prices recorded with a background response. */
function pricingOf(value: unknown): MeteredPricing {
  const p = (typeof value === 'string' ? JSON.parse(value) : value) as Record<string, string>;
  return {
    mode: 'per_token',
    inputPerMillion: new Money(p.inputPerMillion ?? '0'),
    outputPerMillion: new Money(p.outputPerMillion ?? '0'),
    cachedInputPerMillion: new Money(p.cachedInputPerMillion ?? p.inputPerMillion ?? '0'),
    cacheWritePerMillion: new Money(p.cacheWritePerMillion ?? p.inputPerMillion ?? '0'),
    cacheWrite1hPerMillion: new Money(p.cacheWrite1hPerMillion ?? p.inputPerMillion ?? '0'),
  };
}

async function readText(body: AsyncIterable<Uint8Array>): Promise<string> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > MAX_READ_BYTES) throw new Error('the retrieved response is too large to settle from');
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}
