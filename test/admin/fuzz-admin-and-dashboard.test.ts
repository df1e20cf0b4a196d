import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Issue 22, item 5: NUL characters and lone surrogates (and other malformed text) in the admin API's
 * names and settings and in every dashboard form field and path parameter get the same answer as on
 * `/v1`: 400, nothing written — never a 5xx. A systematic sweep: each field of each form and each path
 * parameter of each route, spoiled in turn with every bad value.
 */

const ROOT = 'fuzz-root-token-0123456789abcdef';
const PASSWORD = 'a long enough password';
let server: TestServer;
let token: string;
let cookie: string;
let csrf: string;
let anonCookie: string;
let anonCsrf: string;
let projectId: string;
let keyId: string;
let subscriptionId: string;
const failures: string[] = [];

beforeAll(async () => {
  server = await startTestServer({
    TOLLGATE_ADMIN_TOKEN: ROOT,
    SIGNIN_MAX_ATTEMPTS: '1000',
    SIGNIN_MAX_ATTEMPTS_PER_ADDRESS: '1000',
    SIGNUP_MAX_PER_HOUR: '1000',
    TOLLGATE_TEST_PAYMENTS: 'true',
  });
  const credentials = { email: 'fuzz@example.com', password: PASSWORD };
  expect([201, 202]).toContain(
    (await api(server, undefined, 'POST', '/admin/v1/developers', credentials)).status,
  );
  token = (await api(server, undefined, 'POST', '/admin/v1/sessions', credentials)).body.session.token;
  cookie = `tollgate_session=${token}`;
  const project = (await api(server, token, 'POST', '/admin/v1/projects', { name: 'Fuzz' })).body;
  projectId = project.project.id;
  keyId = project.apiKey.id;
  await api(server, token, 'PUT', `/admin/v1/projects/${projectId}/provider`, { baseUrl: 'echo://local' });
  await api(server, token, 'PUT', `/admin/v1/projects/${projectId}/models/m1`, {
    pricing: { mode: 'per_request', perRequest: '0.01' },
  });
  await api(server, token, 'POST', `/admin/v1/projects/${projectId}/users/u1/deposit`, { amount: '5' });
  const sub = await api(server, token, 'POST', `/admin/v1/projects/${projectId}/webhooks/subscriptions`, {
    url: 'http://127.0.0.1:9/hook',
    events: ['*'],
  });
  subscriptionId = sub.body.subscription.id;
  const page = await fetch(`${server.url}/dashboard/projects/${projectId}`, { headers: { cookie } });
  csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())![1]!;
  const signin = await fetch(`${server.url}/dashboard/signin`);
  anonCookie = signin.headers
    .getSetCookie()
    .find((c) => c.startsWith('tollgate_csrf='))!
    .split(';')[0]!;
  anonCsrf = /name="csrf" value="([^"]+)"/.exec(await signin.text())![1]!;
}, 60_000);
afterAll(() => server?.close());

/** What the admin API and the dashboard can write: names, settings, keys, models, tokens, money. */
async function snapshot(): Promise<string> {
  const { rows } = await sql<{ s: string }>`
    select concat_ws('|',
      (select string_agg(name || coalesce(settings::text, ''), ',' order by id) from projects),
      (select count(*) from api_keys), (select count(*) from admin_tokens),
      (select string_agg(id || coalesce(upstream_model, ''), ',' order by id) from models),
      (select count(*) from developers), (select count(*) from ledger_entries),
      (select count(*) from webhook_subscriptions)) as s`.execute(server.ctx.db);
  return rows[0]!.s;
}

const BAD_TEXT = ['a\u0000b', '\ud800', 'a\udfffb', '\u0000'];

describe('admin API names and settings', () => {
  it('refuses NUL and lone surrogates with 400 and writes nothing', async () => {
    const p = `/admin/v1/projects/${projectId}`;
    const before = await snapshot();
    for (const bad of BAD_TEXT) {
      const cases: Array<[string, string, unknown]> = [
        ['POST', '/admin/v1/admin-tokens', { name: bad }],
        ['POST', '/admin/v1/projects', { name: bad }],
        ['PATCH', p, { name: bad }],
        ['PATCH', p, { settings: { connectMessage: bad } }],
        ['PATCH', p, { settings: { topupMessage: bad } }],
        ['PATCH', p, { settings: { checkoutUrl: `https://shop.example.com/${bad}` } }],
        ['PATCH', p, { settings: { returnUrl: `https://shop.example.com/${bad}` } }],
        ['POST', `${p}/keys`, { name: bad }],
        ['POST', `${p}/users/u1/keys`, { name: bad }],
        ['POST', `${p}/users/u1/credits`, { amount: '1', reason: bad }],
        ['POST', `${p}/users/u1/credits`, { amount: '1', reason: 'promo', metadata: { note: bad } }],
        ['PATCH', p, { settings: { lowBalanceThreshold: `1${bad}` } }],
        ['PUT', `${p}/models/m2`, { upstreamModel: bad, pricing: { mode: 'per_request', perRequest: '1' } }],
        [
          'PUT',
          `${p}/models`,
          {
            currency: 'usd',
            models: [{ id: 'm3', upstreamModel: bad, pricing: { mode: 'per_request', perRequest: '1' } }],
          },
        ],
        ['POST', '/admin/v1/developers', { email: `x${bad}@example.com`, password: PASSWORD }],
        ['POST', '/admin/v1/developers', { email: 'y@example.com', password: `${PASSWORD}${bad}` }],
        ['POST', '/admin/v1/sessions', { email: `x${bad}@example.com`, password: PASSWORD }],
      ];
      for (const [method, path, body] of cases) {
        const res = await api(server, token, method, path, body);
        if (res.status !== 400)
          failures.push(
            `${method} ${path} ${JSON.stringify(body)} → ${res.status} ${JSON.stringify(res.body)}`,
          );
        else expect(res.body.error.type).toBe('invalid_request_error');
      }
    }
    expect(failures).toEqual([]);
    expect(await snapshot()).toBe(before);
  });
});

interface Form {
  path: string;
  fields: Record<string, string>;
  anonymous?: boolean;
}

function forms(): Form[] {
  const p = `/dashboard/projects/${projectId}`;
  return [
    { path: '/dashboard/signup', fields: { email: 'new@example.com', password: PASSWORD }, anonymous: true },
    {
      path: '/dashboard/signin',
      fields: { email: 'fuzz@example.com', password: 'wrong password!' },
      anonymous: true,
    },
    { path: '/dashboard/admin-tokens', fields: { name: 'cli' } },
    { path: '/dashboard/admin-tokens/atk_missing/revoke', fields: {} },
    {
      path: '/dashboard/start',
      fields: { name: 'S', baseUrl: 'echo://local', apiKey: 'k', currency: 'usd' },
    },
    { path: '/dashboard/start/echo', fields: { name: 'E', currency: 'usd' } },
    { path: `${p}/provider`, fields: { baseUrl: 'echo://local', apiKey: 'k' } },
    {
      path: `${p}/settings`,
      fields: {
        name: 'Fuzz',
        checkoutUrl: 'https://shop.example.com/',
        returnUrl: 'https://app.example.com/',
        connectMessage: 'Connect: {link}',
        topupMessage: 'Top up: {link}',
      },
    },
    { path: `${p}/keys`, fields: { name: 'k2' } },
    { path: `${p}/keys/${keyId}x/revoke`, fields: {} },
    {
      path: `${p}/pricing`,
      fields: { model: 'm9', upstreamModel: 'up', mode: 'per_request', perRequest: '0.1' },
    },
    { path: `${p}/pricing/m-missing/delete`, fields: {} },
    {
      path: `${p}/pricing/file`,
      fields: {
        file: 'currency: usd\nmodels:\n  - id: m1\n    pricing: { mode: per_request, perRequest: "0.01" }\n',
      },
    },
    { path: `${p}/users/deposit`, fields: { user: 'u2', amount: '1', idem: 'i1', description: 'gift' } },
    { path: `${p}/users/charge`, fields: { user: 'u1', amount: '1', idem: 'i2', description: 'fee' } },
    {
      path: `${p}/users/credits`,
      fields: {
        user: 'u1',
        amount: '1',
        reason: 'promo',
        priority: '1',
        expiresAt: '2099-01-31',
        idem: 'i3',
      },
    },
    { path: `${p}/users/u1/connect`, fields: {} },
    { path: `${p}/users/u1/disconnect`, fields: {} },
    { path: `${p}/webhooks`, fields: { url: 'http://127.0.0.1:9/h', events: '*', description: 'd' } },
    { path: `${p}/webhooks/${subscriptionId}x/deactivate`, fields: {} },
    { path: `${p}/webhooks/deliveries/dlv_missing/resend`, fields: {} },
    {
      path: `${p}/payments`,
      fields: { stripeKey: 'sk_test_x', presets: '5, 10', minimum: '5', maximum: '50' },
    },
    { path: `${p}/payments/test`, fields: {} },
    { path: `${p}/payments/disconnect`, fields: {} },
    { path: `${p}/payments/pay_missing/refund`, fields: {} },
  ];
}

/** Raw form bodies (percent-encoding by hand, so invalid UTF-8 and lone surrogates go as they are). */
const BAD_FORM_VALUES = ['a%00b', '%00', '%ED%A0%80', 'a%EDb', '%', '%ZZ', 'x'.repeat(5000), '%C0%80'];

async function postForm(form: Form, body: string) {
  const res = await fetch(server.url + form.path, {
    method: 'POST',
    headers: {
      cookie: form.anonymous ? anonCookie : cookie,
      'content-type': 'application/x-www-form-urlencoded',
    },
    body,
    redirect: 'manual',
  });
  await res.text();
  return res.status;
}

const encode = (fields: Record<string, string>) =>
  Object.entries(fields)
    .map(([k, v]) => `${k}=${encodeURIComponent(v)}`)
    .join('&');

describe('dashboard forms and path parameters', () => {
  it('answer every spoiled form field below 500, and 400 with nothing written for NUL in stored text', async () => {
    const local: string[] = [];
    for (const form of forms()) {
      const token = form.anonymous ? anonCsrf : csrf;
      // The unspoiled form passes the CSRF check (so the sweep reaches validation and the handlers).
      const valid = await postForm(form, `csrf=${encodeURIComponent(token)}&${encode(form.fields)}`);
      expect(valid, form.path).not.toBe(403);
      expect(valid, form.path).toBeLessThan(500);
      const names = [...Object.keys(form.fields), 'extra'];
      for (const name of names) {
        for (const bad of BAD_FORM_VALUES) {
          const others = Object.fromEntries(Object.entries(form.fields).filter(([k]) => k !== name));
          const body = `csrf=${encodeURIComponent(token)}&${encode(others)}&${name}=${bad}`;
          const status = await postForm(form, body);
          if (status >= 500) local.push(`POST ${form.path} ${name}=${bad.slice(0, 20)} → ${status}`);
        }
        // The same field twice (an array after parsing).
        const status = await postForm(
          form,
          `csrf=${encodeURIComponent(token)}&${encode(form.fields)}&${name}=a&${name}=b`,
        );
        if (status >= 500) local.push(`POST ${form.path} ${name} twice → ${status}`);
      }
    }
    expect(local).toEqual([]);

    // NUL in text that would be stored: 400, nothing written.
    const p = `/dashboard/projects/${projectId}`;
    const before = await snapshot();
    const stored: Array<[string, Record<string, string>]> = [
      ['/dashboard/admin-tokens', { name: 'a\u0000b' }],
      [`${p}/keys`, { name: 'a\u0000b' }],
      [`${p}/settings`, { name: 'a\u0000b' }],
      [`${p}/settings`, { name: 'Fuzz', connectMessage: 'a\u0000b {link}' }],
      [`${p}/settings`, { name: 'Fuzz', checkoutUrl: 'https://shop.example.com/\u0000' }],
      [`${p}/pricing`, { model: 'm9', upstreamModel: 'a\u0000b', mode: 'per_request', perRequest: '1' }],
      [`${p}/users/deposit`, { user: 'u1', amount: '1', description: 'a\u0000b' }],
      [`${p}/users/charge`, { user: 'u1', amount: '1', description: 'a\u0000b' }],
      [`${p}/webhooks`, { url: 'http://127.0.0.1:9/h', events: '*', description: 'a\u0000b' }],
    ];
    for (const [path, fields] of stored) {
      const status = await postForm({ path, fields }, `csrf=${encodeURIComponent(csrf)}&${encode(fields)}`);
      expect(status, `${path} ${JSON.stringify(fields)}`).toBe(400);
    }
    expect(await snapshot()).toBe(before);
  }, 120_000);

  it('answer every spoiled path parameter below 500', async () => {
    const BAD_PARAMS = ['%00', 'a%00b', '%ED%A0%80', '%', '%ZZ', 'x'.repeat(300), '..', '%2e%2e'];
    const local: string[] = [];
    for (const bad of BAD_PARAMS) {
      const p = `/dashboard/projects/${projectId}`;
      const gets = [
        `/dashboard/projects/${bad}`,
        `/dashboard/projects/${bad}/pricing`,
        `/dashboard/projects/${bad}/users`,
        `/dashboard/projects/${bad}/webhooks`,
        `/dashboard/projects/${bad}/payments`,
        `/dashboard/projects/${bad}/audit`,
        `/dashboard/projects/${bad}/reconciliation.csv`,
        `${p}/payments?user=${bad}`,
        `${p}/audit?action=${bad}`,
        `${p}/users/${bad}`,
        `${p}/users?q=${bad}`,
        `/dashboard/signin?error=${bad}`,
        `/dashboard?done=${bad}`,
      ];
      for (const path of gets) {
        const res = await fetch(server.url + path, { headers: { cookie }, redirect: 'manual' });
        await res.text();
        if (res.status >= 500) local.push(`GET ${path.slice(0, 80)} → ${res.status}`);
      }
      const posts = [
        `/dashboard/admin-tokens/${bad}/revoke`,
        `/dashboard/projects/${bad}/keys`,
        `${p}/keys/${bad}/revoke`,
        `${p}/pricing/${bad}/delete`,
        `${p}/users/${bad}/connect`,
        `${p}/webhooks/${bad}/deactivate`,
        `${p}/webhooks/deliveries/${bad}/resend`,
        `${p}/payments/${bad}/refund`,
      ];
      for (const path of posts) {
        const status = await postForm({ path, fields: {} }, `csrf=${encodeURIComponent(csrf)}&name=x`);
        if (status >= 500) local.push(`POST ${path.slice(0, 80)} → ${status}`);
      }
    }
    expect(local).toEqual([]);
  }, 120_000);
});
