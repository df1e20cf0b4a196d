import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { fromMinorUnits, toMinorUnits } from '../../src/payments/provider.ts';
import { connectUser } from '../../src/users/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { type ChatFixture, ledgerEntriesOf, startChatFixture } from '../helpers/chat-fixture.ts';
import { adminCli, api, seedProject } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';
import { developerWithProject } from './fixture.ts';

/**
 * Payments through Stripe (issue 23), with the official `stripe` library pointed at a loopback stand-in
 * of Stripe's API (STRIPE_API_URL): connecting a project, the hosted checkout behind the top-up link,
 * webhooks credited exactly once, refunds and disputes, the portal, and the paywall end to end.
 */
const ROOT = 'root-admin-token-for-payments-tests-0123456789';
const KEY = 'sk_test_standin_4242424242';
let stand: StripeStandIn;
let f: ChatFixture;

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [KEY] });
  f = await startChatFixture({
    models: [
      { id: 'chat', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.05' } },
    ],
    env: { TOLLGATE_ADMIN_TOKEN: ROOT, STRIPE_API_URL: stand.url },
  });
});
afterAll(async () => {
  await f?.close();
  await stand?.close();
});

const admin = (method: string, path: string, body?: unknown) =>
  api(f.server, ROOT, method, `/admin/v1${path}`, body);

async function connect(projectId: string, extra: Record<string, unknown> = {}) {
  const res = await admin('PUT', `/projects/${projectId}/payments`, { stripeKey: KEY, ...extra });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

async function topupLink(apiKey: string, user: string, amount?: string): Promise<string> {
  const res = await api(f.server, apiKey, 'POST', '/v1/user/topup', { user, ...(amount ? { amount } : {}) });
  expect(res.status).toBe(200);
  return res.body.url as string;
}

/** Opens a top-up link, picks an amount, presses Pay: the 303 to the checkout. */
async function pressPay(link: string, form: Record<string, string>) {
  const page = await fetch(link);
  expect(page.status).toBe(200);
  const html = await page.text();
  const proof = /name="confirm" value="([^"]+)"/.exec(html)![1]!;
  return fetch(link, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ confirm: proof, ...form }).toString(),
  });
}

async function paidSession(apiKey: string, user: string, amount: string) {
  const res = await pressPay(await topupLink(apiKey, user), { amount: 'custom', custom: amount });
  expect(res.status).toBe(303);
  const sessionId = new URL(res.headers.get('location')!).pathname.split('/').pop()!;
  return stand.sessions.get(sessionId)!;
}

async function ledgerOf(projectId: string, user: string) {
  const wallet = await f.ctx.db
    .selectFrom('end_users')
    .selectAll()
    .where('project_id', '=', projectId)
    .where('external_id', '=', user)
    .executeTakeFirstOrThrow();
  const entries = await ledgerEntriesOf(f.ctx, wallet.id, ['kind', 'amount', 'source', 'description']);
  const sum = entries.reduce((s, e) => s.plus(e.amount), new Money(0));
  expect(sum.eq(wallet.balance)).toBe(true);
  return { balance: new Money(wallet.balance).toFixed(), entries };
}

describe('minor units', () => {
  it('converts by the currency’s exponent: cents, whole yen, thousandths of a dinar', () => {
    expect(toMinorUnits('10.50', 'usd')).toBe(1050);
    expect(toMinorUnits('1500', 'jpy')).toBe(1500);
    expect(toMinorUnits('1.234', 'kwd')).toBe(1234);
    expect(fromMinorUnits(1050, 'usd')).toBe('10.5');
    expect(fromMinorUnits(1500, 'jpy')).toBe('1500');
    expect(() => toMinorUnits('0.5', 'jpy')).toThrow(/minor unit/);
  });
});

describe('connecting Stripe', () => {
  it('checks the key live, creates the webhook endpoint, never shows the key, and disconnects', async () => {
    const { projectId } = await seedProject(f.ctx, { name: 'Connect test' });
    const bad = await admin('PUT', `/projects/${projectId}/payments`, {
      stripeKey: 'sk_test_wrongwrongwrong',
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('payment_provider_check_failed');

    const connected = await connect(projectId);
    expect(connected).toMatchObject({ connected: true, provider: 'stripe', keyHint: 'sk_test_…4242' });
    expect(JSON.stringify(connected)).not.toContain(KEY);
    const endpoint = stand.endpoints.get(connected.webhook.endpointId)!;
    expect(endpoint.url).toBe(`${f.server.url}/payments/stripe/${projectId}/webhook`);
    expect(endpoint.enabled_events).toEqual(
      expect.arrayContaining(['checkout.session.completed', 'charge.refunded', 'charge.dispute.created']),
    );
    expect(JSON.stringify(connected)).not.toContain(endpoint.secret);

    const shown = await admin('GET', `/projects/${projectId}/payments`);
    expect(shown.body).toMatchObject({ connected: true, keyHint: 'sk_test_…4242' });
    expect(JSON.stringify(shown.body)).not.toContain(KEY);
    const row = await f.ctx.db
      .selectFrom('payment_connections')
      .selectAll()
      .where('project_id', '=', projectId)
      .executeTakeFirstOrThrow();
    expect(row.key_sealed).not.toContain(KEY);
    expect(f.ctx.sealer.open(row.key_sealed)).toBe(KEY);

    const gone = await admin('DELETE', `/projects/${projectId}/payments`);
    expect(gone.body).toMatchObject({ connected: false, deleted: true, webhookEndpointDeleted: true });
    expect(stand.endpoints.has(connected.webhook.endpointId)).toBe(false);
    expect((await admin('GET', `/projects/${projectId}/payments`)).body.connected).toBe(false);

    // A signing secret pasted from an endpoint made by hand: no endpoint is created.
    const before = stand.endpoints.size;
    const pasted = await connect(projectId, { webhookSecret: 'whsec_madebyhand12345678' });
    expect(pasted.webhook).toMatchObject({ managed: false, endpointId: null });
    expect(stand.endpoints.size).toBe(before);
    await admin('DELETE', `/projects/${projectId}/payments`);
  });
});

describe('the CLI', () => {
  it('payments connect | show | disconnect over the admin API, the key never printed', async () => {
    const { projectId } = await seedProject(f.ctx, { name: 'CLI payments' });
    const cli = (...args: string[]) =>
      adminCli(f.server.url, ROOT, ['payments', ...args, '--project', projectId]);
    const connected = await cli('connect', '--stripe-key', KEY, '--presets', '5,10', '--minimum', '5');
    expect(connected.stdout).toContain('stripe connected');
    expect(connected.stdout).toContain('sk_test_…4242');
    expect(connected.stdout).not.toContain(KEY);
    const shown = await cli('show', '--json');
    expect(JSON.parse(shown.stdout)).toMatchObject({
      connected: true,
      settings: { presets: ['5.00', '10.00'], minimum: '5.00' },
    });
    expect(shown.stdout).not.toContain(KEY);
    const endpointId = JSON.parse(shown.stdout).webhook.endpointId;
    expect(stand.endpoints.has(endpointId)).toBe(true);
    const gone = await cli('disconnect');
    expect(gone.stdout).toContain('webhook endpoint deleted');
    expect(stand.endpoints.has(endpointId)).toBe(false);
  });
});

describe('the dashboard', () => {
  it('connects Stripe from the Payments page and lists top-ups with a Refund button', async () => {
    const { projectId, cookie } = await developerWithProject(f.server, 'pay', 'Dash shop');
    const url = `${f.server.url}/dashboard/projects/${projectId}/payments`;
    const page = await fetch(url, { headers: { cookie } });
    const html = await page.text();
    expect(page.status).toBe(200);
    expect(html).toContain('Connect Stripe');
    const csrf = /name="csrf" value="([^"]+)"/.exec(html)![1]!;
    const posted = await fetch(url, {
      method: 'POST',
      redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({
        csrf,
        stripeKey: KEY,
        presets: '5, 10',
        minimum: '5',
        maximum: '50',
      }).toString(),
    });
    expect(posted.status).toBe(303);
    expect(posted.headers.get('location')).toContain('done=payments_connected');
    const after = await (await fetch(url, { headers: { cookie } })).text();
    expect(after).toContain('sk_test_…4242');
    expect(after).not.toContain(KEY);
    expect(after).toContain(`/payments/stripe/${projectId}/webhook`);
    const filtered = await (await fetch(`${url}?user=nobody`, { headers: { cookie } })).text();
    expect(filtered).toContain('Top-ups of nobody');
    expect(filtered).toContain('No top-ups yet.');
  });
});

describe('checkout from the top-up link', () => {
  it('renders the hosted page and answers 303 to a Checkout Session in minor units (usd)', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Shop USD' });
    await connect(projectId, { settings: { presets: ['5', '10', '20'], minimum: '2', maximum: '500' } });
    const link = await topupLink(apiKey, 'alice', '7.50');
    const asked = await api(f.server, apiKey, 'POST', '/v1/user/topup', { user: 'alice' });
    expect(asked.body.checkout).toBe('hosted');
    const page = await fetch(link);
    const html = await page.text();
    expect(page.status).toBe(200);
    expect(html).toContain('Top up your Shop USD balance');
    expect(html).toContain('alice');
    expect(html).toContain('7.50 USD'); // needed
    expect(html).toContain('0.00 USD'); // available
    expect(html).toMatch(/value="10.00" checked/); // the first preset that covers the need

    const res = await pressPay(link, { amount: '10.00' });
    expect(res.status).toBe(303);
    const target = new URL(res.headers.get('location')!);
    expect(target.origin).toBe(stand.url);
    const created = stand.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!;
    expect(created.body).toMatchObject({
      mode: 'payment',
      line_items: [{ quantity: '1', price_data: { currency: 'usd', unit_amount: '1000' } }],
      metadata: { tollgate_project: projectId, tollgate_user: 'alice' },
    });
    expect(created.body.client_reference_id).toMatch(/^pay_/);
    expect(created.body.success_url).toContain('/payments/done/');
    expect(created.body.cancel_url).toContain('?cancelled=1');
    // The done page opens while its token lives, and expires like the other links.
    const done = await fetch(created.body.success_url);
    expect(done.status).toBe(200);
    expect(await done.text()).toContain('Thank you');
    const paymentId = created.body.client_reference_id as string;
    const signed = (payload: unknown) => {
      const body = Buffer.from(typeof payload === 'string' ? payload : JSON.stringify(payload)).toString(
        'base64url',
      );
      return `${f.server.url}/payments/done/${body}.${f.ctx.sealer.sign(`payment-done:${body}`)}`;
    };
    const past = Math.floor(Date.now() / 1000) - 1;
    for (const stale of [signed({ p: paymentId, exp: past }), signed(paymentId)]) {
      const res = await fetch(stale);
      expect(res.status).toBe(410);
      expect(await res.text()).toContain('This link has expired');
    }

    // A custom amount outside the project's range is refused on the page; nothing is created.
    const count = stand.sessions.size;
    const refused = await pressPay(link, { amount: 'custom', custom: '900' });
    expect(refused.status).toBe(400);
    expect(await refused.text()).toContain('Choose an amount from 2.00 USD to 500.00 USD');
    expect(stand.sessions.size).toBe(count);
    // A post without the page's hidden field is not the page's form.
    const foreign = await fetch(link, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: 'amount=10.00',
    });
    expect(foreign.status).toBe(400);
  });

  it('uses the zero-decimal amount for jpy and credits the right amount', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Shop JPY', currency: 'jpy' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'kenji', '1500');
    expect(session.amount_total).toBe(1500);
    expect(session.currency).toBe('jpy');
    await stand.pay(session.id);
    const { balance, entries } = await ledgerOf(projectId, 'kenji');
    expect(balance).toBe('1500');
    expect(entries).toMatchObject([{ kind: 'deposit', amount: '1500', source: 'stripe' }]);
  });

  it('without payments connected, the top-up link still redirects to the checkoutUrl', async () => {
    const { apiKey } = await seedProject(f.ctx, {
      name: 'Own checkout',
      settings: { checkoutUrl: 'https://shop.example.com/pay' },
    });
    const res = await fetch(await topupLink(apiKey, 'bob', '3.00'), { redirect: 'manual' });
    expect(res.status).toBe(303);
    expect(res.headers.get('location')).toMatch(/^https:\/\/shop\.example\.com\/pay\?/);
  });
});

describe('webhooks to deposits', () => {
  it('credits a completed session exactly once, under duplicated, concurrent and late deliveries', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Once' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'carol', '25.00');
    const completed = await stand.pay(session.id, { deliver: false });
    // One Stripe account, several projects: every project's endpoint gets the event; the others ignore it.
    const statuses = (await Promise.all(Array.from({ length: 5 }, () => stand.deliver(completed)))).flat();
    expect(statuses.length).toBeGreaterThanOrEqual(5);
    expect(statuses.every((s) => s === 200)).toBe(true);
    // An hour later Stripe retries, signed afresh.
    const late = await stand.deliver(completed, { timestamp: Math.floor(Date.now() / 1000) });
    expect(late.every((s) => s === 200)).toBe(true);
    const { balance, entries } = await ledgerOf(projectId, 'carol');
    expect(balance).toBe('25');
    expect(entries.filter((e) => e.kind === 'deposit')).toHaveLength(1);
    const payment = await f.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('checkout_id', '=', session.id)
      .executeTakeFirstOrThrow();
    expect(payment).toMatchObject({ status: 'paid', external_id: 'carol' });
    expect(payment.receipt_url).toMatch(/\/receipts\//);
    expect(payment.payment_intent_id).toMatch(/^pi_/);
  });

  it('a delayed payment method: the unpaid completion credits nothing, async_payment_succeeded credits once', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Async' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'ivan', '12.00');
    const succeeded = await stand.pay(session.id, { asyncPayment: true, deliver: false });
    const unpaid = stand.events.at(-2)!;
    expect(unpaid.data.object.payment_status).toBe('unpaid');
    await stand.deliver(unpaid);
    expect((await ledgerOf(projectId, 'ivan')).balance).toBe('0');
    await Promise.all([stand.deliver(succeeded), stand.deliver(succeeded)]);
    const { balance, entries } = await ledgerOf(projectId, 'ivan');
    expect(balance).toBe('12');
    expect(entries).toHaveLength(1);
  });

  it('signature: the official library’s test header is accepted; bad, missing or stale ones are 400 and write nothing', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Signatures' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'dave', '10.00');
    const completed = await stand.pay(session.id, { deliver: false });
    const all400 = (statuses: number[]) => statuses.length > 0 && statuses.every((s) => s === 400);
    expect(all400(await stand.deliver(completed, { secret: 'whsec_not_the_right_secret' }))).toBe(true);
    expect(all400(await stand.deliver(completed, { signature: null }))).toBe(true);
    const stale = Math.floor(Date.now() / 1000) - 3600;
    expect(all400(await stand.deliver(completed, { timestamp: stale }))).toBe(true);
    expect((await ledgerOf(projectId, 'dave')).balance).toBe('0');
    expect(
      await f.ctx.db
        .selectFrom('payment_movements')
        .select('key')
        .where('project_id', '=', projectId)
        .execute(),
    ).toEqual([]);

    // The library's own generateTestHeaderString signs what Tollgate accepts.
    const endpoint = [...stand.endpoints.values()].find((e) => e.url.includes(projectId))!;
    const payload = JSON.stringify(completed);
    const header = new Stripe('sk_test_x').webhooks.generateTestHeaderString({
      payload,
      secret: endpoint.secret,
    });
    const res = await fetch(endpoint.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'stripe-signature': header },
      body: payload,
    });
    expect(res.status).toBe(200);
    expect((await ledgerOf(projectId, 'dave')).balance).toBe('10');
  });
});

describe('refunds and disputes', () => {
  it('a partial refund through the admin API and a lost dispute each debit once; balance = sum of entries', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Reversals' });
    await connect(projectId);
    await createSubscription(
      f.ctx,
      projectId,
      { url: 'http://127.0.0.1:9/hook', events: ['payment.*', 'balance.*'] },
      { createdBy: 'test' },
    );
    const session = await paidSession(apiKey, 'erin', '40.00');
    await stand.pay(session.id);
    const payment = await f.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('checkout_id', '=', session.id)
      .executeTakeFirstOrThrow();

    const refund = await admin('POST', `/projects/${projectId}/payments/${payment.id}/refund`, {
      amount: '15.00',
    });
    expect(refund.status, JSON.stringify(refund.body)).toBe(200);
    expect(refund.body).toMatchObject({ object: 'refund', amount: '15.00', status: 'succeeded' });
    await stand.idle();
    const refundedEvent = stand.events.filter((e) => e.type === 'charge.refunded').at(-1)!;
    await Promise.all([stand.deliver(refundedEvent), stand.deliver(refundedEvent)]); // replays
    expect((await ledgerOf(projectId, 'erin')).balance).toBe('25');

    const charge = refundedEvent.data.object.id as string;
    const opened = await stand.dispute(charge, { amount: 1000 });
    await stand.deliver(opened);
    const lost = await stand.closeDispute(opened.data.object.id, 'lost');
    await stand.deliver(lost);
    const { balance, entries } = await ledgerOf(projectId, 'erin');
    expect(balance).toBe('15');
    expect(entries.map((e) => [e.kind, new Money(e.amount).toFixed()])).toEqual([
      ['deposit', '40'],
      ['charge', '-15'],
      ['charge', '-10'],
    ]);
    const written = await f.ctx.db
      .selectFrom('events')
      .select(['type', 'envelope'])
      .where('project_id', '=', projectId)
      .orderBy('id')
      .execute();
    expect(written.map((e) => e.type)).toEqual([
      'balance.deposit.created',
      'payment.succeeded',
      'balance.charge.created',
      'payment.refunded',
      'balance.charge.created',
      'payment.disputed',
      'payment.dispute.closed',
    ]);
    const deposit = written[0]!.envelope as {
      data: Record<string, unknown>;
      metadata: Record<string, unknown>;
    };
    expect(deposit.data).toMatchObject({ source: 'stripe', amount: '40.00', currency: 'usd' });
    expect(deposit.metadata).toMatchObject({ provider: 'stripe', checkoutSessionId: session.id });
    const after = await admin('GET', `/projects/${projectId}/payments/list?user=erin`);
    expect(after.body.data[0]).toMatchObject({ status: 'disputed', refunded: '15.00', disputed: '10.00' });
  });

  it('out of order: a refund delivered before its checkout’s completion credits first, then debits; the late completion moves nothing', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Out of order' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'hana', '30.00');
    const completed = await stand.pay(session.id, { deliver: false });
    const intent = stand.sessions.get(session.id)!.payment_intent as string;
    await stand.refund(intent, 1000); // delivered now, before the completion
    expect((await ledgerOf(projectId, 'hana')).balance).toBe('20');
    await stand.deliver(completed);
    const { balance, entries } = await ledgerOf(projectId, 'hana');
    expect(balance).toBe('20');
    expect(entries.map((e) => e.kind)).toEqual(['deposit', 'charge']);
  });

  it('a won dispute restores what it took; a reversal beyond the balance is debited whole, into debt', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'Disputes' });
    await connect(projectId);
    const session = await paidSession(apiKey, 'frank', '20.00');
    await stand.pay(session.id);
    const charge = [...stand.charges.values()].find((c) => c.amount === 2000 && !c.disputed)!;
    const opened = await stand.dispute(charge.id);
    expect((await ledgerOf(projectId, 'frank')).balance).toBe('0');
    const won = await stand.closeDispute(opened.data.object.id, 'won');
    await stand.deliver(won);
    expect((await ledgerOf(projectId, 'frank')).balance).toBe('20');

    // Spend, then a full refund made in Stripe's dashboard: the whole refund is debited (8 - 20 = -12).
    const project = { id: projectId, owner_user_id: '', currency: 'usd' };
    const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
    await connectUser(f.ctx.db, f.ctx.events, project, 'frank', trigger);
    const spent = await f.ctx.billing.charge({
      project,
      externalId: 'frank',
      amount: '12',
      source: 'api',
      trigger,
    });
    expect(spent.ok).toBe(true);
    await stand.refund(charge.payment_intent);
    const { balance } = await ledgerOf(projectId, 'frank');
    expect(balance).toBe('-12');
    const row = await f.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('checkout_id', '=', session.id)
      .executeTakeFirstOrThrow();
    expect(row.status).toBe('refunded');
    expect(new Money(row.uncollected).toFixed()).toBe('0');
  });
});

describe('the paywall, paid through Stripe', () => {
  it('refused with a top-up link → pays on the hosted pages → answered again; the portal shows the receipt', async () => {
    const { projectId } = { projectId: f.project.id };
    await connect(projectId);
    await f.fund('grace');
    const messages = [{ role: 'user' as const, content: 'Hello!' }];
    const ask = async () =>
      (await f.client.chat.completions.create({ model: 'chat', user: 'grace', messages })).choices[0]!.message
        .content!;
    const link = /(http:\/\/\S+\/topup\/[A-Za-z0-9_.-]+)/.exec(await ask())?.[1];
    expect(link).toBeDefined();

    const toCheckout = await pressPay(link!, { amount: '5.00' });
    expect(toCheckout.status).toBe(303);
    const checkoutPage = toCheckout.headers.get('location')!;
    expect((await fetch(checkoutPage)).status).toBe(200);
    // The customer pays on Stripe's page: the webhook is delivered, then the browser comes back.
    const back = await fetch(checkoutPage, { method: 'POST', redirect: 'manual' });
    expect(back.status).toBe(303);
    const done = await fetch(back.headers.get('location')!);
    const doneHtml = await done.text();
    expect(done.status).toBe(200);
    expect(doneHtml).toContain('payment received');
    expect(doneHtml).toContain('5.00 USD');

    expect(await ask()).toBe(' hello'.repeat(5));
    await f.settled();
    expect(await f.wallet('grace')).toMatchObject({ balance: '4.95' });
    await f.ledger('grace');

    const portal = await api(f.server, f.apiKey, 'POST', '/v1/user/portal', { user: 'grace' });
    expect(portal.status).toBe(200);
    const portalPage = await fetch(portal.body.url);
    const portalHtml = await portalPage.text();
    expect(portalPage.status).toBe(200);
    expect(portalHtml).toContain('4.95 USD');
    expect(portalHtml).toMatch(/href="http:\/\/127\.0\.0\.1:\d+\/receipts\//);
    expect(portalHtml).toContain('/topup/');
  });
});
