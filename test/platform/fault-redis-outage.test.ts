import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectOneEntryPerKey, startDepositLoad } from '../helpers/deposit-load.ts';
import { haveRedisServer, type PrivateRedis, startPrivateRedis } from '../helpers/private-services.ts';
import { api, seedProject, seedProjectWithUsers, startPods, type TestServer } from '../helpers/server.ts';

const pgUrl = process.env.TOLLGATE_TEST_PG;
const USERS = ['r1', 'r2'];

/**
 * Redis goes away under load and comes back — a private redis-server on a spare port, never the shared
 * one. Redis only carries cache invalidations and wake-ups: while it is gone, no request fails; once it
 * is back, messages between pods flow again by themselves (a key revoked on one pod is refused on the
 * other).
 */
describe.skipIf(!pgUrl || !haveRedisServer())('Redis outage under load (private redis-server)', () => {
  let redis: PrivateRedis | undefined;
  let podA: TestServer;
  let podB: TestServer;
  let projectId: string;
  let apiKey: string;

  beforeAll(async () => {
    redis = await startPrivateRedis();
    [podA, podB] = (await startPods({ REDIS_URL: redis.url }, 2)) as [TestServer, TestServer];
    ({ projectId, apiKey } = await seedProjectWithUsers(podA, USERS));
  }, 60_000);
  afterAll(async () => {
    await podB?.close();
    await podA?.close();
    await redis?.destroy();
  });

  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  it('serves every request while Redis is down, and the bus recovers when it is back', async () => {
    expect(podA.ctx.bus.kind).toBe('redis');
    const loadA = startDepositLoad(podA, apiKey, { users: USERS, workers: 3, keyPrefix: 'a' });
    const loadB = startDepositLoad(podB, apiKey, { users: USERS, workers: 3, keyPrefix: 'b' });
    await sleep(1000);
    await redis!.stop();
    const during = loadA.completed() + loadB.completed();
    await sleep(5000);
    expect(loadA.completed() + loadB.completed()).toBeGreaterThan(during);
    expect((await fetch(`${podA.url}/readyz`)).status).toBe(200);
    await redis!.start();
    await sleep(1000);
    const reports = [await loadA.stop(), await loadB.stop()];
    for (const report of reports) {
      expect(report.failures).toEqual([]);
      expect(Object.keys(report.statuses)).toEqual(['201']);
    }
    const perUser = new Map<string, number>();
    for (const report of reports)
      for (const [user, n] of report.perUser) perUser.set(user, (perUser.get(user) ?? 0) + n);
    await expectOneEntryPerKey(podA, projectId, { ...reports[0]!, perUser });

    // Back: a message published on one pod reaches the other (the subscriber reconnected and resubscribed).
    let heard = false;
    const unsubscribe = await podB.ctx.bus.subscribe('fault-test', () => {
      heard = true;
    });
    const end = Date.now() + 20_000;
    while (!heard && Date.now() < end) {
      await podA.ctx.bus.publish('fault-test', 'ping').catch(() => {});
      await sleep(200);
    }
    await unsubscribe();
    expect(heard).toBe(true);

    // And so does a key revocation: pod B, which had the key cached, refuses it.
    const probe = await seedProject(podA.ctx);
    expect((await api(podB, probe.apiKey, 'GET', '/v1/models')).status).toBe(200);
    await podA.ctx.keys.revoke(probe.apiKeyId);
    let status = 0;
    for (let i = 0; i < 50 && status !== 401; i++) {
      status = (await api(podB, probe.apiKey, 'GET', '/v1/models')).status;
      if (status !== 401) await sleep(100);
    }
    expect(status).toBe(401);
  }, 90_000);
});
