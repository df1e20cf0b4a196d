import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AppContext, createContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { SubscriptionFilter } from '../../src/webhooks/filter.ts';
import {
  createSubscription,
  findSubscriptionByManager,
  getSubscription,
  setSubscriptionActive,
  updateSubscription,
} from '../../src/webhooks/subscriptions.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const good = { url: 'https://hooks.example.test/in', events: ['balance.*'] };

let server: TestServer;
let a: SeededProject;
let b: SeededProject;

beforeAll(async () => {
  // Private networks stay allowed for loopback traffic; the destination checks have their own tests.
  server = await startTestServer({ WEBHOOK_ALLOW_HTTP: 'false' });
  a = await seedProject(server.ctx);
  b = await seedProject(server.ctx);
});
afterAll(() => server.close());

const post = (key: string, body: unknown) => api(server, key, 'POST', '/v1/webhooks/subscriptions', body);

describe('POST /v1/webhooks/subscriptions', () => {
  it('creates an active subscription and returns its generated secret once', async () => {
    const res = await post(a.apiKey, {
      ...good,
      description: `  ${'d'.repeat(600)}  `,
      customHeaders: { 'X-Team': 'billing' },
    });
    expect(res.status).toBe(201);
    const sub = res.body.subscription;
    expect(sub).toMatchObject({
      paywallId: a.projectId,
      url: good.url,
      events: ['balance.*'],
      isActive: true,
      customHeaders: { 'X-Team': 'billing' },
      createdBy: `key:${a.apiKeyId}`,
      consecutiveFailures: 0,
      lastDeliveredAt: null,
      managedBy: null,
    });
    expect(sub.id).toMatch(/^whsub_/);
    expect(sub.description).toBe('d'.repeat(512));
    expect(sub.secret).toMatch(/^whsec_[A-Za-z0-9_-]{43}$/);
    expect(sub.secretSuffix).toBe(sub.secret.slice(-4));
    expect(new Date(sub.createdAt).toISOString()).toBe(sub.createdAt);

    const read = await api(server, a.apiKey, 'GET', `/v1/webhooks/subscriptions/${sub.id}`);
    expect(read.status).toBe(200);
    expect(read.body.subscription.secret).toBeUndefined();
    expect(read.body.subscription.secretSuffix).toBe(sub.secretSuffix);

    // Sealed at rest: the stored column is not the secret.
    const row = await server.ctx.db
      .selectFrom('webhook_subscriptions')
      .select('secret_sealed')
      .where('id', '=', sub.id)
      .executeTakeFirstOrThrow();
    expect(row.secret_sealed).not.toContain(sub.secret);
    expect(server.ctx.sealer.open(row.secret_sealed)).toBe(sub.secret);
  });

  it("keeps the caller's secret", async () => {
    const secret = 'my-pre-shared-secret-0123456789';
    const res = await post(a.apiKey, { ...good, secret });
    expect(res.status).toBe(201);
    expect(res.body.subscription.secret).toBe(secret);
    expect(res.body.subscription.secretSuffix).toBe('6789');
  });

  it.each([
    [{ events: ['*'] }, 'url'],
    [{ url: 'http://hooks.example.test/in', events: ['*'] }, 'url'],
    [{ url: 'ftp://hooks.example.test/in', events: ['*'] }, 'url'],
    [{ url: 'not a url', events: ['*'] }, 'url'],
    [{ url: 'https://user:pw@hooks.example.test/', events: ['*'] }, 'url'],
    [{ url: good.url }, 'events'],
    [{ url: good.url, events: [] }, 'events'],
    [{ url: good.url, events: ['*', 'balance.*'] }, 'events.0'],
    [{ url: good.url, events: ['balance.deposit.created', '*'] }, 'events.1'],
    [{ url: good.url, events: ['balance.*.created'] }, 'events.0'],
    [{ url: good.url, events: ['Balance.Deposit'] }, 'events.0'],
    [{ url: good.url, events: ['balance..x'] }, 'events.0'],
    [{ url: good.url, events: ['balance.*', 'balance.*'] }, 'events.1'],
    [{ url: good.url, events: 'balance.*' }, 'events'],
    [{ url: good.url, events: [7] }, 'events.0'],
    [{ ...good, description: 5 }, 'description'],
    [
      { ...good, customHeaders: Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`X-H${i}`, 'v'])) },
      'customHeaders',
    ],
    [{ ...good, customHeaders: { 'X-Service-Event': 'spoof' } }, 'customHeaders.X-Service-Event'],
    [{ ...good, customHeaders: { 'x-service-signature': 'spoof' } }, 'customHeaders.x-service-signature'],
    [{ ...good, customHeaders: { 'Content-Type': 'text/plain' } }, 'customHeaders.Content-Type'],
    [{ ...good, customHeaders: { Host: 'evil' } }, 'customHeaders.Host'],
    [{ ...good, customHeaders: { Connection: 'close' } }, 'customHeaders.Connection'],
    [{ ...good, customHeaders: { 'Transfer-Encoding': 'chunked' } }, 'customHeaders.Transfer-Encoding'],
    [{ ...good, customHeaders: { 'Bad Header': 'v' } }, 'customHeaders.Bad Header'],
    [{ ...good, customHeaders: { 'X-Ok': 'a\r\nX-Injected: 1' } }, 'customHeaders.X-Ok'],
    [{ ...good, customHeaders: { 'X-Num': 5 } }, 'customHeaders.X-Num'],
    [{ ...good, secret: 'short' }, 'secret'],
    [{ ...good, secret: 'has spaces in it but is long enough' }, 'secret'],
    [{ ...good, extra: true }, 'extra'],
  ])('refuses %j with 400 naming %s', async (body, param) => {
    const res = await post(a.apiKey, body);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param });
    expect(res.body.error.message).toBeTruthy();
  });

  it('accepts exact names, group patterns and a lone wildcard', async () => {
    for (const events of [['*'], ['balance.deposit.created', 'user.*'], ['updated']]) {
      expect((await post(a.apiKey, { ...good, events })).status).toBe(201);
    }
  });

  it('answers 401 without a valid key', async () => {
    expect((await post('tg_wrong', good)).status).toBe(401);
    expect((await api(server, undefined, 'GET', '/v1/webhooks/subscriptions')).status).toBe(401);
  });
});

describe('reading, listing and deactivating', () => {
  it("lists by status with cursor pagination and never shows another project's subscriptions", async () => {
    const mine: string[] = [];
    for (let i = 0; i < 3; i++) mine.push((await post(b.apiKey, good)).body.subscription.id);
    const off = await api(server, b.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${mine[0]}`);
    expect(off.status).toBe(200);
    expect(off.body.subscription).toMatchObject({ id: mine[0], isActive: false });

    const all = await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions');
    expect(all.body).toMatchObject({ object: 'list', has_more: false });
    expect(all.body.data.map((s: { id: string }) => s.id)).toEqual([...mine].reverse());

    const active = await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions?status=active');
    expect(active.body.data.map((s: { id: string }) => s.id)).toEqual([mine[2], mine[1]]);
    const inactive = await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions?status=inactive');
    expect(inactive.body.data.map((s: { id: string }) => s.id)).toEqual([mine[0]]);

    const page1 = await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions?limit=2');
    expect(page1.body.has_more).toBe(true);
    expect(page1.body.data).toHaveLength(2);
    const page2 = await api(
      server,
      b.apiKey,
      'GET',
      `/v1/webhooks/subscriptions?limit=2&starting_after=${page1.body.data[1].id}`,
    );
    expect(page2.body.has_more).toBe(false);
    expect(page2.body.data.map((s: { id: string }) => s.id)).toEqual([mine[0]]);

    expect(
      (await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions?status=on')).body.error.param,
    ).toBe('status');
    expect((await api(server, b.apiKey, 'GET', '/v1/webhooks/subscriptions?limit=0')).body.error.param).toBe(
      'limit',
    );

    // Project A sees none of B's, and B's ids are 404 for A.
    const listA = await api(server, a.apiKey, 'GET', '/v1/webhooks/subscriptions?limit=100');
    expect(listA.body.data.some((s: { id: string }) => mine.includes(s.id))).toBe(false);
    for (const method of ['GET', 'DELETE']) {
      const res = await api(server, a.apiKey, method, `/v1/webhooks/subscriptions/${mine[1]}`);
      expect(res.status).toBe(404);
      expect(res.body.error.type).toBe('not_found_error');
    }
    expect((await api(server, a.apiKey, 'POST', `/v1/webhooks/subscriptions/${mine[1]}/test`)).status).toBe(
      404,
    );
    // The DELETE by A changed nothing.
    expect((await getSubscription(server.ctx, b.projectId, mine[1]!)).isActive).toBe(true);
  });

  it('keeps the record after DELETE and re-enables it through the service', async () => {
    const id = (await post(a.apiKey, good)).body.subscription.id;
    await api(server, a.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${id}`);
    const again = await api(server, a.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${id}`);
    expect(again.status).toBe(200);
    expect(again.body.subscription.isActive).toBe(false);
    const on = await setSubscriptionActive(server.ctx, a.projectId, id, true);
    expect(on.isActive).toBe(true);
  });
});

describe('subscriptions managed by a resource', () => {
  it('lets only the owning resource change them; REST gets 409 naming it', async () => {
    const managedBy = 'WebhookSubscription team-a/billing-hook';
    const { subscription, secret } = await createSubscription(
      server.ctx,
      a.projectId,
      { ...good, secret: 'from-a-kubernetes-secret-0001' },
      { createdBy: 'k8s:team-a/billing-hook', managedBy },
    );
    expect(secret).toBe('from-a-kubernetes-secret-0001');
    expect(subscription).toMatchObject({ managedBy, createdBy: 'k8s:team-a/billing-hook' });
    expect((await findSubscriptionByManager(server.ctx, managedBy))?.id).toBe(subscription.id);
    expect(await findSubscriptionByManager(server.ctx, 'WebhookSubscription x/none')).toBeUndefined();

    const del = await api(server, a.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${subscription.id}`);
    expect(del.status).toBe(409);
    expect(del.body.error.code).toBe('managed_by_resource');
    expect(del.body.error.message).toContain('team-a/billing-hook');
    await expect(
      setSubscriptionActive(server.ctx, a.projectId, subscription.id, false),
    ).rejects.toMatchObject({
      status: 409,
      code: 'managed_by_resource',
    });

    const updated = await updateSubscription(
      server.ctx,
      a.projectId,
      subscription.id,
      {
        url: 'https://other.example.test/hook',
        events: ['*'],
        customHeaders: { 'X-A': '1' },
        isActive: false,
      },
      { managedBy },
    );
    expect(updated).toMatchObject({
      url: 'https://other.example.test/hook',
      events: ['*'],
      customHeaders: { 'X-A': '1' },
      isActive: false,
      description: null,
      secretSuffix: '0001',
    });
    const rotated = await updateSubscription(
      server.ctx,
      a.projectId,
      subscription.id,
      { ...good, secret: 'rotated-kubernetes-secret-0002', isActive: true },
      { managedBy },
    );
    expect(rotated).toMatchObject({ secretSuffix: '0002', isActive: true });
    await expect(
      updateSubscription(server.ctx, a.projectId, subscription.id, { ...good, events: [] }, { managedBy }),
    ).rejects.toMatchObject({ status: 400, param: 'events' });
    await expect(
      createSubscription(server.ctx, a.projectId, good, { createdBy: 'k8s:x', managedBy }),
    ).rejects.toMatchObject({ status: 409 });
    await expect(getSubscription(server.ctx, b.projectId, subscription.id)).rejects.toMatchObject({
      status: 404,
    });
  });
});

describe('the event filter', () => {
  it('writes events only for projects with a matching active subscription', async () => {
    const ctx = server.ctx;
    const c = await seedProject(ctx);
    const project = await getProject(ctx.db, c.projectId);
    const count = async () =>
      Number(
        (
          await ctx.db
            .selectFrom('events')
            .select((eb) => eb.fn.countAll().as('n'))
            .where('project_id', '=', c.projectId)
            .executeTakeFirstOrThrow()
        ).n,
      );
    const dep = () => ctx.billing.deposit({ project, externalId: 'u', amount: '1', source: 'test', trigger });

    const filter = ctx.events.filter;
    expect(filter).toBeInstanceOf(SubscriptionFilter);
    // The test context migrates after creating the context: load the snapshot now.
    await (filter as SubscriptionFilter).reloadAll();
    expect((filter as SubscriptionFilter).ready).toBe(true);

    await dep();
    expect(await count()).toBe(0);
    const user = (await post(c.apiKey, { ...good, events: ['user.*'] })).body.subscription;
    await dep();
    expect(await count()).toBe(0);
    const bal = (await post(c.apiKey, { ...good, events: ['balance.deposit.created'] })).body.subscription;
    await dep();
    expect(await count()).toBe(1);
    await api(server, c.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${bal.id}`);
    await dep();
    expect(await count()).toBe(1);
    expect(user.isActive).toBe(true);
  });
});

describe('the event filter across processes', () => {
  it('refreshes on every context when a subscription changes elsewhere', async () => {
    const schema = server.ctx.database.schema;
    const options = { ...(schema ? { schema } : {}), busPrefix: `filter-${Date.now()}:` };
    const one = await createContext(server.ctx.config, options);
    const two = await createContext(server.ctx.config, options);
    try {
      const c = await seedProject(one);
      const filterOf = (ctx: AppContext) => ctx.events.filter as SubscriptionFilter;
      await filterOf(two).reloadAll();
      expect(filterOf(two).wants(c.projectId, 'balance.deposit.created')).toBe(false);
      const { subscription } = await createSubscription(
        one,
        c.projectId,
        { ...good, events: ['balance.deposit.created'] },
        { createdBy: 'test' },
      );
      // `one` refreshed itself before returning; `two` hears it on the bus.
      expect(filterOf(one).wants(c.projectId, 'balance.deposit.created')).toBe(true);
      const until = async (want: boolean) => {
        const deadline = Date.now() + 5000;
        while (filterOf(two).wants(c.projectId, 'balance.deposit.created') !== want) {
          if (Date.now() > deadline) throw new Error('the other context never refreshed');
          await new Promise((r) => setTimeout(r, 10));
        }
      };
      await until(true);
      expect(filterOf(two).wants(c.projectId, 'user.connected')).toBe(false);
      await setSubscriptionActive(one, c.projectId, subscription.id, false);
      await until(false);
    } finally {
      await one.close();
      await two.close();
    }
  });
});
