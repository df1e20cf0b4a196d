import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, signUpAndIn, startTestServer, type TestServer } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * Every dashboard form, refused, comes back in place: a 400 on the form's own page with what was typed
 * (never a secret), the problem beside its field (aria-invalid, aria-describedby, autofocus on the first),
 * a fresh CSRF token that works; errors that are not about the form keep the error page.
 */
const KEY = 'sk_test_standin_forms_4242';
let stand: StripeStandIn;
let server: TestServer;
let cookie: string;
let projectId: string;
let path: string;

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [KEY] });
  server = await startTestServer({ STRIPE_API_URL: stand.url });
  const session = await signUpAndIn(server, {
    email: 'forms@example.com',
    password: 'a long enough password',
  });
  cookie = `tollgate_session=${session}`;
  const created = await api(server, session, 'POST', '/admin/v1/projects', { name: 'Forms' });
  projectId = created.body.project.id;
  path = `/dashboard/projects/${projectId}`;
  await api(server, session, 'POST', `/admin/v1/projects/${projectId}/users/alice/deposit`, { amount: '1' });
}, 60_000);

afterAll(async () => {
  await server?.close();
  await stand?.close();
});

async function get(p: string) {
  const res = await fetch(server.url + p, { headers: { cookie }, redirect: 'manual' });
  return { status: res.status, text: await res.text() };
}

/** Posts a form with a CSRF token from `from` (a page of the dashboard). */
async function post(p: string, form: Record<string, string>, from = path) {
  const csrf = /name="csrf" value="([^"]+)"/.exec((await get(from)).text)![1]!;
  return postWith(csrf, p, form);
}
async function postWith(csrf: string, p: string, form: Record<string, string>) {
  const res = await fetch(server.url + p, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf, ...form }).toString(),
    redirect: 'manual',
  });
  return { status: res.status, location: res.headers.get('location'), text: await res.text() };
}

/** The opening tag of the element with this id. */
function tag(text: string, id: string): string {
  const found = new RegExp(`<(?:input|select|textarea)[^>]*\\bid="${id}"[^>]*>`).exec(text);
  expect(found, `no field #${id}`).not.toBeNull();
  return found![0];
}

/** The field `id` is marked invalid, described by its error (with `message`), and has the focus. */
function expectInvalid(text: string, id: string, message: RegExp | string, help?: string) {
  const field = tag(text, id);
  expect(field).toContain('aria-invalid="true"');
  expect(field).toContain(`aria-describedby="${help ? `${help} ` : ''}${id}-error"`);
  expect(field).toContain('autofocus');
  expect(text.match(/ autofocus/g)?.length ?? 0).toBe(1);
  const error = new RegExp(`<p class="field-error" id="${id}-error">([^<]*)</p>`).exec(text);
  expect(error, `no error beside #${id}`).not.toBeNull();
  if (typeof message === 'string') expect(error![1]).toBe(message);
  else expect(error![1]).toMatch(message);
  // the error sits right after its field
  expect(text.indexOf(`id="${id}-error"`) - text.indexOf(field)).toBeLessThan(field.length + 200);
}

const value = (text: string, id: string) => /\bvalue="([^"]*)"/.exec(tag(text, id))?.[1];

describe('refused dashboard forms come back in place', () => {
  it('deposit, charge and credit: on the page they came from, the values kept', async () => {
    // From the users page: a zod refusal (empty amount), then the service's (not a positive amount).
    const empty = await post(`${path}/users/deposit`, { user: 'alice', amount: ' ' }, `${path}/users`);
    expect(empty.status).toBe(400);
    expect(empty.text).toContain('<h1>End users</h1>');
    expectInvalid(empty.text, 'depositAmount', 'Amount is required.');
    expect(value(empty.text, 'depositUser')).toBe('alice');
    const negative = await post(`${path}/users/deposit`, { user: 'bob', amount: '-5' }, `${path}/users`);
    expect(negative.status).toBe(400);
    expectInvalid(negative.text, 'depositAmount', /^Amount must be /);
    expect(value(negative.text, 'depositUser')).toBe('bob');
    expect(value(negative.text, 'depositAmount')).toBe('-5');
    expect(negative.text).not.toContain('This did not work');
    // The token of the page shown again works: the corrected form goes through.
    const csrf = /name="csrf" value="([^"]+)"/.exec(negative.text)![1]!;
    const fixed = await postWith(csrf, `${path}/users/deposit`, { user: 'bob', amount: '5' });
    expect(fixed.location).toBe(`${path}/users/bob?done=deposited`);

    // From the user's page (a hidden user): back on the user's page.
    const userPath = `${path}/users/alice`;
    const there = await post(
      `${path}/users/deposit`,
      { user: 'alice', from: 'user', amount: 'lots' },
      userPath,
    );
    expect(there.status).toBe(400);
    expect(there.text).toContain('<h1>User alice</h1>');
    expectInvalid(there.text, 'depositAmount', /^Amount /);
    expect(value(there.text, 'depositAmount')).toBe('lots');
    // the other forms of the page are as they were
    expect(value(there.text, 'chargeAmount')).toBe('');
    expect(tag(there.text, 'chargeAmount')).not.toContain('aria-invalid');

    const charge = await post(
      `${path}/users/charge`,
      { user: 'alice', amount: '1e3', description: 'a fee' },
      userPath,
    );
    expect(charge.status).toBe(400);
    expectInvalid(charge.text, 'chargeAmount', /^Amount /);
    expect(value(charge.text, 'chargeDescription')).toBe('a fee');
    // More than the balance: not about one field, said at the top of the charge form.
    const broke = await post(`${path}/users/charge`, { user: 'alice', amount: '500' }, userPath);
    expect(broke.status).toBe(400);
    expect(broke.text).toMatch(
      /action="[^"]*\/users\/charge">.*<p class="error" role="alert" id="charge-alert" tabindex="-1" autofocus>Not charged: /s,
    );
    expect(value(broke.text, 'chargeAmount')).toBe('500');

    const credit = await post(
      `${path}/users/credits`,
      { user: 'alice', amount: '1.25', reason: 'Free Money', priority: '3', expiresAt: '2099-01-31' },
      userPath,
    );
    expect(credit.status).toBe(400);
    expectInvalid(credit.text, 'grantReason', /^Reason /);
    expect([value(credit.text, 'grantAmount'), value(credit.text, 'grantReason')]).toEqual([
      '1.25',
      'Free Money',
    ]);
    expect([value(credit.text, 'grantPriority'), value(credit.text, 'grantExpires')]).toEqual([
      '3',
      '2099-01-31',
    ]);
    const past = await post(
      `${path}/users/credits`,
      { user: 'alice', amount: '1', reason: 'promo', expiresAt: '2001-01-01' },
      userPath,
    );
    expect(past.status).toBe(400);
    expectInvalid(past.text, 'grantExpires', /^Expires /);
    // Nothing was written by any of them.
    expect((await get(userPath)).text).toMatch(/<strong id="balance">1\.00<\/strong>/);
  });

  it('project settings, provider (the key never sent back) and a new API key', async () => {
    const settings = await post(`${path}/settings`, {
      name: 'Forms renamed',
      returnUrl: 'javascript:alert(1)',
      connectMessage: 'Connect: {link}',
    });
    expect(settings.status).toBe(400);
    expectInvalid(settings.text, 'returnUrl', /^Return URL /);
    expect(value(settings.text, 'projectName')).toBe('Forms renamed');
    expect(value(settings.text, 'connectMessage')).toBe('Connect: {link}');
    expect(value(settings.text, 'returnUrl')).toBe('javascript:alert(1)');
    expect((await get(path)).text).toContain('<h1>Forms</h1>');

    const secret = 'sk-never-shown-again-123';
    const provider = await post(`${path}/provider`, {
      kind: 'anthropic',
      baseUrl: 'ftp://models.example',
      apiKey: secret,
    });
    expect(provider.status).toBe(400);
    expectInvalid(provider.text, 'baseUrl', /^Provider base URL /);
    expect(value(provider.text, 'baseUrl')).toBe('ftp://models.example');
    expect(provider.text).toMatch(/<option value="anthropic" selected>/);
    expect(provider.text).not.toContain(secret);
    expect(tag(provider.text, 'apiKey')).toContain('aria-describedby="apiKey-note"');
    expect(provider.text).toContain(
      '<p class="muted" id="apiKey-note">Type it again: a secret is never sent back.</p>',
    );

    const key = await post(`${path}/keys`, { name: '   ' });
    expect(key.status).toBe(400);
    expectInvalid(key.text, 'keyName', 'Key name must not be empty.');
  });

  it('a price (its mode kept) and the pricing file', async () => {
    const price = await post(
      `${path}/pricing`,
      { model: 'sonnet', mode: 'per_token', inputPerMillion: '3', outputPerMillion: '15', holdMargin: '0.8' },
      `${path}/pricing`,
    );
    expect(price.status).toBe(400);
    expectInvalid(price.text, 'holdMargin', /^Hold margin .*at least 1/, 'hold-help');
    expect(price.text).toMatch(/<option value="per_token" selected>/);
    expect(price.text).not.toMatch(/<option value="per_request" selected>/);
    expect(tag(price.text, 'mode')).toContain('aria-describedby="mode-help"');
    expect([
      value(price.text, 'model'),
      value(price.text, 'inputPerMillion'),
      value(price.text, 'outputPerMillion'),
    ]).toEqual(['sonnet', '3', '15']);
    const noModel = await post(
      `${path}/pricing`,
      { model: '', mode: 'per_request', perRequest: '0.01' },
      `${path}/pricing`,
    );
    expect(noModel.status).toBe(400);
    expectInvalid(noModel.text, 'model', /^Model /);
    expect(value(noModel.text, 'perRequest')).toBe('0.01');

    const file = 'currency: eur\nmodels: []\n';
    const applied = await post(`${path}/pricing/file`, { file }, `${path}/pricing`);
    expect(applied.status).toBe(400);
    expect(applied.text).toMatch(/<p class="error" role="alert" id="file-alert"[^>]*>[^<]+<\/p>/);
    expect(applied.text).toContain(`spellcheck="false">${file}</textarea>`);
  });

  it('a webhook subscription', async () => {
    const hook = await post(
      `${path}/webhooks`,
      { url: 'not a url', events: 'balance.*', description: 'my receiver' },
      `${path}/webhooks`,
    );
    expect(hook.status).toBe(400);
    expectInvalid(hook.text, 'url', /^Endpoint URL /);
    expect([value(hook.text, 'url'), value(hook.text, 'events'), value(hook.text, 'description')]).toEqual([
      'not a url',
      'balance.*',
      'my receiver',
    ]);
    const events = await post(
      `${path}/webhooks`,
      { url: 'https://example.com/h', events: ' , ' },
      `${path}/webhooks`,
    );
    expect(events.status).toBe(400);
    expectInvalid(events.text, 'events', /^Events /);
  });

  it('payments: connect (keys never sent back) and automatic recharge', async () => {
    const pay = `${path}/payments`;
    const wrong = 'sk_test_not_accepted_999';
    const refused = await post(
      pay,
      { stripeKey: wrong, webhookSecret: 'whsec_kept_secret', presets: '5, 10', minimum: '2', maximum: '50' },
      pay,
    );
    expect(refused.status).toBe(400);
    expectInvalid(refused.text, 'stripeKey', /^Payment provider check failed/);
    expect(refused.text).not.toContain(wrong);
    expect(refused.text).not.toContain('whsec_kept_secret');
    expect(refused.text).toContain('id="webhookSecret-note"');
    expect([
      value(refused.text, 'presets'),
      value(refused.text, 'minimum'),
      value(refused.text, 'maximum'),
    ]).toEqual(['5, 10', '2', '50']);
    const connected = await post(pay, { stripeKey: KEY }, pay);
    expect(connected.location).toBe(`${pay}?done=payments_connected`);

    const recharge = await post(
      `${pay}/auto-recharge`,
      { offered: 'on', threshold: 'low', amount: '10' },
      pay,
    );
    expect(recharge.status).toBe(400);
    expectInvalid(recharge.text, 'ar-threshold', /^Threshold /);
    expect(tag(recharge.text, 'ar-offered')).toContain(' checked');
    expect(value(recharge.text, 'ar-amount')).toBe('10');
  });

  it('an admin token and a new project, on a provider (its key never sent back) or the echo provider', async () => {
    const token = await post('/dashboard/admin-tokens', { name: '' }, '/dashboard');
    expect(token.status).toBe(400);
    expect(token.text).toContain('<h1>Projects</h1>');
    expectInvalid(token.text, 'tokenName', 'Admin token name must not be empty.');

    const secret = 'sk-start-secret-456';
    const start = await post(
      '/dashboard/start',
      {
        name: 'Second app',
        kind: 'openai-compatible',
        baseUrl: 'echo://local',
        apiKey: secret,
        currency: 'dollars',
      },
      '/dashboard/start',
    );
    expect(start.status).toBe(400);
    expectInvalid(start.text, 'currency', /^Currency /);
    expect([value(start.text, 'name'), value(start.text, 'baseUrl'), value(start.text, 'currency')]).toEqual([
      'Second app',
      'echo://local',
      'dollars',
    ]);
    expect(start.text).not.toContain(secret);
    // the other form of the page (start on the echo provider) is as it was
    expect(value(start.text, 'starter-currency')).toBe('usd');

    const starter = await post(
      '/dashboard/start/echo',
      { name: 'Echo app', currency: 'x' },
      '/dashboard/start',
    );
    expect(starter.status).toBe(400);
    expectInvalid(starter.text, 'starter-currency', /^Currency /);
    expect(value(starter.text, 'starter-name')).toBe('Echo app');
    expect(value(starter.text, 'currency')).toBe('usd');
  });

  it('keeps the error page for what is not about the form: a project that is not there, a bad CSRF token', async () => {
    const gone = await post('/dashboard/projects/prj_not_there/users/deposit', { user: 'a', amount: 'x' });
    expect(gone.status).toBe(404);
    expect(gone.text).toContain('Not found');
    const forged = await postWith('forged', `${path}/users/deposit`, { user: 'a', amount: 'x' });
    expect(forged.status).toBe(403);
    expect(forged.text).toContain('This did not work');
  });
});
