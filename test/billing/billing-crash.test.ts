import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext, newTestId, realPostgres } from '../helpers/context.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * `kill -9` of a proxy in the middle of group-committed batches: every money movement a client saw
 * acknowledged (a whole chat response, a 201 deposit) is in the ledger, the wallets still add up, and
 * after the sweeper no hold is left open and nothing stays held.
 */
const here = dirname(fileURLToPath(import.meta.url));
const trigger = { source: 'test', actorType: 'test', actorId: 'crash' };
const USERS = 20;

let ctx: AppContext;
let mock: MockUpstream;
let child: ChildProcess | undefined;
let apiKey: string;
let projectId: string;
const shared = { id: newTestId() };

beforeAll(async () => {
  if (!realPostgres) return;
  mock = await startMockUpstream({ defaults: { chunkDelayMs: 2 } });
  ctx = await createTestContext({}, shared);
  const seeded = await seedProject(ctx, {
    upstreamUrl: mock.baseUrl,
    upstreamKey: 'sk-mock',
    models: [
      {
        id: 'm',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' },
      },
    ],
  });
  apiKey = seeded.apiKey;
  projectId = seeded.projectId;
  const project = await getProject(ctx.db, projectId);
  for (let i = 0; i < USERS; i++) {
    await connectUser(ctx.db, ctx.events, project, `u${i}`, trigger);
    await ctx.billing.deposit({ project, externalId: `u${i}`, amount: '1', source: 'test', trigger });
  }
});
afterAll(async () => {
  child?.kill('SIGKILL');
  await ctx?.close();
  await mock?.close();
});

async function startChild(escrow: boolean): Promise<string> {
  child = spawn(process.execPath, [join(here, '../helpers/proxy-child.ts')], {
    env: { ...process.env, TEST_ID: shared.id, TEST_ESCROW: escrow ? '1' : '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const [line] = (await once(createInterface({ input: child.stdout! }), 'line')) as [string];
  return line.trim();
}

describe.skipIf(!realPostgres)('a proxy killed with SIGKILL mid-batch', () => {
  it.each([
    ['a hold per request', false],
    ['escrow: slices of 16 requests, given back when idle', true],
  ])(
    'loses no acknowledged money and leaves no open hold after the sweeper (%s)',
    async (_name, escrow) => {
      const url = await startChild(escrow);
      const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
      const completed: string[] = [];
      const deposited: string[] = [];
      let killed = false;
      const killAfter = 60;
      const chat = async (i: number, stream: boolean) => {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers,
          body: JSON.stringify({
            model: 'm',
            user: `u${i % USERS}`,
            stream,
            messages: [{ role: 'user', content: 'hi' }],
          }),
        });
        const text = await res.text();
        if (res.status !== 200 || (stream && !text.includes('data: [DONE]'))) return;
        completed.push(res.headers.get('x-tollgate-request-id')!);
      };
      const deposit = async (i: number) => {
        const key = `crash-${i}`;
        const res = await fetch(`${url}/v1/user/balance/deposit`, {
          method: 'POST',
          headers: { ...headers, 'idempotency-key': key },
          body: JSON.stringify({ user: `u${i % USERS}`, amount: '0.01' }),
        });
        await res.text();
        if (res.status === 201) deposited.push(key);
      };
      // Requests keep coming in waves until the child is killed, with streams, whole responses and
      // deposits all in flight at the moment of the kill.
      const workers = Array.from({ length: 24 }, async (_, w) => {
        for (let n = 0; !killed && n < 400; n++) {
          const i = w * 400 + n;
          try {
            if (w % 4 === 3) await deposit(i);
            else await chat(i, w % 2 === 0);
          } catch {
            return; // the connection died with the child
          }
          if (!killed && completed.length >= killAfter) {
            killed = true;
            child!.kill('SIGKILL');
          }
        }
      });
      const exited = once(child!, 'exit');
      await Promise.all(workers);
      expect(killed).toBe(true);
      await exited;

      // Every response a client received whole was charged, every acknowledged deposit is in the ledger.
      const charged = await ctx.db
        .selectFrom('ledger_entries')
        .select(sql<string>`metadata->>'requestId'`.as('requestId'))
        .where('project_id', '=', projectId)
        .where('kind', '=', 'charge')
        .execute();
      const chargedIds = new Set(charged.map((c) => c.requestId));
      expect(completed.filter((id) => !chargedIds.has(id))).toEqual([]);
      const keys = await ctx.db
        .selectFrom('idempotency_keys')
        .select('key')
        .where('project_id', '=', projectId)
        .where('status_code', '=', 201)
        .execute();
      const keySet = new Set(keys.map((k) => k.key));
      expect(deposited.filter((k) => !keySet.has(k))).toEqual([]);

      // The holds of requests that died with the child are still open until the sweeper takes them
      // (their time to live is played out here by moving it).
      await ctx.db
        .updateTable('holds')
        .set({ expires_at: new Date(Date.now() - 1000) })
        .where('status', '=', 'open')
        .execute();
      while ((await ctx.billing.sweep()) > 0) {}
      const { rows } = await sql<{ open: string; held: boolean; bad: string }>`
      SELECT (SELECT count(*) FROM holds WHERE status = 'open') AS open,
             (SELECT coalesce(sum(held), 0) > 0 FROM end_users) AS held,
             (SELECT count(*) FROM end_users e
               WHERE e.balance <> (SELECT coalesce(sum(amount), 0) FROM ledger_entries l WHERE l.user_id = e.id)
             ) AS bad`.execute(ctx.db);
      expect(rows[0]).toEqual({ open: '0', held: false, bad: '0' });
    },
    60_000,
  );
});
