import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectUser } from '../../src/users/service.ts';
import { expectOneEntryPerKey, LOAD_AMOUNT, startDepositLoad } from '../helpers/deposit-load.ts';
import {
  havePostgresBinaries,
  type PrivatePostgres,
  startPrivatePostgres,
} from '../helpers/private-services.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const USERS = ['u1', 'u2', 'u3'];

/**
 * Postgres stops and restarts under deposit load — a private Postgres this test starts itself (initdb
 * in a temporary directory, a spare port), never the shared one. The proxy stays up, answers 503 with
 * Retry-After while the database is away, says not ready, and recovers by itself; clients retrying
 * with their Idempotency-Key end with exactly one ledger entry per key.
 */
describe.skipIf(!havePostgresBinaries())('Postgres restart under load (private Postgres)', () => {
  let pgServer: PrivatePostgres | undefined;
  let server: TestServer;
  let projectId: string;
  let apiKey: string;

  beforeAll(async () => {
    pgServer = await startPrivatePostgres();
    server = await startTestServer({ DATABASE_URL: pgServer.url, REDIS_URL: '' });
    const seeded = await seedProject(server.ctx, {
      upstreamUrl: 'echo://local',
      models: [{ id: 'echo-per-request', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    projectId = seeded.projectId;
    apiKey = seeded.apiKey;
    const project = { id: projectId, owner_user_id: 'o' };
    for (const user of [...USERS, 'c1'])
      await connectUser(server.ctx.db, server.ctx.events, project as never, user, trigger);
  }, 120_000);

  const chat = () =>
    api(server, apiKey, 'POST', '/v1/chat/completions', {
      model: 'echo-per-request',
      user: 'c1',
      messages: [{ role: 'user', content: 'hello' }],
    });

  afterAll(async () => {
    await server?.close().catch(() => {});
    await pgServer?.destroy();
  }, 60_000);

  const readyz = async () =>
    (await fetch(`${server.url}/readyz`, { signal: AbortSignal.timeout(10_000) })).status;
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  async function until(what: string, check: () => Promise<boolean>, ms = 30_000) {
    const end = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await sleep(200);
    }
  }

  it('survives a stop (fast), an outage and a restart (immediate), with one entry per key', async () => {
    expect(server.ctx.database.kind).toBe('postgres');
    expect(await readyz()).toBe(200);
    await api(server, apiKey, 'POST', '/v1/user/balance/deposit', { user: 'c1', amount: LOAD_AMOUNT });
    expect((await chat()).status).toBe(200);
    const load = startDepositLoad(server, apiKey, { users: USERS });
    await until('deposits to flow', async () => load.completed() >= 10);

    // Down: fast shutdown ends every session, including ones inside a transaction.
    await pgServer!.stop('fast');
    const during = await api(server, apiKey, 'POST', '/v1/user/balance/deposit', {
      user: 'u1',
      amount: LOAD_AMOUNT,
    });
    expect(during.status).toBe(503);
    expect(during.body.error).toMatchObject({ type: 'service_unavailable', code: 'database_unavailable' });
    expect(Number(during.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(await readyz()).toBe(503);
    // A chat request (key and project cached in memory) fails at its hold: 503 too, nothing charged.
    const chatDuring = await chat();
    expect(chatDuring.status).toBe(503);
    expect(chatDuring.body.error.code).toBe('database_unavailable');
    expect(chatDuring.headers.get('retry-after')).toBe('2');
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    await sleep(1500);

    // Back: the pool reconnects by itself.
    await pgServer!.start();
    await until('/readyz to say ready', async () => (await readyz()) === 200);
    const before = load.completed();
    await until('deposits to flow again', async () => load.completed() >= before + 10);

    // A crash-like restart under load.
    await pgServer!.restart('immediate');
    await until('/readyz to say ready after the restart', async () => (await readyz()) === 200);
    const after = load.completed();
    await until('deposits to flow after the restart', async () => load.completed() >= after + 10);

    const report = await load.stop();
    expect(report.failures).toEqual([]);
    expect(report.unfinished).toBe(0);
    expect(report.statuses['503'] ?? 0).toBeGreaterThan(0);
    expect(Object.keys(report.statuses).sort()).toEqual(['201', '503']);
    await expectOneEntryPerKey(server, projectId, report);
  }, 180_000);
});
