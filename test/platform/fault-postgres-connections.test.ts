import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newTestId } from '../helpers/context.ts';
import { expectOneEntryPerKey, startDepositLoad } from '../helpers/deposit-load.ts';
import { seedProjectWithUsers, startTestServer, type TestServer } from '../helpers/server.ts';

const pgUrl = process.env.TOLLGATE_TEST_PG;
const USERS = ['t1', 't2', 't3', 't4'];

/**
 * The proxy's Postgres connections are killed mid-load (`pg_terminate_backend`, as an administrator or
 * a failover does), many times. Only this test's own backends are terminated: its pool connects with an
 * application_name of its own, and the filter is on it (the shared Postgres serves other test runs).
 */
describe.skipIf(!pgUrl)('Postgres connections terminated under load', () => {
  const appName = `tgt_fault_${newTestId()}`;
  let server: TestServer;
  let admin: pg.Client;
  let projectId: string;
  let apiKey: string;

  beforeAll(async () => {
    const url = new URL(pgUrl!);
    url.searchParams.set('application_name', appName);
    server = await startTestServer({ DATABASE_URL: url.toString() });
    ({ projectId, apiKey } = await seedProjectWithUsers(server, USERS));
    admin = new pg.Client({ connectionString: pgUrl, application_name: `${appName}_admin` });
    await admin.connect();
  });
  afterAll(async () => {
    await admin?.end().catch(() => {});
    await server?.close();
  });

  /** Terminates this test's pool's backends; returns how many. */
  async function terminateOwnBackends(): Promise<number> {
    const { rows } = await admin.query<{ n: string }>(
      `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::text AS n
         FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`,
      [appName],
    );
    return Number(rows[0]?.n ?? 0);
  }

  it('keeps serving: no 500s, the process survives, and every key makes exactly one entry', async () => {
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    const load = startDepositLoad(server, apiKey, { users: USERS, workers: 8, pauseMs: 0 });
    const end = Date.now() + 5000;
    let killed = 0;
    while (Date.now() < end) {
      await sleep(250);
      killed += await terminateOwnBackends();
    }
    const report = await load.stop();
    expect(killed).toBeGreaterThan(5);
    expect(report.failures).toEqual([]);
    expect(report.unfinished).toBe(0);
    for (const status of Object.keys(report.statuses)) expect(['201', '503']).toContain(status);
    expect(report.statuses['201']).toBeGreaterThan(5);
    await expectOneEntryPerKey(server, projectId, report);
    // Ready again by itself (the first check may still meet a connection killed a moment ago).
    let ready = 0;
    for (let i = 0; i < 50 && ready !== 200; i++) {
      if (i) await sleep(200);
      ready = (await fetch(`${server.url}/readyz`)).status;
    }
    expect(ready).toBe(200);
  }, 120_000);
});
