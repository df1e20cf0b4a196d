import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HOP_HEADER, hopId } from '../../src/net/hop.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { depositFor, seedProject, startTestServer, type TestServer, testTrigger } from '../helpers/server.ts';

/**
 * A provider URL pointing at Tollgate itself, with the project's own key (possible with
 * TOLLGATE_ALLOW_PRIVATE_PROVIDERS, or through the public hostname): the request Tollgate sends carries
 * its hop header, comes back, and is refused (508) before anything is counted — one chat is one failed
 * request, not a charge per loop until the balance is gone.
 */
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer({ TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true' });
});
afterAll(() => server.close());

describe('a provider that is this Tollgate', () => {
  it('is one refused request, nothing charged', async () => {
    const seeded = await seedProject(server.ctx, {
      upstreamUrl: `${server.url}/v1`,
      upstreamKey: 'placeholder',
      models: [{ id: 'loop', upstreamModel: 'loop', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    // the provider key is the project's own key: the loop would be paid by the same wallet
    const { upsertProvider } = await import('../../src/routing/providers.ts');
    await upsertProvider(server.ctx.db, server.ctx.sealer, seeded.projectId, {
      name: 'default',
      baseUrl: `${server.url}/v1`,
      key: seeded.apiKey,
    });
    await server.ctx.projects.changed(seeded.projectId);
    const project = await getProject(server.ctx.db, seeded.projectId);
    await connectUser(server.ctx.db, server.ctx.events, project, 'loopy', testTrigger);
    await depositFor(server.ctx, project, 'loopy', '1.00');
    const client = new OpenAI({
      baseURL: `${server.url}/v1`,
      apiKey: seeded.apiKey,
      maxRetries: 0,
    });
    const failed = await client.chat.completions
      // (`user` in the body: it goes upstream as sent, so the loop would charge the same wallet)
      .create({ model: 'loop', user: 'loopy', messages: [{ role: 'user', content: 'Hi' }] })
      .catch((err: { status: number }) => err);
    expect((failed as { status: number }).status).toBeGreaterThanOrEqual(500);
    await server.app.metering.idle();
    const charges = await server.ctx.db
      .selectFrom('ledger_entries')
      .select('amount')
      .where('project_id', '=', seeded.projectId)
      .where('kind', '=', 'charge')
      .execute();
    expect(charges).toEqual([]);
  });

  it('refuses its own hop id with 508, and lets another deployment’s through', async () => {
    const own = hopId(server.ctx.sealer);
    const res = await fetch(`${server.url}/v1/models`, { headers: { [HOP_HEADER]: own } });
    expect(res.status).toBe(508);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('loop_detected');
    const other = await fetch(`${server.url}/v1/models`, { headers: { [HOP_HEADER]: 'another-deployment' } });
    expect(other.status).toBe(401); // on to authentication, as any request
    await other.arrayBuffer();
  });
});
