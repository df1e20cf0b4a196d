import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/index.ts';
import { Money } from '../../src/core/money.ts';
import { providerKind } from '../../src/payments/providers.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { eventually } from '../helpers/eventually.ts';
import { adminCli, api, seedProject, startTestServer } from '../helpers/server.ts';
import { developerWithProject } from './fixture.ts';

/**
 * The `test` payment provider (issue 38): connected without a key, its checkout is a page Tollgate
 * hosts with test cards; a paid checkout reaches the ledger through the same signed webhook and handlers
 * as Stripe's, once, whatever is replayed; declined cards and failed authentications credit nothing;
 * saved cards recharge off session and refunds debit through the refund's webhook. Never available in a
 * production configuration.
 */
const ROOT = 'root-admin-token-for-test-payments-0123456789';
const SETTINGS = {
  presets: ['1', '5', '10'],
  minimum: '1',
  maximum: '100',
  autoRecharge: { offered: true, threshold: '0.50', amount: '1', monthlyCap: '10' },
};
let f: ChatFixture;

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'chat', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.05' } },
    ],
    env: { TOLLGATE_ADMIN_TOKEN: ROOT, TOLLGATE_TEST_PAYMENTS: 'true' },
  });
  const connected = await api(f.server, ROOT, 'PUT', `/admin/v1/projects/${f.project.id}/payments`, {
    provider: 'test',
    settings: SETTINGS,
  });
  expect(connected.status, JSON.stringify(connected.body)).toBe(200);
  expect(connected.body).toMatchObject({
    connected: true,
    provider: 'test',
    keyHint: 'test',
    livemode: false,
  });
  await f.subscribe(['payment.*', 'balance.*']);
});
afterAll(async () => {
  await f?.close();
});

const form = (body: Record<string, string>) => ({
  method: 'POST',
  redirect: 'manual' as const,
  headers: { 'content-type': 'application/x-www-form-urlencoded' },
  body: new URLSearchParams(body).toString(),
});

/** Opens a top-up link (labelled test), picks an amount, presses Pay: the test checkout's URL. */
async function openCheckout(link: string, amount: string, extra: Record<string, string> = {}) {
  const page = await fetch(link);
  const html = await page.text();
  expect(page.status).toBe(200);
  expect(html).toContain('Test payments');
  const proof = /name="confirm" value="([^"]+)"/.exec(html)![1]!;
  const res = await fetch(link, form({ confirm: proof, amount: 'custom', custom: amount, ...extra }));
  expect(res.status).toBe(303);
  const checkout = res.headers.get('location')!;
  expect(checkout).toMatch(/\/payments\/test\/checkout\/tcs_[0-9a-f]{24}$/);
  const shown = await fetch(checkout);
  const checkoutHtml = await shown.text();
  expect(shown.status).toBe(200);
  expect(checkoutHtml).toContain('Test mode');
  expect(checkoutHtml).toContain(`${amount} USD`);
  return checkout;
}

async function topupLink(user: string): Promise<string> {
  const res = await api(f.server, f.apiKey, 'POST', '/v1/user/topup', { user });
  expect(res.body.checkout).toBe('hosted');
  return res.body.url as string;
}

/** The user's balance at the currency's precision. */
const balance = async (user: string) => new Money((await f.wallet(user))?.balance ?? '0').toFixed(2);

const deposits = async (user: string) =>
  (await f.ledger(user)).filter((e) => e.kind === 'deposit' && e.source === 'test');

describe('the test checkout', () => {
  it('refused chat → top-up page → test card succeeds → credited once → the next chat is answered', async () => {
    await f.fund('ada');
    const messages = [{ role: 'user' as const, content: 'Hello!' }];
    const ask = async () =>
      (await f.client.chat.completions.create({ model: 'chat', user: 'ada', messages })).choices[0]!.message
        .content!;
    const link = /(http:\/\/\S+\/topup\/[A-Za-z0-9_.-]+)/.exec(await ask())?.[1];
    expect(link).toBeDefined();

    const checkout = await openCheckout(link!, '5.00');
    const paid = await fetch(checkout, form({ card: '4242424242424242' }));
    expect(paid.status).toBe(303);
    const done = await fetch(paid.headers.get('location')!);
    expect(await done.text()).toContain('payment received');
    expect(await balance('ada')).toBe('5.00');

    // The completion replayed (the form posted again): its event is delivered again, nothing moves.
    const again = await fetch(checkout, form({ card: '4242424242424242' }));
    expect(again.status).toBe(303);
    expect((await fetch(checkout, { redirect: 'manual' })).status).toBe(303);
    expect(await deposits('ada')).toHaveLength(1);
    expect(await balance('ada')).toBe('5.00');

    expect(await ask()).toBe(' hello'.repeat(5));
    await f.settled();
    expect(await balance('ada')).toBe('4.95');
    const succeeded = await f.events('payment.succeeded');
    expect(succeeded.filter((e) => JSON.stringify(e).includes('"ada"'))).toHaveLength(1);
    expect(succeeded.at(-1).data).toMatchObject({ amount: '5.00', provider: 'test' });
    expect((await f.events('balance.deposit.created')).length).toBeGreaterThan(0);

    const payments = await api(
      f.server,
      ROOT,
      'GET',
      `/admin/v1/projects/${f.project.id}/payments/list?user=ada`,
    );
    expect(payments.body.data).toEqual([expect.objectContaining({ status: 'paid', provider: 'test' })]);
    const portal = await api(f.server, f.apiKey, 'POST', '/v1/user/portal', { user: 'ada' });
    expect(await (await fetch(portal.body.url)).text()).toContain('(test)');
  });

  it('a declined card and a failed authentication credit nothing; a passed authentication credits once', async () => {
    await f.fund('bob');
    const checkout = await openCheckout(await topupLink('bob'), '10.00');
    const declined = await fetch(checkout, form({ card: '4000000000000002' }));
    expect(declined.status).toBe(402);
    expect(await declined.text()).toContain('Your card was declined.');

    const asked = await fetch(checkout, form({ card: '4000002760003184' }));
    expect(asked.status).toBe(200);
    expect(await asked.text()).toContain('Authenticate this payment');
    const failed = await fetch(checkout, form({ card: '4000002760003184', authentication: 'failed' }));
    expect(failed.status).toBe(402);
    expect(await failed.text()).toContain('authentication failed');
    expect(await balance('bob')).toBe('0.00');
    expect(await deposits('bob')).toHaveLength(0);

    const passed = await fetch(checkout, form({ card: '4000002760003184', authentication: 'passed' }));
    expect(passed.status).toBe(303);
    expect(await balance('bob')).toBe('10.00');
    expect(await deposits('bob')).toHaveLength(1);
  });

  it('a refund through the admin API debits once, through the refund’s webhook', async () => {
    await f.fund('cy');
    const checkout = await openCheckout(await topupLink('cy'), '10.00');
    expect((await fetch(checkout, form({ card: '4242424242424242' }))).status).toBe(303);
    const list = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${f.project.id}/payments/list?user=cy`);
    const payment = list.body.data[0];
    const refund = await api(
      f.server,
      ROOT,
      'POST',
      `/admin/v1/projects/${f.project.id}/payments/${payment.id}/refund`,
      { amount: '4.00' },
    );
    expect(refund.status, JSON.stringify(refund.body)).toBe(200);
    expect(refund.body).toMatchObject({ object: 'refund', amount: '4.00', status: 'succeeded' });
    await eventually(async () => (await balance('cy')) === '6.00');
    const after = await api(
      f.server,
      ROOT,
      'GET',
      `/admin/v1/projects/${f.project.id}/payments/list?user=cy`,
    );
    expect(after.body.data[0]).toMatchObject({ refunded: '4.00', status: 'paid' });
    const more = await api(
      f.server,
      ROOT,
      'POST',
      `/admin/v1/projects/${f.project.id}/payments/${payment.id}/refund`,
      { amount: '7.00' },
    );
    expect(more.status).toBe(400);
    expect(await balance('cy')).toBe('6.00');
  });
});

describe('the dashboard', () => {
  it('offers “Use test payments” where they are on, connects them, and labels them', async () => {
    const { projectId, cookie } = await developerWithProject(f.server, 'test-payments', 'Dashboard test');
    const path = `${f.server.url}/dashboard/projects/${projectId}/payments`;
    const before = await (await fetch(path, { headers: { cookie } })).text();
    expect(before).toContain('Use test payments');
    const csrf = /name="csrf" value="([^"]+)"/.exec(before)![1]!;
    const connected = await fetch(`${path}/test`, {
      ...form({ csrf }),
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    });
    expect(connected.status).toBe(303);
    const after = await (await fetch(path, { headers: { cookie } })).text();
    expect(after).toContain('<strong>Test payments</strong> are connected');
    expect(after).not.toContain('Use test payments');
  });
});

describe('the CLI', () => {
  it('payments connect --provider test, over the admin API', async () => {
    const { projectId } = await seedProject(f.ctx, { name: 'CLI test payments' });
    const { stdout } = await adminCli(f.server.url, ROOT, [
      'payments',
      'connect',
      '--provider',
      'test',
      '--project',
      projectId,
    ]);
    expect(stdout).toContain(`Payments: test payments connected to ${projectId}`);
    expect((await api(f.server, ROOT, 'GET', `/admin/v1/projects/${projectId}/payments`)).body).toMatchObject(
      {
        connected: true,
        provider: 'test',
      },
    );
  });
});

describe('auto-recharge on the test provider', () => {
  /** Pays a 1.00 top-up with a card saved for automatic recharges. */
  async function saveCard(user: string, card: string) {
    await f.fund(user);
    const checkout = await openCheckout(await topupLink(user), '1.00', { saveCard: 'on' });
    const body: Record<string, string> =
      card === '4000002760003184' ? { card, authentication: 'passed' } : { card };
    expect((await fetch(checkout, form(body))).status).toBe(303);
    expect(await balance(user)).toBe('1.00');
  }
  const chat = (user: string) =>
    f.client.chat.completions.create({ model: 'chat', user, messages: [{ role: 'user', content: 'Hi' }] });

  it('recharges the saved card off session when the balance falls below the threshold, once', async () => {
    await saveCard('dee', '4242424242424242');
    for (let i = 0; i < 11; i++) await chat('dee');
    await f.settled();
    // 1.00 − 11 × 0.05 = 0.45 < 0.50: one recharge of 1.00
    await eventually(async () => (await balance('dee')) === '1.45');
    const recharged = await eventually(async () => {
      const events = await f.events('payment.recharge.succeeded');
      return events.length ? events : undefined;
    });
    expect(recharged.filter((e) => JSON.stringify(e).includes('dee'))).toHaveLength(1);
    expect(await deposits('dee')).toHaveLength(2);
  });

  it('a card that needs its holder fails off session: nothing credited, auto-recharge turned off', async () => {
    await saveCard('eve', '4000002760003184');
    for (let i = 0; i < 11; i++) await chat('eve');
    await f.settled();
    const failed = await eventually(async () => {
      const events = (await f.events('payment.recharge.failed')).filter((e) =>
        JSON.stringify(e).includes('eve'),
      );
      return events.length ? events : undefined;
    });
    expect(JSON.stringify(failed[0])).toContain('authentication_required');
    const card = await f.ctx.db
      .selectFrom('payment_customers as c')
      .innerJoin('end_users as e', 'e.id', 'c.user_id')
      .select('c.auto_recharge')
      .where('e.external_id', '=', 'eve')
      .executeTakeFirstOrThrow();
    expect(card.auto_recharge).toBe(false);
    expect(await balance('eve')).toBe('0.45');
    expect(await deposits('eve')).toHaveLength(1);
  });
});

describe('a production configuration', () => {
  it('refuses TOLLGATE_TEST_PAYMENTS at start-up', () => {
    expect(() => loadConfig({ NODE_ENV: 'production', TOLLGATE_TEST_PAYMENTS: 'true' })).toThrow(ConfigError);
    expect(() => loadConfig({ NODE_ENV: 'production', TOLLGATE_TEST_PAYMENTS: 'true' })).toThrow(
      /TOLLGATE_TEST_PAYMENTS must not be on in a production configuration/,
    );
    expect(loadConfig({ NODE_ENV: 'production' }).TOLLGATE_TEST_PAYMENTS).toBe(false);
  });

  it('never selects the test provider, even when the setting says so', async () => {
    const production = { ...f.ctx.config, NODE_ENV: 'production', TOLLGATE_TEST_PAYMENTS: true };
    expect(providerKind('test', production)).toBeUndefined();
    expect(providerKind('stripe', production)?.name).toBe('stripe');
  });

  it('without test payments on: connecting it is refused, its pages and webhook are not found', async () => {
    const server = await startTestServer({ TOLLGATE_ADMIN_TOKEN: ROOT });
    try {
      const { projectId } = await seedProject(server.ctx, { name: 'No test payments' });
      const res = await api(server, ROOT, 'PUT', `/admin/v1/projects/${projectId}/payments`, {
        provider: 'test',
      });
      expect(res.status).toBe(400);
      expect(res.body.error.code).toBe('payment_provider_unavailable');
      const checkout = await fetch(`${server.url}/payments/test/checkout/tcs_${'0'.repeat(24)}`);
      expect(checkout.status).toBe(404);
      const hook = await fetch(`${server.url}/payments/test/${projectId}/webhook`, {
        method: 'POST',
        body: '{}',
      });
      expect(hook.status).toBe(404);
    } finally {
      await server.close();
    }
  });
});
