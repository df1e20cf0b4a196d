import { expect } from 'vitest';
import type { TestServer } from './server.ts';

/**
 * Deposit traffic for fault tests: `workers` loops, each posting deposits with a fresh Idempotency-Key
 * and, on 503, retrying the same key (as a client should) until it gets its 201. Everything a client
 * would notice is recorded; `stop` waits until every key has succeeded.
 */
export interface DepositLoad {
  /** Stops issuing new keys and waits until every key issued so far succeeded (or `timeoutMs`). */
  stop(timeoutMs?: number): Promise<LoadReport>;
  /** Keys completed so far. */
  completed(): number;
}

export interface LoadReport {
  /** Successful keys per user. */
  perUser: Map<string, number>;
  /** Responses by status, retries included. */
  statuses: Record<string, number>;
  /** Responses that are neither 201 nor a well-formed 503 (status, body), and network errors. */
  failures: string[];
  /** Keys that never succeeded before the deadline. */
  unfinished: number;
}

export const LOAD_AMOUNT = '1.00';

export function startDepositLoad(
  server: TestServer,
  apiKey: string,
  options: { users: string[]; workers?: number; pauseMs?: number; keyPrefix?: string },
): DepositLoad {
  const { users, workers = 6, pauseMs = 5, keyPrefix = 'load' } = options;
  const perUser = new Map<string, number>();
  const statuses: Record<string, number> = {};
  const failures: string[] = [];
  let stopping = false;
  let deadline = Number.POSITIVE_INFINITY;
  let done = 0;
  let unfinished = 0;
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  async function once(user: string, key: string): Promise<boolean> {
    let res: Response;
    try {
      res = await fetch(`${server.url}/v1/user/balance/deposit`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${apiKey}`,
          'content-type': 'application/json',
          'idempotency-key': key,
        },
        body: JSON.stringify({ user, amount: LOAD_AMOUNT }),
        signal: AbortSignal.timeout(30_000),
      });
    } catch (err) {
      failures.push(`network: ${(err as Error).message}`);
      return false;
    }
    const text = await res.text();
    statuses[res.status] = (statuses[res.status] ?? 0) + 1;
    if (res.status === 201) return true;
    let body: { error?: { type?: string; code?: string } } | undefined;
    try {
      body = JSON.parse(text);
    } catch {}
    const wellFormed503 =
      res.status === 503 &&
      body?.error?.type === 'service_unavailable' &&
      /^\d+$/.test(res.headers.get('retry-after') ?? '');
    if (!wellFormed503) failures.push(`${res.status} ${text.slice(0, 300)}`);
    return false;
  }

  const loops = Array.from({ length: workers }, async (_, w) => {
    for (let n = 0; !stopping; n++) {
      const user = users[(w + n) % users.length]!;
      const key = `${keyPrefix}-${w}-${n}`;
      let ok = await once(user, key);
      while (!ok) {
        if (Date.now() > deadline) {
          unfinished++;
          break;
        }
        await sleep(100);
        ok = await once(user, key);
      }
      if (ok) {
        perUser.set(user, (perUser.get(user) ?? 0) + 1);
        done++;
      }
      await sleep(pauseMs);
    }
  });

  return {
    completed: () => done,
    async stop(timeoutMs = 60_000) {
      stopping = true;
      deadline = Date.now() + timeoutMs;
      await Promise.all(loops);
      return { perUser, statuses, failures, unfinished };
    },
  };
}

/** Every successful key made exactly one deposit: entries and balance per user match the client's count. */
export async function expectOneEntryPerKey(server: TestServer, projectId: string, report: LoadReport) {
  for (const [user, count] of report.perUser) {
    const rows = await server.ctx.db
      .selectFrom('ledger_entries')
      .innerJoin('end_users', 'end_users.id', 'ledger_entries.user_id')
      .select(['ledger_entries.kind', 'end_users.balance'])
      .where('end_users.project_id', '=', projectId)
      .where('end_users.external_id', '=', user)
      .where('ledger_entries.kind', '=', 'deposit')
      .execute();
    expect(rows.length, `deposits of ${user}`).toBe(count);
    expect(Number(rows[0]?.balance ?? 0), `balance of ${user}`).toBe(count * Number(LOAD_AMOUNT));
  }
}
