import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteExpiredSessions } from '../../src/admin/accounts.ts';
import { sha256Hex } from '../../src/core/crypto.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/** The admin API over HTTP (against Postgres when the suite has it): accounts, ownership, the flow to a paid chat. */
const ROOT = 'root-admin-token-0123456789abcdef';

let server: TestServer;
let mock: MockUpstream;

beforeAll(async () => {
  mock = await startMockUpstream();
  server = await startTestServer({ TOLLGATE_ADMIN_TOKEN: ROOT });
});
afterAll(async () => {
  await server?.close();
  await mock?.close();
});

const admin = (token: string | undefined, method: string, path: string, body?: unknown, headers = {}) =>
  api(server, token, method, `/admin/v1${path}`, body, headers);

/** Signs up (202: the same answer for a taken address), then signs in; the session token. */
async function signUp(email: string) {
  const credentials = { email, password: 'correct horse battery' };
  const res = await admin(undefined, 'POST', '/developers', credentials);
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  const session = await admin(undefined, 'POST', '/sessions', credentials);
  expect(session.status, JSON.stringify(session.body)).toBe(201);
  return session.body.session.token as string;
}

describe('admin API', () => {
  it('needs a bearer, and answers in the OpenAI error shape', async () => {
    const none = await admin(undefined, 'GET', '/projects');
    expect(none.status).toBe(401);
    expect(none.body.error).toMatchObject({ type: 'authentication_error', code: 'invalid_admin_token' });
    const wrong = await admin('tga_nope', 'GET', '/projects');
    expect(wrong.status).toBe(401);
    const projectKey = await seedProject(server.ctx);
    expect((await admin(projectKey.apiKey, 'GET', '/projects')).status).toBe(401);
    // and the project key API does not accept admin tokens
    expect((await api(server, ROOT, 'GET', '/v1/models')).status).toBe(401);
  });

  it('goes from sign-up to a paid chat: provider, key, price, deposit, chat, report', async () => {
    const token = await signUp('alice@example.com');
    const me = await admin(token, 'GET', '/me');
    expect(me.body).toMatchObject({ access: 'developer', developer: { email: 'alice@example.com' } });

    const created = await admin(token, 'POST', '/projects', { name: 'Alice app' });
    expect(created.status).toBe(201);
    const projectId = created.body.project.id as string;
    expect(created.body.project.ownerId).toBe(me.body.developer.id);

    // The provider is checked live: a wrong base URL is refused with what went wrong.
    const bad = await admin(token, 'PUT', `/projects/${projectId}/provider`, {
      baseUrl: 'http://127.0.0.1:1/v1',
      apiKey: 'sk-test',
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ code: 'provider_check_failed', param: 'baseUrl' });
    const connected = await admin(token, 'PUT', `/projects/${projectId}/provider`, {
      baseUrl: mock.baseUrl,
      apiKey: 'sk-test',
    });
    expect(connected.status, JSON.stringify(connected.body)).toBe(200);
    expect(connected.body).toMatchObject({ connected: true, keySet: true, models: ['mock-model'] });
    // sealed at rest
    const row = await server.ctx.db
      .selectFrom('projects')
      .select('upstream_key_sealed')
      .where('id', '=', projectId)
      .executeTakeFirstOrThrow();
    expect(row.upstream_key_sealed).not.toContain('sk-test');

    const key = await admin(token, 'POST', `/projects/${projectId}/keys`, { name: 'app' });
    expect(key.status).toBe(201);
    expect(key.body.key).toMatch(/^tg_/);
    const keys = await admin(token, 'GET', `/projects/${projectId}/keys`);
    expect(keys.body.object).toBe('list');
    expect(JSON.stringify(keys.body)).not.toContain(key.body.key);

    const price = await admin(token, 'PUT', `/projects/${projectId}/models/chat`, {
      upstreamModel: 'mock-model',
      pricing: { mode: 'per_request', perRequest: '0.25' },
    });
    expect(price.status, JSON.stringify(price.body)).toBe(200);
    expect(price.body.created).toEqual(['chat']);
    const badPrice = await admin(token, 'PUT', `/projects/${projectId}/models/chat`, {
      pricing: { mode: 'per_request', perRequest: '-1' },
    });
    expect(badPrice.status).toBe(400);
    expect(badPrice.body.error.param).toMatch(/pricing/);

    await admin(token, 'POST', `/projects/${projectId}/users/u1/connect`);
    const deposit = await admin(
      token,
      'POST',
      `/projects/${projectId}/users/u1/deposit`,
      { amount: '5' },
      { 'idempotency-key': 'dep-1' },
    );
    expect(deposit.status).toBe(201);
    expect(deposit.body).toMatchObject({ amount: '5.00', balance: '5.00' });
    const replay = await admin(
      token,
      'POST',
      `/projects/${projectId}/users/u1/deposit`,
      { amount: '5' },
      { 'idempotency-key': 'dep-1' },
    );
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.body.balance).toBe('5.00');
    const reused = await admin(
      token,
      'POST',
      `/projects/${projectId}/users/u1/deposit`,
      { amount: '6' },
      { 'idempotency-key': 'dep-1' },
    );
    expect(reused.status).toBe(409);
    // Counted once in the money metrics, as /v1 deposits are.
    const deposited = await server.ctx.metrics.deposited.get();
    expect(deposited.values.find((v) => v.labels.project === projectId)?.value).toBe(5);

    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: key.body.key, maxRetries: 0 });
    const reply = await client.chat.completions.create({
      model: 'chat',
      user: 'u1',
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(reply.choices[0]!.message.content).toContain('hello');

    const charge = await admin(token, 'POST', `/projects/${projectId}/users/u1/charge`, { amount: '1.00' });
    expect(charge.body).toMatchObject({ success: true });

    // settlement runs after the response: wait for the charge
    let balance = '';
    for (let i = 0; i < 50 && balance !== '3.75'; i++) {
      balance = (await admin(token, 'GET', `/projects/${projectId}/users/u1`)).body.balance;
      if (balance !== '3.75') await new Promise((r) => setTimeout(r, 100));
    }
    expect(balance).toBe('3.75');
    const activity = await admin(token, 'GET', `/projects/${projectId}/users/u1/activity?limit=10`);
    expect(activity.body.data.map((a: { type: string }) => a.type)).toEqual(
      expect.arrayContaining(['deposit', 'charge']),
    );
    const users = await admin(token, 'GET', `/projects/${projectId}/users?q=u`);
    expect(users.body.data).toEqual([
      expect.objectContaining({ user: 'u1', balance: '3.75', connected: true }),
    ]);

    const byModel = await admin(token, 'GET', `/projects/${projectId}/reports/usage?group=model`);
    expect(byModel.body.data).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ key: 'chat', requests: 1, revenue: '0.25' }),
        expect.objectContaining({ key: '(manual)', requests: 0, revenue: '1.00' }),
      ]),
    );
    const byDay = await admin(token, 'GET', `/projects/${projectId}/reports/usage?group=day`);
    expect(byDay.body.data).toHaveLength(1);
    expect(byDay.body.data[0]).toMatchObject({ requests: 1, revenue: '1.25' });
    expect(byDay.body.data[0].outputTokens).toBeGreaterThan(0);
    const byUser = await admin(token, 'GET', `/projects/${projectId}/reports/usage?group=user`);
    expect(byUser.body.data).toEqual([expect.objectContaining({ key: 'u1', revenue: '1.25' })]);

    // revocation reaches the key cache at once
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['chat']);
    const revoked = await admin(token, 'DELETE', `/projects/${projectId}/keys/${key.body.id}`);
    expect(revoked.body).toMatchObject({ revoked: true });
    expect((await api(server, key.body.key, 'GET', '/v1/models')).status).toBe(401);
  }, 60_000);

  it('shows a developer only their own projects', async () => {
    const alice = await signUp('owner-a@example.com');
    const bob = await signUp('owner-b@example.com');
    const a = (await admin(alice, 'POST', '/projects', { name: 'A' })).body.project.id;
    const b = (await admin(bob, 'POST', '/projects', { name: 'B' })).body.project.id;
    const listA = await admin(alice, 'GET', '/projects');
    expect(listA.body.data.map((p: { id: string }) => p.id)).toEqual([a]);
    for (const [method, path, body] of [
      ['GET', `/projects/${b}`],
      ['PATCH', `/projects/${b}`, { name: 'mine now' }],
      ['GET', `/projects/${b}/keys`],
      ['POST', `/projects/${b}/keys`, {}],
      ['GET', `/projects/${b}/models`],
      ['GET', `/projects/${b}/users`],
      ['POST', `/projects/${b}/users/x/deposit`, { amount: '1' }],
      ['GET', `/projects/${b}/reports/usage`],
      ['GET', `/projects/${b}/webhooks/logs`],
      ['PUT', `/projects/${b}/provider`, { baseUrl: 'echo://local' }],
    ] as const) {
      const res = await admin(alice, method, path, body);
      expect(res.status, `${method} ${path}`).toBe(404);
      expect(res.body.error.code).toBe('project_not_found');
    }
    // Bob's key of his project cannot be revoked through Alice's project either.
    const bobKey = (await admin(bob, 'POST', `/projects/${b}/keys`, {})).body;
    expect((await admin(alice, 'DELETE', `/projects/${a}/keys/${bobKey.id}`)).status).toBe(404);
    // Full access sees both.
    const all = await admin(ROOT, 'GET', '/projects?limit=100');
    expect(all.body.data.map((p: { id: string }) => p.id)).toEqual(expect.arrayContaining([a, b]));
    // Cursor lists
    const first = await admin(ROOT, 'GET', '/projects?limit=1');
    expect(first.body).toMatchObject({ object: 'list', has_more: true });
    const next = await admin(ROOT, 'GET', `/projects?limit=1&starting_after=${first.body.data[0].id}`);
    expect(next.body.data[0].id > first.body.data[0].id).toBe(true);
  });

  it('creates and revokes admin tokens; a developer token acts as its developer', async () => {
    const session = await signUp('tokens@example.com');
    const made = await admin(session, 'POST', '/admin-tokens', { name: 'ci' });
    expect(made.status).toBe(201);
    expect(made.body.token).toMatch(/^tga_/);
    const me = await admin(made.body.token, 'GET', '/me');
    expect(me.body).toMatchObject({ access: 'developer', actorType: 'admin_token' });
    const rootMade = await admin(ROOT, 'POST', '/admin-tokens', { name: 'ops' });
    expect((await admin(rootMade.body.token, 'GET', '/me')).body.access).toBe('full');
    // A developer cannot see or revoke the full-access token.
    expect((await admin(session, 'DELETE', `/admin-tokens/${rootMade.body.id}`)).status).toBe(404);
    expect((await admin(session, 'DELETE', `/admin-tokens/${made.body.id}`)).body.revokedAt).not.toBeNull();
    expect((await admin(made.body.token, 'GET', '/me')).status).toBe(401);
  });

  it('signs in and out, refuses wrong passwords alike, and rate-limits failed sign-ins', async () => {
    await signUp('signin@example.com');
    const dup = await admin(undefined, 'POST', '/developers', {
      email: 'SIGNIN@example.com',
      password: 'another long password',
    });
    // A taken address gets the same answer as a new one (sign-up does not tell who has an account).
    expect(dup.status).toBe(202);
    expect(dup.body).toEqual({
      object: 'sign_up',
      status: 'accepted',
      message: expect.stringContaining('sign in'),
    });
    const short = await admin(undefined, 'POST', '/developers', {
      email: 'x@example.com',
      password: 'short',
    });
    expect(short.status).toBe(400);
    expect(short.body.error.param).toBe('password');

    const ok = await admin(undefined, 'POST', '/sessions', {
      email: 'signin@example.com',
      password: 'correct horse battery',
    });
    expect(ok.status).toBe(201);
    const token = ok.body.session.token;
    expect((await admin(token, 'GET', '/me')).status).toBe(200);
    expect((await admin(token, 'DELETE', '/sessions/current')).status).toBe(200);
    expect((await admin(token, 'GET', '/me')).status).toBe(401);

    const unknown = await admin(undefined, 'POST', '/sessions', {
      email: 'nobody@example.com',
      password: 'whatever password',
    });
    expect(unknown.status).toBe(401);
    expect(unknown.body.error.code).toBe('invalid_credentials');
    // Every attempt counts (5 per e-mail and address): sign-up's sign-in, `ok`, then 3 wrong ones.
    for (let i = 0; i < 3; i++) {
      const wrong = await admin(undefined, 'POST', '/sessions', {
        email: 'signin@example.com',
        password: `wrong password ${i}`,
      });
      expect(wrong.status).toBe(401);
    }
    const limited = await admin(undefined, 'POST', '/sessions', {
      email: 'signin@example.com',
      password: 'correct horse battery',
    });
    expect(limited.status).toBe(429);
    expect(limited.body.error.type).toBe('rate_limit_error');
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0);

    // An expired session is refused, and the cleanup job deletes it.
    const other = await signUp('expiring@example.com');
    await server.ctx.db
      .updateTable('admin_sessions')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('token_hash', '=', sha256Hex(other))
      .execute();
    expect((await admin(other, 'GET', '/me')).status).toBe(401);
    const again = await signUp('expiring2@example.com');
    await server.ctx.db
      .updateTable('admin_sessions')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('token_hash', '=', sha256Hex(again))
      .execute();
    expect(await deleteExpiredSessions(server.ctx.db)).toBeGreaterThanOrEqual(1);
  }, 60_000);

  it('manages webhook subscriptions and resends deliveries', async () => {
    const token = await signUp('hooks@example.com');
    const projectId = (await admin(token, 'POST', '/projects', { name: 'Hooks' })).body.project.id;
    const sub = await admin(token, 'POST', `/projects/${projectId}/webhooks/subscriptions`, {
      url: 'http://127.0.0.1:9/hook',
      events: ['balance.*'],
    });
    expect(sub.status, JSON.stringify(sub.body)).toBe(201);
    expect(sub.body.subscription.secret).toBeTruthy();
    const subs = await admin(token, 'GET', `/projects/${projectId}/webhooks/subscriptions`);
    expect(subs.body.data).toHaveLength(1);
    expect(subs.body.data[0].secret).toBeUndefined();
    const logs = await admin(token, 'GET', `/projects/${projectId}/webhooks/logs`);
    expect(logs.body).toMatchObject({ object: 'list' });
    const missing = await admin(token, 'POST', `/projects/${projectId}/webhooks/logs/dlv_nope/resend`);
    expect(missing.status).toBe(404);
    const off = await admin(
      token,
      'DELETE',
      `/projects/${projectId}/webhooks/subscriptions/${sub.body.subscription.id}`,
    );
    expect(off.body.subscription.isActive).toBe(false);
  });
});
