import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { channels } from '../../src/bus/index.ts';
import { newTestId } from '../helpers/context.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

const twoPods = Boolean(process.env.TOLLGATE_TEST_REDIS && process.env.TOLLGATE_TEST_PG);

describe.skipIf(!twoPods)('API key revocation across pods (needs Postgres and Redis)', () => {
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

  it('serves warm keys from memory and drops them on every pod when revoked', async () => {
    const project = await seedProject(podA.ctx);
    // Warm pod B's cache.
    expect((await api(podB, project.apiKey, 'GET', '/v1/models')).status).toBe(200);

    // Once warm, pod B authenticates without the database: a key row deleted behind its back still works.
    const probe = await seedProject(podA.ctx);
    expect((await api(podB, probe.apiKey, 'GET', '/v1/models')).status).toBe(200);
    await podA.ctx.db
      .updateTable('api_keys')
      .set({ key_hash: 'moved' })
      .where('id', '=', probe.apiKeyId)
      .execute();
    expect((await api(podB, probe.apiKey, 'GET', '/v1/models')).status).toBe(200);

    // Revoke through pod A; pod B hears it on the bus.
    let heardIt: () => void = () => {};
    const heard = new Promise<void>((resolve) => {
      heardIt = resolve;
    });
    await podB.ctx.bus.subscribe(channels.keyRevoked, () => heardIt());
    await podA.ctx.keys.revoke(project.apiKeyId);
    await heard;
    expect((await api(podB, project.apiKey, 'GET', '/v1/models')).status).toBe(401);
    expect((await api(podA, project.apiKey, 'GET', '/v1/models')).status).toBe(401);
  });
});
