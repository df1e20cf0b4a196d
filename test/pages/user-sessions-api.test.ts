import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyLinkToken } from '../../src/users/links.ts';
import {
  api,
  connectTo,
  eventsOfType,
  type SeededProject,
  seedProject,
  startRecordingServer,
  type TestServer,
} from '../helpers/server.ts';

let server: TestServer;
let project: SeededProject;

beforeAll(async () => {
  server = await startRecordingServer({ LINK_TOKEN_TTL_SECONDS: '600' });
  project = await seedProject(server.ctx, { name: 'Acme Chat' });
});
afterAll(() => server?.close());

const call = (method: string, path: string, body?: unknown) =>
  api(server, project.apiKey, method, path, body);
const tokenOf = (url: string) => url.slice(url.lastIndexOf('/') + 1);

const eventsOf = (type: string) => eventsOfType(server.ctx, project.projectId, type);

describe('user sessions', () => {
  it('GET /v1/user/balance shows an unknown user as disconnected with nothing, without creating it', async () => {
    const res = await call('GET', '/v1/user/balance?user=nobody');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      object: 'user.balance',
      user: 'nobody',
      connected: false,
      balance: '0.00',
      held: '0.00',
      available: '0.00',
      paid: '0.00',
      credits: '0.00',
      currency: 'usd',
    });
    const row = await server.ctx.db
      .selectFrom('end_users')
      .select('id')
      .where('external_id', '=', 'nobody')
      .executeTakeFirst();
    expect(row).toBeUndefined();
  });

  it('POST /v1/user/connect returns a signed connect link that expires', async () => {
    const before = Date.now();
    const res = await call('POST', '/v1/user/connect', { user: 'ann' });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ object: 'user.connect_link', user: 'ann', connected: false });
    expect(res.body.url).toMatch(new RegExp(`^${server.url}/connect/`));
    expect(res.body.message).toContain(res.body.url);
    const check = verifyLinkToken(server.ctx.sealer, tokenOf(res.body.url));
    expect(check).toMatchObject({ ok: true, payload: { k: 'connect', p: project.projectId, u: 'ann' } });
    const expires = Date.parse(res.body.expiresAt);
    expect(expires).toBeGreaterThanOrEqual(before + 599_000);
    expect(expires).toBeLessThanOrEqual(Date.now() + 601_000);
    // The connect endpoint only hands out the link; the user connects on the page.
    const state = await call('GET', '/v1/user/balance?user=ann');
    expect(state.body.connected).toBe(false);
  });

  it('POST /v1/user/disconnect disconnects once and emits user.disconnected; the balance stays', async () => {
    await connectTo(server, project, 'bob');
    await call('POST', '/v1/user/balance/deposit', { user: 'bob', amount: '7.00' });
    const connected = await call('GET', '/v1/user/balance?user=bob');
    expect(connected.body).toMatchObject({ connected: true, balance: '7.00' });
    const first = await call('POST', '/v1/user/disconnect', { user: 'bob' });
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ user: 'bob', connected: false, balance: '7.00', changed: true });
    const second = await call('POST', '/v1/user/disconnect', { user: 'bob' });
    expect(second.body).toMatchObject({ connected: false, changed: false });
    const events = await eventsOf('user.disconnected');
    expect(events.filter((e) => e.subject.externalId === 'bob')).toHaveLength(1);
    expect(events[0]).toMatchObject({
      data: { externalUserId: 'bob', walletUserId: expect.stringMatching(/^usr_/) },
      trigger: { source: 'api', actorType: 'api_key', actorId: project.apiKeyId },
    });
    const refused = await call('POST', '/v1/user/charge', { user: 'bob', amount: '1.00' });
    expect(refused.body).toMatchObject({ success: false, reason: 'not_connected' });
  });

  it('POST /v1/user/topup returns a top-up link, with or without a suggested amount', async () => {
    const withAmount = await call('POST', '/v1/user/topup', { user: 'ann', amount: '15' });
    expect(withAmount.status).toBe(200);
    expect(withAmount.body).toMatchObject({
      object: 'user.topup_link',
      user: 'ann',
      amount: '15.00',
      currency: 'usd',
      checkout: 'instructions',
    });
    expect(withAmount.body.url).toMatch(new RegExp(`^${server.url}/topup/`));
    const check = verifyLinkToken(server.ctx.sealer, tokenOf(withAmount.body.url));
    expect(check).toMatchObject({ ok: true, payload: { k: 'topup', u: 'ann', a: '15.00' } });
    const without = await call('POST', '/v1/user/topup', { user: 'ann' });
    expect(without.body.amount).toBeNull();
    const bad = await call('POST', '/v1/user/topup', { user: 'ann', amount: '0' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.param).toBe('amount');
  });

  it('GET /v1/user/activity lists ledger entries newest first with cursor pagination', async () => {
    await connectTo(server, project, 'cat');
    const made: string[] = [];
    for (let i = 1; i <= 5; i++) {
      const dep = await call('POST', '/v1/user/balance/deposit', { user: 'cat', amount: `${i}.00` });
      made.push(dep.body.id);
    }
    const charge = await call('POST', '/v1/user/charge', { user: 'cat', amount: '0.50', metadata: { a: 1 } });
    made.push(charge.body.charge.id);
    const expected = made.slice().reverse();

    const seen: string[] = [];
    let after: string | undefined;
    let pages = 0;
    for (;;) {
      const res = await call('GET', `/v1/user/activity?user=cat&limit=4${after ? `&after=${after}` : ''}`);
      expect(res.status).toBe(200);
      expect(res.body.object).toBe('list');
      seen.push(...res.body.data.map((e: any) => e.id));
      pages++;
      if (!res.body.has_more) break;
      after = res.body.last_id;
      expect(pages).toBeLessThan(5);
    }
    expect(pages).toBe(2);
    expect(seen).toEqual(expected);

    const newest = await call('GET', '/v1/user/activity?user=cat&limit=1');
    expect(newest.body.data[0]).toMatchObject({
      id: charge.body.charge.id,
      object: 'user.activity',
      user: 'cat',
      type: 'charge',
      amount: '-0.50',
      balance: '14.50',
      currency: 'usd',
      source: 'api',
      metadata: { a: 1 },
    });
    expect(newest.body.has_more).toBe(true);
    const empty = await call('GET', '/v1/user/activity?user=ghost');
    expect(empty.body).toMatchObject({ object: 'list', data: [], has_more: false });
  });

  it.each([
    ['GET', '/v1/user/balance', undefined, 'user'],
    ['GET', '/v1/user/balance?user=a&extra=1', undefined, 'extra'],
    ['GET', '/v1/user/activity?user=a&limit=0', undefined, 'limit'],
    ['GET', '/v1/user/activity?user=a&limit=101', undefined, 'limit'],
    ['GET', '/v1/user/activity?user=a&limit=ten', undefined, 'limit'],
    ['POST', '/v1/user/connect', {}, 'user'],
    ['POST', '/v1/user/connect', { user: 'a', returnUrl: 'x' }, 'returnUrl'],
    ['POST', '/v1/user/disconnect', { user: 7 }, 'user'],
    ['POST', '/v1/user/topup', { user: 'a', amount: '1.001' }, 'amount'],
  ])('%s %s rejects bad input with 400 naming %s', async (method, path, body, param) => {
    const res = await call(method, path, body);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param });
  });

  it('requires the API key', async () => {
    for (const [method, path] of [
      ['GET', '/v1/user/balance?user=a'],
      ['GET', '/v1/user/activity?user=a'],
      ['POST', '/v1/user/connect'],
      ['POST', '/v1/user/disconnect'],
      ['POST', '/v1/user/topup'],
    ] as const) {
      const res = await api(server, undefined, method, path, method === 'POST' ? { user: 'a' } : undefined);
      expect(res.status).toBe(401);
    }
  });
});
