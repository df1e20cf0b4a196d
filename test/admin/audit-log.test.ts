import { execFile } from 'node:child_process';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redact } from '../../src/audit/index.ts';
import { ECHO_UPSTREAM } from '../../src/projects/service.ts';
import { realPostgres, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';
import { api, signUpAndIn, startTestServer, type TestServer } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * The audit log (src/audit, table audit_log): every change to projects, prices, providers, keys,
 * limits, payment settings, webhook subscriptions and admin tokens, and every manual deposit, charge
 * and credit grant — through the admin API, the dashboard, /v1 and the CLI — appears exactly once, with
 * who, from which address (TOLLGATE_TRUSTED_PROXIES honoured) and before/after; no secret is ever
 * written; the database refuses UPDATE, DELETE and TRUNCATE; developers see only their own entries;
 * filters, paging and the CSV export.
 */
const ROOT = 'root-admin-token-0123456789abcdef';
const STRIPE_KEY = 'sk_test_standin_4242424242';
const PROVIDER_KEY = 'sk-proj-PROVIDERSECRET0123456789';
const ALICE_IP = '203.0.113.7';

let server: TestServer;
let stand: StripeStandIn;
let alice: string;
let bob: string;
let projectId: string;
let apiKey: string;
let apiKeyId: string;
let aliceId: string;
/** Every secret the test hands over or is handed: none may reach the table. */
const secrets: string[] = [STRIPE_KEY, PROVIDER_KEY, ROOT];

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [STRIPE_KEY] });
  server = await startTestServer({
    TOLLGATE_ADMIN_TOKEN: ROOT,
    TOLLGATE_TRUSTED_PROXIES: '127.0.0.1',
    STRIPE_API_URL: stand.url,
  });
  alice = await signUpAndIn(server, { email: 'alice@example.com', password: 'a long enough password' });
  bob = await signUpAndIn(server, { email: 'bob@example.com', password: 'a long enough password' });
  secrets.push(alice, bob);
});
afterAll(async () => {
  await server?.close();
  await stand?.close();
});

/** The admin API as Alice, from her address (a trusted proxy in front: X-Forwarded-For). */
const asAlice = (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
  api(server, alice, method, `/admin/v1${path}`, body, { 'x-forwarded-for': ALICE_IP, ...headers });

async function rows(action?: string) {
  let q = server.ctx.db.selectFrom('audit_log').selectAll().orderBy('id');
  if (action) q = q.where('action', '=', action);
  return q.execute();
}

/** The one entry of `action` for the target (fails when there is not exactly one). */
async function one(action: string, targetId?: string) {
  const found = (await rows(action)).filter((r) => targetId === undefined || r.target_id === targetId);
  expect(found, `${action} ${targetId ?? ''}: ${JSON.stringify(found)}`).toHaveLength(1);
  return found[0]!;
}

function expectAlice(
  row: { actor_type: string; actor_id: string; actor_email: string | null; ip: string | null; via: string },
  via = 'admin_api',
) {
  expect(row).toMatchObject({
    actor_type: 'developer',
    actor_id: aliceId,
    actor_email: 'alice@example.com',
    ip: ALICE_IP,
    via,
  });
}

describe('the audit log', () => {
  it('records project, provider, key, pricing and limit changes made through the admin API', async () => {
    const me = await asAlice('GET', '/me');
    aliceId = me.body.developer.id;
    const created = await asAlice('POST', '/projects', { name: 'Audited' });
    expect(created.status).toBe(201);
    projectId = created.body.project.id;
    apiKey = created.body.apiKey.key;
    apiKeyId = created.body.apiKey.id;
    secrets.push(apiKey);
    expectAlice(await one('project.create', projectId));
    expect((await one('api_key.create', apiKeyId)).after).toMatchObject({ name: 'default' });

    const patched = await asAlice('PATCH', `/projects/${projectId}`, {
      name: 'Audited 2',
      settings: { lowBalanceThreshold: '1.00' },
    });
    expect(patched.status).toBe(200);
    const update = await one('project.update', projectId);
    expectAlice(update);
    expect(update.before).toMatchObject({ name: 'Audited' });
    expect(update.after).toMatchObject({ name: 'Audited 2', settings: { lowBalanceThreshold: '1.00' } });

    const provider = await asAlice('PUT', `/projects/${projectId}/provider`, {
      baseUrl: ECHO_UPSTREAM,
      apiKey: PROVIDER_KEY,
    });
    expect(provider.status, JSON.stringify(provider.body)).toBe(200);
    const connect = await one('provider.connect', 'default');
    expectAlice(connect);
    expect(connect.before).toMatchObject({ keySet: false, baseUrl: null });
    expect(connect.after).toMatchObject({ keySet: true, baseUrl: ECHO_UPSTREAM });

    const file = {
      currency: 'usd',
      models: [
        { id: 'small', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.10' } },
        { id: 'large', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.50' } },
      ],
      limits: { spend: { daily: '5' } },
    };
    expect((await asAlice('PUT', `/projects/${projectId}/models`, file)).status).toBe(200);
    const applied = await one('pricing.apply');
    expectAlice(applied);
    expect(applied.before).toEqual([]);
    expect((applied.after as Array<{ id: string }>).map((m) => m.id)).toEqual(['large', 'small']);
    const limits = await one('limits.update');
    expect(limits.before).toBeNull();
    expect(limits.after).toEqual({ spend: { daily: '5' } });

    const put = await asAlice('PUT', `/projects/${projectId}/models/small`, {
      pricing: { mode: 'per_request', perRequest: '0.20' },
    });
    expect(put.status).toBe(200);
    const edit = await one('model.put', 'small');
    expect(edit.before).toMatchObject({ pricing: { perRequest: '0.1' } });
    expect(edit.after).toMatchObject({ pricing: { perRequest: '0.2' } });
    expect((await asAlice('DELETE', `/projects/${projectId}/models/large`)).status).toBe(200);
    const del = await one('model.delete', 'large');
    expect(del.before).toMatchObject({ id: 'large' });
    expect(del.after).toBeNull();
    // the edits kept the limits: no second limits entry
    expect(await rows('limits.update')).toHaveLength(1);

    const key = await asAlice('POST', `/projects/${projectId}/keys`, { name: 'ci' });
    expect(key.status).toBe(201);
    secrets.push(key.body.key);
    expectAlice(await one('api_key.create', key.body.id));
    expect((await asAlice('DELETE', `/projects/${projectId}/keys/${key.body.id}`)).status).toBe(200);
    // revoking twice is one revocation
    expect((await asAlice('DELETE', `/projects/${projectId}/keys/${key.body.id}`)).status).toBe(200);
    expect((await one('api_key.revoke', key.body.id)).after).toMatchObject({ revoked: true });
  });

  it('records webhook subscriptions, admin tokens and payment settings, never their secrets', async () => {
    const sub = await asAlice('POST', `/projects/${projectId}/webhooks/subscriptions`, {
      url: 'http://127.0.0.1:9/hook',
      events: ['balance.*'],
    });
    expect(sub.status, JSON.stringify(sub.body)).toBe(201);
    secrets.push(sub.body.subscription.secret);
    const subId = sub.body.subscription.id as string;
    expectAlice(await one('webhook_subscription.create', subId));
    expect((await asAlice('DELETE', `/projects/${projectId}/webhooks/subscriptions/${subId}`)).status).toBe(
      200,
    );
    expect((await one('webhook_subscription.disable', subId)).after).toEqual({ isActive: false });

    const token = await asAlice('POST', '/admin-tokens', { name: 'laptop' });
    expect(token.status).toBe(201);
    secrets.push(token.body.token);
    const tokenEntry = await one('admin_token.create', token.body.id);
    expectAlice(tokenEntry);
    expect(tokenEntry.project_id).toBeNull();
    // an action with the developer's admin token names the token, and the developer
    const viaToken = await api(server, token.body.token, 'PATCH', `/admin/v1/projects/${projectId}`, {
      settings: { lowBalanceThreshold: '2.00' },
    });
    expect(viaToken.status).toBe(200);
    const updates = await rows('project.update');
    expect(updates.at(-1)).toMatchObject({
      actor_type: 'admin_token',
      actor_id: token.body.id,
      developer_id: aliceId,
      actor_email: 'alice@example.com',
      ip: '127.0.0.1',
    });
    expect((await asAlice('DELETE', `/admin-tokens/${token.body.id}`)).status).toBe(200);
    await one('admin_token.revoke', token.body.id);

    const connected = await asAlice('PUT', `/projects/${projectId}/payments`, { stripeKey: STRIPE_KEY });
    expect(connected.status, JSON.stringify(connected.body)).toBe(200);
    const connect = await one('payments.connect', 'stripe');
    expectAlice(connect);
    expect(connect.after).toMatchObject({ connected: true, provider: 'stripe' });
    const patched = await asAlice('PATCH', `/projects/${projectId}/payments`, { minimum: '3' });
    expect(patched.status, JSON.stringify(patched.body)).toBe(200);
    expect((await one('payments.update', 'stripe')).after).toMatchObject({ settings: { minimum: '3.00' } });
    expect((await asAlice('DELETE', `/projects/${projectId}/payments`)).status).toBe(200);
    expect((await asAlice('DELETE', `/projects/${projectId}/payments`)).status).toBe(200);
    expect((await one('payments.disconnect', 'stripe')).after).toBeNull();
  });

  it('records each manual money move exactly once: admin API, /v1, dashboard', async () => {
    const headers = { 'idempotency-key': 'dep-1' };
    for (let i = 0; i < 2; i++) {
      const dep = await asAlice('POST', `/projects/${projectId}/users/u1/deposit`, { amount: '10' }, headers);
      expect(dep.status).toBe(201);
    }
    const deposit = await one('money.deposit', 'u1');
    expectAlice(deposit);
    expect(deposit.after).toMatchObject({ amount: '10.00' });

    expect((await asAlice('POST', `/projects/${projectId}/users/u1/connect`)).status).toBe(200);
    const charged = await asAlice('POST', `/projects/${projectId}/users/u1/charge`, { amount: '1.5' });
    expect(charged.body.success, JSON.stringify(charged.body)).toBe(true);
    expect((await one('money.charge', 'u1')).after).toMatchObject({ amount: '1.50' });
    // a refused charge moves no money and is not an entry
    expect((await asAlice('POST', `/projects/${projectId}/users/u1/charge`, { amount: '500' })).status).toBe(
      200,
    );
    expect(await rows('money.charge')).toHaveLength(1);

    const grant = await asAlice('POST', `/projects/${projectId}/users/u1/credits`, {
      amount: '2',
      reason: 'goodwill',
    });
    expect(grant.status, JSON.stringify(grant.body)).toBe(201);
    expect((await one('credit.grant', 'u1')).after).toMatchObject({ amount: '2.00', reason: 'goodwill' });

    // /v1 with the project's API key
    const v1 = await api(
      server,
      apiKey,
      'POST',
      '/v1/user/balance/deposit',
      { user: 'u2', amount: '4' },
      {
        'x-forwarded-for': '198.51.100.9',
      },
    );
    expect(v1.status, JSON.stringify(v1.body)).toBe(201);
    expect(await one('money.deposit', 'u2')).toMatchObject({
      actor_type: 'api_key',
      actor_id: apiKeyId,
      ip: '198.51.100.9',
      via: 'v1',
    });

    const fromKey = { 'x-forwarded-for': '198.51.100.9' };
    // (connecting a user from /v1 only makes a link; the admin API connects)
    expect((await asAlice('POST', `/projects/${projectId}/users/u2/connect`)).status).toBe(200);
    const v1charge = await api(
      server,
      apiKey,
      'POST',
      '/v1/user/charge',
      { user: 'u2', amount: '1' },
      fromKey,
    );
    expect(v1charge.body.success, JSON.stringify(v1charge.body)).toBe(true);
    expect(await one('money.charge', 'u2')).toMatchObject({ actor_type: 'api_key', ip: '198.51.100.9' });
    const v1grant = await api(
      server,
      apiKey,
      'POST',
      '/v1/user/credits',
      {
        user: 'u2',
        amount: '1',
        reason: 'promo',
      },
      fromKey,
    );
    expect(v1grant.status, JSON.stringify(v1grant.body)).toBe(201);
    expect(await one('credit.grant', 'u2')).toMatchObject({ actor_type: 'api_key', via: 'v1' });
    const caps = await api(
      server,
      apiKey,
      'POST',
      '/v1/user/spend-caps',
      { user: 'u2', daily: '3' },
      fromKey,
    );
    expect(caps.status, JSON.stringify(caps.body)).toBe(200);
    const cap = await one('limits.spend_caps', 'u2');
    expect(cap).toMatchObject({ actor_type: 'api_key', actor_id: apiKeyId, ip: '198.51.100.9' });
    expect(cap.before).toEqual({ daily: null, monthly: null });
    expect(cap.after).toMatchObject({ monthly: null });

    // the dashboard's deposit form
    const cookie = `tollgate_session=${alice}`;
    const page = await fetch(`${server.url}/dashboard/projects/${projectId}/users`, { headers: { cookie } });
    const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())![1]!;
    const posted = await fetch(`${server.url}/dashboard/projects/${projectId}/users/deposit`, {
      method: 'POST',
      headers: {
        cookie,
        'content-type': 'application/x-www-form-urlencoded',
        'x-forwarded-for': ALICE_IP,
      },
      body: new URLSearchParams({ csrf, user: 'u3', amount: '7', idem: 'form-1' }).toString(),
      redirect: 'manual',
    });
    expect(posted.status).toBe(303);
    expectAlice(await one('money.deposit', 'u3'), 'dashboard');
  });

  it('records the dashboard price, settings and key forms with the developer and address', async () => {
    const cookie = `tollgate_session=${alice}`;
    const path = `/dashboard/projects/${projectId}`;
    const page = await fetch(`${server.url}${path}`, { headers: { cookie } });
    const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())![1]!;
    const post = (p: string, form: Record<string, string>) =>
      fetch(`${server.url}${path}${p}`, {
        method: 'POST',
        headers: {
          cookie,
          'content-type': 'application/x-www-form-urlencoded',
          'x-forwarded-for': ALICE_IP,
        },
        body: new URLSearchParams({ csrf, ...form }).toString(),
        redirect: 'manual',
      });
    expect((await post('/pricing', { model: 'small', mode: 'per_request', perRequest: '0.30' })).status).toBe(
      303,
    );
    const puts = (await rows('model.put')).filter((r) => r.via === 'dashboard');
    expect(puts).toHaveLength(1);
    expectAlice(puts[0]!, 'dashboard');
    expect(puts[0]!.before).toMatchObject({ pricing: { perRequest: '0.2' } });
    expect(puts[0]!.after).toMatchObject({ pricing: { perRequest: '0.3' } });
    expect((await post('/settings', { name: 'Audited 3' })).status).toBe(303);
    const updates = (await rows('project.update')).filter((r) => r.via === 'dashboard');
    expect(updates).toHaveLength(1);
    expect(updates[0]!.after).toMatchObject({ name: 'Audited 3' });
    expect((await post('/keys', { name: 'from-the-dashboard' })).status).toBe(200);
    const keys = (await rows('api_key.create')).filter((r) => r.via === 'dashboard');
    expect(keys).toHaveLength(1);
    expectAlice(keys[0]!, 'dashboard');
  });

  it.skipIf(!realPostgres)('records the CLI on the database as `cli`', async () => {
    const schema = (await sql<{ s: string }>`select current_schema() as s`.execute(server.ctx.db)).rows[0]!.s;
    const env: Record<string, string | undefined> = {
      ...process.env,
      DATABASE_URL: server.ctx.config.DATABASE_URL,
      PGOPTIONS: `-c search_path=${schema}`,
      TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
      LOG_LEVEL: 'silent',
    };
    delete env.TOLLGATE_URL;
    delete env.TOLLGATE_ADMIN_TOKEN;
    const result = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(
        process.execPath,
        ['cmd/tollgate.ts', 'users', 'deposit', '--project', projectId, '--user', 'u4', '--amount', '3'],
        { env, timeout: 60_000 },
        (err, stdout, stderr) => resolve({ code: err ? Number(err.code ?? 1) : 0, stdout, stderr }),
      );
    });
    expect(result.code, result.stderr).toBe(0);
    expect(await one('money.deposit', 'u4')).toMatchObject({
      actor_type: 'cli',
      actor_id: 'cli',
      via: 'cli',
      ip: null,
    });
  });

  it('never writes a secret', async () => {
    const text = JSON.stringify(await rows());
    for (const secret of secrets) expect(text).not.toContain(secret);
    // (a Stripe key's hint, `sk_test_…4242`, is no secret)
    expect(text).not.toMatch(/whsec_|sk_test_[^…]|tga_|tgs_/);
  });

  it('is append-only: the database refuses UPDATE, DELETE and TRUNCATE', async () => {
    const db = server.ctx.db;
    const before = (await rows()).length;
    await expect(sql`UPDATE audit_log SET action = 'forged'`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`DELETE FROM audit_log`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`TRUNCATE audit_log`.execute(db)).rejects.toThrow(/append-only/);
    expect(await rows()).toHaveLength(before);
    expect(await rows('forged')).toHaveLength(0);
  });

  it('shows a developer only their own entries; full access sees all', async () => {
    const theirs = await api(server, bob, 'GET', `/admin/v1/projects/${projectId}/audit`);
    expect(theirs.status).toBe(404);
    const bobProject = await api(server, bob, 'POST', '/admin/v1/projects', { name: 'Bob' });
    const bobAll = await api(server, bob, 'GET', '/admin/v1/audit?limit=1000');
    expect(bobAll.status).toBe(200);
    const bobProjects = new Set(bobAll.body.data.map((e: { projectId: string }) => e.projectId));
    expect([...bobProjects]).toEqual([bobProject.body.project.id]);
    const aliceAll = await asAlice('GET', '/audit?limit=1000');
    const aliceActions = aliceAll.body.data.map((e: { action: string }) => e.action);
    expect(aliceActions).toContain('admin_token.create');
    expect(
      aliceAll.body.data.some((e: { projectId: string }) => e.projectId === bobProject.body.project.id),
    ).toBe(false);
    const root = await api(server, ROOT, 'GET', '/admin/v1/audit?limit=1000');
    expect(root.body.data.length).toBe((await rows()).length);
  });

  it('filters, pages and exports CSV', async () => {
    const base = `/projects/${projectId}/audit`;
    const deposits = await asAlice('GET', `${base}?action=money.deposit`);
    expect(deposits.body.data.map((e: { target: { id: string } }) => e.target.id).sort()).toEqual(
      realPostgres ? ['u1', 'u2', 'u3', 'u4'] : ['u1', 'u2', 'u3'],
    );
    const pricing = await asAlice('GET', `${base}?action=model.`);
    expect(pricing.body.data.map((e: { action: string }) => e.action)).toEqual([
      'model.put',
      'model.delete',
      'model.put',
    ]);
    const byKey = await asAlice('GET', `${base}?actor=${apiKeyId}`);
    expect(byKey.body.data.map((e: { action: string }) => e.action)).toEqual([
      'limits.spend_caps',
      'credit.grant',
      'money.charge',
      'money.deposit',
    ]);
    const byEmail = await asAlice('GET', `${base}?actor=alice@example.com&limit=1000`);
    expect(
      byEmail.body.data.every((e: { actor: { email: string } }) => e.actor.email === 'alice@example.com'),
    ).toBe(true);
    const future = await asAlice('GET', `${base}?since=${new Date(Date.now() + 3_600_000).toISOString()}`);
    expect(future.body.data).toEqual([]);
    const past = await asAlice('GET', `${base}?until=2000-01-01T00:00:00Z`);
    expect(past.body.data).toEqual([]);
    const bad = await asAlice('GET', `${base}?since=yesterday`);
    expect(bad.status).toBe(400);

    // paging: newest first, `starting_after` continues
    const all = (await asAlice('GET', `${base}?limit=1000`)).body.data as Array<{ id: string }>;
    const first = await asAlice('GET', `${base}?limit=3`);
    expect(first.body.has_more).toBe(true);
    const next = await asAlice('GET', `${base}?limit=3&starting_after=${first.body.data[2].id}`);
    expect([...first.body.data, ...next.body.data].map((e: { id: string }) => e.id)).toEqual(
      all.slice(0, 6).map((e) => e.id),
    );

    const csv = await fetch(`${server.url}/admin/v1${base}?format=csv&limit=1000`, {
      headers: { authorization: `Bearer ${alice}` },
    });
    expect(csv.headers.get('content-type')).toMatch(/^text\/csv/);
    const lines = (await csv.text()).trimEnd().split('\r\n');
    expect(lines[0]).toBe(
      'id,created_at,project_id,actor_type,actor_id,developer_id,actor_email,ip,via,action,target_type,target_id,before,after',
    );
    expect(lines).toHaveLength(all.length + 1);
  });

  it('the dashboard shows the log with filters, and exports it', async () => {
    const cookie = `tollgate_session=${alice}`;
    const path = `/dashboard/projects/${projectId}/audit`;
    const page = await fetch(`${server.url}${path}?action=money.deposit`, { headers: { cookie } });
    expect(page.status).toBe(200);
    const text = await page.text();
    expect(text).toContain('Audit log');
    expect(text).toContain('money.deposit');
    expect(text).not.toContain('pricing.apply');
    expect(text).toContain(ALICE_IP);
    const bad = await fetch(`${server.url}${path}?since=31-01-2026`, { headers: { cookie } });
    expect(bad.status).toBe(400);
    const csv = await fetch(`${server.url}${path}.csv?action=pricing.apply`, { headers: { cookie } });
    expect(csv.status).toBe(200);
    const lines = (await csv.text()).trimEnd().split('\r\n');
    expect(lines).toHaveLength(2);
    expect(lines[1]).toContain('pricing.apply');
    // another developer's project does not exist for Bob
    const bobs = await fetch(`${server.url}${path}`, { headers: { cookie: `tollgate_session=${bob}` } });
    expect(bobs.status).toBe(404);
  });
});

describe('secrets in free text', () => {
  it('are redacted by their shape wherever they sit in a string, the rest of the text kept', () => {
    const key = `tg_${'A1b2'.repeat(10)}`;
    const written = redact({
      description: 'Bearer tg_abcdefgh12345678 in the grant note',
      metadata: { note: `connect with sk_live_51Habcdefghijkl then ${key}`, count: 3 },
      message: 'the secret is whsec_0123456789abcdef, the test key rk_test_abcdefgh123',
      others: [
        'sk-proj-abcdefghijklmnop',
        'an end-user key tgu_abcdefghijkl',
        'tga_abcdefgh1234 and tgs_abcdefgh1234',
      ],
      plain: 'a task_id of risk_level_3 stays, and so does tg_ alone',
    });
    expect(written).toEqual({
      description: '[redacted] in the grant note',
      metadata: { note: 'connect with [redacted] then [redacted]', count: 3 },
      message: 'the secret is [redacted], the test key [redacted]',
      others: ['[redacted]', 'an end-user key [redacted]', '[redacted] and [redacted]'],
      plain: 'a task_id of risk_level_3 stays, and so does tg_ alone',
    });
  });
});
