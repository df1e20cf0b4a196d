import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import {
  api,
  connectTo,
  type SeededProject,
  seedProject,
  startRecordingServer,
  type TestServer,
} from '../helpers/server.ts';

let server: TestServer;
let usd: SeededProject;
let jpy: SeededProject;

beforeAll(async () => {
  server = await startRecordingServer();
  usd = await seedProject(server.ctx, { name: 'Acme Chat' });
  jpy = await seedProject(server.ctx, { name: 'Yen app', currency: 'jpy' });
});
afterAll(() => server?.close());

const post = (project: SeededProject, path: string, body: unknown, headers: Record<string, string> = {}) =>
  api(server, project.apiKey, 'POST', path, body, headers);

const connect = (project: SeededProject, user: string) => connectTo(server, project, user, 'x');

async function lastEvent(projectId: string, type: string) {
  const row = await server.ctx.db
    .selectFrom('events')
    .select('envelope')
    .where('project_id', '=', projectId)
    .where('type', '=', type)
    .orderBy('seq', 'desc')
    .executeTakeFirst();
  return row?.envelope as any;
}

/** The ledger invariant: the cached balance equals the sum of the user's entries. */
async function ledgerOf(projectId: string, user: string) {
  const db = server.ctx.db;
  const wallet = await db
    .selectFrom('end_users')
    .selectAll()
    .where('project_id', '=', projectId)
    .where('external_id', '=', user)
    .executeTakeFirstOrThrow();
  const entries = await db
    .selectFrom('ledger_entries')
    .selectAll()
    .where('user_id', '=', wallet.id)
    .execute();
  const sum = entries.reduce((acc, e) => acc.plus(e.amount), new Money(0));
  expect(sum.toFixed()).toBe(new Money(wallet.balance).toFixed());
  return { balance: new Money(wallet.balance).toFixed(2), entries };
}

describe('POST /v1/user/balance/deposit', () => {
  it('credits the wallet, returns the deposit and emits balance.deposit.created with the spec fields', async () => {
    const before = (await server.ctx.metrics.deposited.get()).values.find(
      (v) => v.labels.project === usd.projectId,
    );
    const res = await post(usd, '/v1/user/balance/deposit', {
      user: 'alice',
      amount: '10.5',
      metadata: { paymentRef: 'pi_123', nested: { ok: true } },
    });
    expect(res.status).toBe(201);
    expect(res.body).toEqual({
      id: expect.stringMatching(/^act_/),
      object: 'deposit',
      user: 'alice',
      amount: '10.50',
      currency: 'usd',
      balance: '10.50',
      metadata: { paymentRef: 'pi_123', nested: { ok: true } },
      createdAt: expect.any(String),
    });
    expect(Number.isNaN(Date.parse(res.body.createdAt))).toBe(false);
    const again = await post(usd, '/v1/user/balance/deposit', { user: 'alice', amount: '0.25' });
    expect(again.body.balance).toBe('10.75');

    const event = await lastEvent(usd.projectId, 'balance.deposit.created');
    expect(Object.keys(event.data).sort()).toEqual(
      [
        'activityId',
        'amount',
        'currency',
        'externalUserId',
        'ownerUserId',
        'paywallId',
        'source',
        'walletUserId',
      ].sort(),
    );
    expect(event.data).toMatchObject({
      paywallId: usd.projectId,
      externalUserId: 'alice',
      amount: '0.25',
      currency: 'usd',
      source: 'api',
      activityId: again.body.id,
    });
    expect(event.metadata).toEqual({});
    expect(event.trigger).toEqual({ source: 'api', actorType: 'api_key', actorId: usd.apiKeyId });
    const first = await server.ctx.db
      .selectFrom('events')
      .select('envelope')
      .where('type', '=', 'balance.deposit.created')
      .where('project_id', '=', usd.projectId)
      .orderBy('seq', 'asc')
      .executeTakeFirstOrThrow();
    expect((first.envelope as any).metadata).toEqual({ paymentRef: 'pi_123', nested: { ok: true } });

    const after = (await server.ctx.metrics.deposited.get()).values.find(
      (v) => v.labels.project === usd.projectId,
    );
    expect((after?.value ?? 0) - (before?.value ?? 0)).toBeCloseTo(10.75, 6);
    const { balance, entries } = await ledgerOf(usd.projectId, 'alice');
    expect(balance).toBe('10.75');
    expect(entries).toHaveLength(2);
  });

  it('uses the precision of the project currency', async () => {
    const ok = await post(jpy, '/v1/user/balance/deposit', { user: 'kenji', amount: '500' });
    expect(ok.status).toBe(201);
    expect(ok.body).toMatchObject({ amount: '500', balance: '500', currency: 'jpy' });
    const bad = await post(jpy, '/v1/user/balance/deposit', { user: 'kenji', amount: '500.5' });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ param: 'amount', type: 'invalid_request_error' });
    expect(bad.body.error.message).toContain('0 decimal places');
  });

  it.each([
    ['zero', { user: 'v', amount: '0' }, 'amount'],
    ['negative', { user: 'v', amount: '-1.00' }, 'amount'],
    ['too many decimals', { user: 'v', amount: '1.001' }, 'amount'],
    ['exponent', { user: 'v', amount: '1e3' }, 'amount'],
    ['not finite', { user: 'v', amount: 'Infinity' }, 'amount'],
    ['NaN', { user: 'v', amount: 'NaN' }, 'amount'],
    ['a JSON number', { user: 'v', amount: 10 }, 'amount'],
    ['above the maximum', { user: 'v', amount: '1000000000.01' }, 'amount'],
    ['missing amount', { user: 'v' }, 'amount'],
    ['missing user', { amount: '1.00' }, 'user'],
    ['empty user', { user: '', amount: '1.00' }, 'user'],
    ['user with control characters', { user: 'a\nb', amount: '1.00' }, 'user'],
    ['unknown field', { user: 'v', amount: '1.00', currency: 'usd' }, 'currency'],
    ['metadata not an object', { user: 'v', amount: '1.00', metadata: ['x'] }, 'metadata'],
    ['metadata too large', { user: 'v', amount: '1.00', metadata: { big: 'x'.repeat(9000) } }, 'metadata'],
  ])('rejects %s with 400 naming the field', async (_name, body, param) => {
    for (const path of ['/v1/user/balance/deposit', '/v1/user/charge']) {
      const res = await post(usd, path, body);
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param });
    }
    const wallet = await server.ctx.db
      .selectFrom('end_users')
      .select('id')
      .where('external_id', '=', 'v')
      .executeTakeFirst();
    expect(wallet).toBeUndefined();
  });

  it('rejects malformed JSON, a non-object body and a missing key', async () => {
    const bad = await post(usd, '/v1/user/balance/deposit', '{"user": "x",');
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('invalid_json');
    const arr = await post(usd, '/v1/user/balance/deposit', [1]);
    expect(arr.status).toBe(400);
    const noKey = await api(server, undefined, 'POST', '/v1/user/balance/deposit', {
      user: 'x',
      amount: '1',
    });
    expect(noKey.status).toBe(401);
    expect(noKey.body.error.code).toBe('invalid_api_key');
  });
});

describe('POST /v1/user/charge', () => {
  it('debits a connected wallet and emits balance.charge.created', async () => {
    await connect(usd, 'bob');
    await post(usd, '/v1/user/balance/deposit', { user: 'bob', amount: '5.00' });
    const res = await post(usd, '/v1/user/charge', {
      user: 'bob',
      amount: '1.25',
      metadata: { action: 'export' },
    });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      success: true,
      charge: {
        id: expect.stringMatching(/^act_/),
        object: 'charge',
        user: 'bob',
        amount: '1.25',
        currency: 'usd',
        balance: '3.75',
        metadata: { action: 'export' },
        createdAt: expect.any(String),
      },
      balance: '3.75',
      currency: 'usd',
    });
    const event = await lastEvent(usd.projectId, 'balance.charge.created');
    expect(event.data).toMatchObject({
      amount: '1.25',
      source: 'api',
      activityId: res.body.charge.id,
      externalUserId: 'bob',
      balance: '3.75',
    });
    expect(event.metadata).toEqual({ action: 'export' });
    const charged = (await server.ctx.metrics.charged.get()).values.find(
      (v) => v.labels.project === usd.projectId && v.labels.source === 'api',
    );
    expect(charged?.value).toBeCloseTo(1.25, 6);
  });

  it('refuses a user who is not connected with the connect link', async () => {
    const res = await post(usd, '/v1/user/charge', { user: 'stranger', amount: '1.00' });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      success: false,
      reason: 'not_connected',
      message: { role: 'assistant' },
      balance: '0.00',
      currency: 'usd',
    });
    expect(res.body.url).toMatch(new RegExp(`^${server.url}/connect/[\\w-]+\\.[\\w-]+$`));
    expect(res.body.message.content).toContain(res.body.url);
    expect(res.body.message.content).toContain('Acme Chat');
    const event = await lastEvent(usd.projectId, 'auth.connection.required');
    expect(event.data).toEqual({ model: null, operation: 'charge' });
    expect(event.subject).toMatchObject({
      type: 'user',
      externalId: 'stranger',
      id: expect.stringMatching(/^usr_/),
    });
    const page = await fetch(res.body.url);
    expect(page.status).toBe(200);
  });

  it('refuses a connected user who cannot pay with the top-up link', async () => {
    await connect(usd, 'carol');
    await post(usd, '/v1/user/balance/deposit', { user: 'carol', amount: '0.50' });
    const res = await post(usd, '/v1/user/charge', { user: 'carol', amount: '2.00' });
    expect(res.body).toMatchObject({
      success: false,
      reason: 'insufficient_balance',
      balance: '0.50',
      available: '0.50',
      amount: '2.00',
    });
    expect(res.body.url).toMatch(new RegExp(`^${server.url}/topup/`));
    expect(res.body.message.content).toContain(res.body.url);
    expect(res.body.message.content).toContain('2.00');
    const event = await lastEvent(usd.projectId, 'limits.balance.insufficient');
    expect(event.data).toMatchObject({ operation: 'charge', required: '2.00', available: '0.50' });
    const { balance, entries } = await ledgerOf(usd.projectId, 'carol');
    expect(balance).toBe('0.50');
    expect(entries).toHaveLength(1);
  });
});

describe('concurrency on one wallet', () => {
  it('loses no update when charges and deposits run in parallel', async () => {
    await connect(usd, 'dave');
    await post(usd, '/v1/user/balance/deposit', { user: 'dave', amount: '3.00' });
    const results = await Promise.all([
      ...Array.from({ length: 30 }, () => post(usd, '/v1/user/charge', { user: 'dave', amount: '0.10' })),
      ...Array.from({ length: 20 }, () =>
        post(usd, '/v1/user/balance/deposit', { user: 'dave', amount: '1.00' }),
      ),
    ]);
    expect(results.slice(0, 30).every((r) => r.status === 200 && r.body.success === true)).toBe(true);
    expect(results.slice(30).every((r) => r.status === 201)).toBe(true);
    const { balance, entries } = await ledgerOf(usd.projectId, 'dave');
    expect(balance).toBe('20.00');
    expect(entries).toHaveLength(51);
    const balances = await api(server, usd.apiKey, 'GET', '/v1/user/balance?user=dave');
    expect(balances.body.balance).toBe('20.00');
  });

  it('never overspends when parallel charges exceed the balance', async () => {
    await connect(usd, 'erin');
    await post(usd, '/v1/user/balance/deposit', { user: 'erin', amount: '1.00' });
    const results = await Promise.all(
      Array.from({ length: 25 }, () => post(usd, '/v1/user/charge', { user: 'erin', amount: '0.20' })),
    );
    expect(results.filter((r) => r.body.success === true)).toHaveLength(5);
    expect(results.filter((r) => r.body.reason === 'insufficient_balance')).toHaveLength(20);
    const { balance } = await ledgerOf(usd.projectId, 'erin');
    expect(balance).toBe('0.00');
  });
});
