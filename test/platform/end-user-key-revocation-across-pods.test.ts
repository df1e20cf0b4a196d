import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { channels } from '../../src/bus/index.ts';
import { newTestId } from '../helpers/context.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

const twoPods = Boolean(process.env.TOLLGATE_TEST_REDIS && process.env.TOLLGATE_TEST_PG);

/** End-user keys are cached like project keys, and revoked on every pod as fast (the same bus message). */
describe.skipIf(!twoPods)('end-user key revocation across pods (needs Postgres and Redis)', () => {
  let podA: TestServer;
  let podB: TestServer;

  beforeAll(async () => {
    const shared = { id: newTestId() };
    podA = await startTestServer({}, shared);
    podB = await startTestServer({}, shared);
  });
  afterAll(async () => {
    await podB?.close();
    await podA?.close();
  });

  it('serves a warm end-user key from memory and drops it on every pod when revoked', async () => {
    const project = await seedProject(podA.ctx);
    const created = await api(podA, project.apiKey, 'POST', '/v1/user/keys', { user: 'ann', name: 'cli' });
    expect(created.status).toBe(201);
    const { id, key } = created.body;
    // Warm pod B's cache.
    expect((await api(podB, key, 'GET', '/v1/user/balance')).status).toBe(200);
    // Once warm, pod B authenticates without the database: the row moved behind its back still works.
    const probe = await api(podA, project.apiKey, 'POST', '/v1/user/keys', { user: 'bo', name: 'cli' });
    expect((await api(podB, probe.body.key, 'GET', '/v1/user/balance')).status).toBe(200);
    await podA.ctx.db
      .updateTable('end_user_keys')
      .set({ key_hash: 'moved' })
      .where('id', '=', probe.body.id)
      .execute();
    expect((await api(podB, probe.body.key, 'GET', '/v1/user/balance')).status).toBe(200);

    // Revoke through pod A's API; pod B hears it on the bus.
    let heardIt: () => void = () => {};
    const heard = new Promise<void>((resolve) => {
      heardIt = resolve;
    });
    await podB.ctx.bus.subscribe(channels.keyRevoked, () => heardIt());
    const revoked = await api(podA, project.apiKey, 'DELETE', `/v1/user/keys/${id}`);
    expect(revoked.body).toMatchObject({ revoked: true, propagated: true });
    await heard;
    expect((await api(podB, key, 'GET', '/v1/user/balance')).status).toBe(401);
    expect((await api(podA, key, 'GET', '/v1/user/balance')).status).toBe(401);
  });
});
