import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { findWallet } from '../../src/billing/ledger.ts';
import { Money } from '../../src/core/money.ts';
import { connectUser } from '../../src/users/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { adminCli, api, seedProject, startPods, type TestServer } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';
import { developerWithProject } from './fixture.ts';

/**
 * Auto-recharge (issue 25): a card saved at checkout is charged off session (a PaymentIntent against
 * the Stripe stand-in, through the official `stripe` library) when the available balance falls below
 * the threshold — in the background, one recharge in flight per wallet, credited only by the
 * `payment_intent.succeeded` webhook, once; a declined card turns it off and the portal says why; the
 * monthly cap holds with 32 concurrent requests on two pods.
 */
const ROOT = 'root-admin-token-for-recharge-tests-0123456789';
const KEY = 'sk_test_standin_4242424242';
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const model = {
  id: 'chat',
  upstreamModel: 'mock-model',
  pricing: { mode: 'per_request', perRequest: '0.05' },
} as const;
const SETTINGS = {
  presets: ['1', '5', '10'],
  minimum: '1',
  maximum: '100',
  autoRecharge: { offered: true, threshold: '0.50', amount: '1', monthlyCap: '10' },
};

/** A reply carrying the top-up or connect link instead of the model's answer. */
const LINK = /\/(topup|connect)\//;

let stand: StripeStandIn;
let f: ChatFixture;

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [KEY] });
  f = await startChatFixture({
    models: [model],
    env: { TOLLGATE_ADMIN_TOKEN: ROOT, STRIPE_API_URL: stand.url },
  });
  await connect(f.server, f.project.id, SETTINGS);
  await createSubscription(
    f.ctx,
    f.project.id,
    { url: 'http://127.0.0.1:9/hook', events: ['payment.*'] },
    { createdBy: 'test' },
  );
});
afterAll(async () => {
  await f?.close();
  await stand?.close();
});

async function connect(server: TestServer, projectId: string, settings: unknown) {
  const res = await api(server, ROOT, 'PUT', `/admin/v1/projects/${projectId}/payments`, {
    stripeKey: KEY,
    settings,
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

/** saveCardAtCheckout on the suite's server and project. */
const saveCard = (user: string, amount: string) =>
  saveCardAtCheckout(f.server, { projectId: f.project.id, apiKey: f.apiKey }, user, amount);

/** Tops up through the hosted page with "save this card and recharge automatically" ticked, and pays. */
async function saveCardAtCheckout(
  server: TestServer,
  seeded: { projectId: string; apiKey: string },
  user: string,
  amount: string,
) {
  const { apiKey } = seeded;
  const project = (await server.ctx.projects.get(seeded.projectId))!;
  await connectUser(server.ctx.db, server.ctx.events, project, user, trigger);
  const link = (await api(server, apiKey, 'POST', '/v1/user/topup', { user })).body.url as string;
  const page = await (await fetch(link)).text();
  expect(page).toContain('Save this card and recharge automatically');
  const proof = /name="confirm" value="([^"]+)"/.exec(page)![1]!;
  const res = await fetch(link, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      confirm: proof,
      amount: 'custom',
      custom: amount,
      saveCard: 'on',
    }).toString(),
  });
  expect(res.status).toBe(303);
  const sessionId = new URL(res.headers.get('location')!).pathname.split('/').pop()!;
  const created = stand.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!;
  expect(created.body.customer_creation).toBe('always');
  expect(created.body.payment_intent_data.setup_future_usage).toBe('off_session');
  await stand.pay(sessionId);
  const card = await savedCard(server.ctx, user);
  expect(card).toMatchObject({ auto_recharge: true });
  expect(card.payment_method_id).toMatch(/^pm_/);
  expect(stand.paymentMethods.get(card.payment_method_id!)!.customer).toBe(card.customer_id);
  return card;
}

async function savedCard(ctx: AppContext, user: string) {
  return ctx.db
    .selectFrom('payment_customers as c')
    .innerJoin('end_users as e', 'e.id', 'c.user_id')
    .selectAll('c')
    .where('e.external_id', '=', user)
    .executeTakeFirstOrThrow();
}

async function rechargesOf(ctx: AppContext, user: string) {
  return ctx.db
    .selectFrom('recharges as r')
    .innerJoin('end_users as e', 'e.id', 'r.user_id')
    .select(['r.id', 'r.status', 'r.amount', 'r.payment_intent_id', 'r.failure_code'])
    .where('e.external_id', '=', user)
    .orderBy('r.created_at')
    .execute();
}

const intentCreates = (customer: string) =>
  stand.requests.filter(
    (r) => r.method === 'POST' && r.path === '/v1/payment_intents' && r.body.customer === customer,
  );

/** Every settle, every recharge started after it, and every webhook the stand-in sent for it, done. */
async function quiet(...servers: TestServer[]) {
  for (const { ctx, app } of servers) {
    await app.metering.idle();
    await ctx.billing.idle();
  }
  for (const { ctx } of servers) await ctx.payments.recharges.idle();
  await stand.idle();
}

async function chat(client: OpenAI, user: string): Promise<string> {
  const res = await client.chat.completions.create({
    model: 'chat',
    user,
    messages: [{ role: 'user', content: 'hello' }],
  });
  return res.choices[0]!.message.content ?? '';
}

async function eventsOf(ctx: AppContext, projectId: string, type: string) {
  return ctx.db
    .selectFrom('events')
    .select('envelope')
    .where('project_id', '=', projectId)
    .where('type', '=', type)
    .execute();
}

describe('auto-recharge', () => {
  it('chats through the threshold with no top-up link, one recharge per crossing, credited once', async () => {
    const card = await saveCard('rita', '1.00');
    const crossings: number[] = [];
    for (let i = 1; i <= 31; i++) {
      expect(await chat(f.client, 'rita')).not.toMatch(LINK);
      await quiet(f.server);
      if (intentCreates(card.customer_id).length > crossings.length) crossings.push(i);
    }
    // 1.00 − 11 × 0.05 = 0.45 < 0.50: recharged to 1.45; 20 chats later 0.45 again.
    expect(crossings).toEqual([11, 31]);
    const creates = intentCreates(card.customer_id);
    for (const c of creates) {
      expect(c.body).toMatchObject({
        amount: '100',
        currency: 'usd',
        customer: card.customer_id,
        payment_method: card.payment_method_id,
        off_session: 'true',
        confirm: 'true',
      });
      expect(c.idempotencyKey).toMatch(/^tollgate-recharge-pay_/);
    }
    const recharges = await rechargesOf(f.ctx, 'rita');
    expect(recharges.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
    expect((await f.wallet('rita'))!.balance).toBe('1.45');

    // Duplicate deliveries of the succeeded events (concurrent and later) credit nothing more.
    const succeeded = stand.events.filter(
      (e) => e.type === 'payment_intent.succeeded' && e.data.object.customer === card.customer_id,
    );
    expect(succeeded).toHaveLength(2);
    await Promise.all(succeeded.flatMap((e) => [stand.deliver(e), stand.deliver(e)]));
    await stand.deliver(succeeded[0]!);
    expect((await f.wallet('rita'))!.balance).toBe('1.45');
    const entries = await f.ledger('rita');
    expect(entries.filter((e) => e.kind === 'deposit' && e.source === 'stripe')).toHaveLength(3);
    const events = await eventsOf(f.ctx, f.project.id, 'payment.recharge.succeeded');
    const rita = events.filter((e) => (e.envelope as any).data.externalUserId === 'rita');
    expect(rita).toHaveLength(2);
    expect((rita[0]!.envelope as any).data).toMatchObject({ amount: '1.00', currency: 'usd' });
    expect((rita[1]!.envelope as any).data.rechargedThisMonth).toBe('2.00');
  });

  it('never waits on the request path: a request it cannot cover gets the top-up link at once', async () => {
    const card = await saveCard('hank', '1.00');
    stand.holdIntentEvents(true);
    try {
      const charged = await f.ctx.billing.charge({
        project: f.project,
        externalId: 'hank',
        amount: '0.99',
        source: 'api',
        trigger,
      });
      expect(charged.ok).toBe(true);
      await quiet(f.server);
      // The recharge is in flight (its webhook held back): the request is refused now, not held up.
      expect(intentCreates(card.customer_id)).toHaveLength(1);
      expect((await rechargesOf(f.ctx, 'hank')).map((r) => r.status)).toEqual(['pending']);
      expect(await chat(f.client, 'hank')).toContain('/topup/');
      // More debits while it is in flight start no second recharge.
      await f.ctx.billing.charge({
        project: f.project,
        externalId: 'hank',
        amount: '0.01',
        source: 'api',
        trigger,
      });
      await quiet(f.server);
      expect(intentCreates(card.customer_id)).toHaveLength(1);
    } finally {
      stand.holdIntentEvents(false);
      await stand.releaseIntentEvents();
    }
    expect((await f.wallet('hank'))!.balance).toBe('1');
    expect(await chat(f.client, 'hank')).not.toMatch(LINK);
  });

  it('only the recharge’s own PaymentIntent credits it: another naming it is kept uncredited', async () => {
    const card = await saveCard('vera', '1.00');
    stand.holdIntentEvents(true);
    let real: (typeof stand.events)[number];
    try {
      await f.ctx.billing.charge({
        project: f.project,
        externalId: 'vera',
        amount: '0.99',
        source: 'api',
        trigger,
      });
      await quiet(f.server);
      const [pending] = await rechargesOf(f.ctx, 'vera');
      expect(pending).toMatchObject({ status: 'pending' });
      real = stand.events
        .filter((e) => e.type === 'payment_intent.succeeded' && e.data.object.customer === card.customer_id)
        .at(-1)!;
      // A PaymentIntent of the same customer, naming the recharge, that Tollgate did not make: 50.00.
      const forged = structuredClone(real);
      forged.id = `${real.id}forged`;
      Object.assign(forged.data.object, {
        id: `${real.data.object.id}forged`,
        amount: 5000,
        amount_received: 5000,
      });
      expect((await stand.deliver(forged)).every((s) => s === 200)).toBe(true);
      expect((await f.wallet('vera'))!.balance).toBe('0.01');
      const kept = await f.ctx.db
        .selectFrom('payments')
        .selectAll()
        .where('payment_intent_id', '=', forged.data.object.id)
        .executeTakeFirstOrThrow();
      expect(kept.status).toBe('uncredited');
      expect(kept.problem).toContain(`names payment ${pending!.id} but is not the one Tollgate created`);
    } finally {
      stand.holdIntentEvents(false);
      await stand.releaseIntentEvents();
    }
    expect((await f.wallet('vera'))!.balance).toBe('1.01');
    await stand.deliver(real);
    expect((await f.wallet('vera'))!.balance).toBe('1.01');
    expect((await rechargesOf(f.ctx, 'vera')).map((r) => r.status)).toEqual(['succeeded']);
  });

  it('a recharge whose webhook never comes and whose payment failed at Stripe is failed by the job', async () => {
    const card = await saveCard('lena', '1.00');
    stand.holdIntentEvents(true);
    try {
      await f.ctx.billing.charge({
        project: f.project,
        externalId: 'lena',
        amount: '0.60',
        source: 'api',
        trigger,
      });
      await quiet(f.server);
      const [pending] = await rechargesOf(f.ctx, 'lena');
      expect(pending).toMatchObject({ status: 'pending' });
      const recharges = f.ctx.payments.recharges;
      await recharges.scan();
      await quiet(f.server);
      expect((await rechargesOf(f.ctx, 'lena'))[0]!.status).toBe('pending'); // not silent long enough
      // An hour later, the PaymentIntent was canceled at Stripe and no event ever came.
      stand.intents.get(pending!.payment_intent_id!)!.status = 'canceled';
      await f.ctx.db
        .updateTable('recharges')
        .set({ updated_at: new Date(Date.now() - 2 * 3600_000) })
        .where('id', '=', pending!.id)
        .execute();
      await recharges.scan();
      await quiet(f.server);
    } finally {
      stand.holdIntentEvents(false);
    }
    expect((await rechargesOf(f.ctx, 'lena'))[0]).toMatchObject({
      status: 'failed',
      failure_code: 'canceled',
    });
    expect(await savedCard(f.ctx, 'lena')).toMatchObject({ auto_recharge: false });
    expect(intentCreates(card.customer_id)).toHaveLength(1);
  });

  it('a declined card turns auto-recharge off, emits payment.recharge.failed, and the portal says why', async () => {
    const card = await saveCard('dora', '1.00');
    stand.cardOutcome(card.payment_method_id!, 'decline');
    for (let i = 0; i < 11; i++) await chat(f.client, 'dora');
    await quiet(f.server);
    expect(intentCreates(card.customer_id)).toHaveLength(1);
    const [recharge] = await rechargesOf(f.ctx, 'dora');
    expect(recharge).toMatchObject({ status: 'failed', failure_code: 'card_declined' });
    // The payment_failed webhook came too (after the 402): applied once only.
    const failedEvents = stand.events.filter(
      (e) => e.type === 'payment_intent.payment_failed' && e.data.object.customer === card.customer_id,
    );
    expect(failedEvents).toHaveLength(1);
    await stand.deliver(failedEvents[0]!);
    const after = await savedCard(f.ctx, 'dora');
    expect(after.auto_recharge).toBe(false);
    expect(after.failure_reason).toContain('insufficient funds');
    const events = (await eventsOf(f.ctx, f.project.id, 'payment.recharge.failed')).filter(
      (e) => (e.envelope as any).data.externalUserId === 'dora',
    );
    expect(events).toHaveLength(1);
    expect((events[0]!.envelope as any).data).toMatchObject({
      code: 'card_declined',
      autoRecharge: 'off',
      amount: '1.00',
    });
    // Off: more chats below the threshold charge nothing, and run into the top-up link when dry.
    for (let i = 0; i < 10; i++) await chat(f.client, 'dora');
    await quiet(f.server);
    expect(intentCreates(card.customer_id)).toHaveLength(1);
    expect(await chat(f.client, 'dora')).toContain('/topup/');

    const portal = (await api(f.server, f.apiKey, 'POST', '/v1/user/portal', { user: 'dora' })).body.url;
    const page = await (await fetch(portal)).text();
    expect(page).toContain('Automatic recharge was turned off');
    expect(page).toContain('Your card has insufficient funds.');
    expect(page).toMatch(/name="autoRecharge" value="on">/); // unchecked

    // Turned on again from the portal, with the user's own threshold and amount (within the limits).
    const proof = /name="confirm" value="([^"]+)"/.exec(page)![1]!;
    const post = (form: Record<string, string>) =>
      fetch(portal, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ confirm: proof, ...form }).toString(),
      });
    const tooBig = await post({ autoRecharge: 'on', threshold: '0.20', rechargeAmount: '500' });
    expect(tooBig.status).toBe(400);
    expect(await tooBig.text()).toContain('Choose a recharge amount from 1.00 USD to 100.00 USD');
    const saved = await post({ autoRecharge: 'on', threshold: '0.20', rechargeAmount: '2' });
    expect(saved.status).toBe(200);
    expect(await saved.text()).toContain('falls below <strong>0.20 USD</strong>, <strong>2.00 USD</strong>');
    expect(await savedCard(f.ctx, 'dora')).toMatchObject({
      auto_recharge: true,
      threshold: '0.20',
      amount: '2.00',
      failure_reason: null,
    });
  });

  it('a card that needs its holder (authentication_required) turns it off the same way', async () => {
    const card = await saveCard('abe', '1.00');
    stand.cardOutcome(card.payment_method_id!, 'authentication_required');
    await f.ctx.billing.charge({
      project: f.project,
      externalId: 'abe',
      amount: '0.60',
      source: 'api',
      trigger,
    });
    await quiet(f.server);
    expect((await rechargesOf(f.ctx, 'abe'))[0]).toMatchObject({
      status: 'failed',
      failure_code: 'authentication_required',
    });
    expect(await savedCard(f.ctx, 'abe')).toMatchObject({ auto_recharge: false });
    const portal = (await api(f.server, f.apiKey, 'POST', '/v1/user/portal', { user: 'abe' })).body.url;
    expect(await (await fetch(portal)).text()).toContain('This transaction requires authentication.');
  });

  it('is not offered unless the project turns it on: no checkbox, no card kept', async () => {
    const { projectId, apiKey } = await seedProject(f.ctx, { name: 'No recharge', models: [model] });
    await connect(f.server, projectId, { presets: ['5'], minimum: '1', maximum: '100' });
    const link = (await api(f.server, apiKey, 'POST', '/v1/user/topup', { user: 'olga' })).body.url as string;
    expect(await (await fetch(link)).text()).not.toContain('recharge automatically');
    const shown = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${projectId}/payments`);
    expect(shown.body.settings.autoRecharge).toMatchObject({ offered: false });
    const bad = await api(f.server, ROOT, 'PATCH', `/admin/v1/projects/${projectId}/payments`, {
      autoRecharge: { offered: true, amount: '0.50' },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error.param).toBe('settings.autoRecharge.amount');

    // An endpoint made before auto-recharge is subscribed to the PaymentIntent events when it is offered.
    const endpoint = stand.endpoints.get(shown.body.webhook.endpointId)!;
    endpoint.enabled_events = endpoint.enabled_events.filter((e: string) => !e.startsWith('payment_intent.'));
    const offered = await api(f.server, ROOT, 'PATCH', `/admin/v1/projects/${projectId}/payments`, {
      autoRecharge: { offered: true },
    });
    expect(offered.status).toBe(200);
    expect(endpoint.enabled_events).toEqual(
      expect.arrayContaining([
        'payment_intent.succeeded',
        'payment_intent.payment_failed',
        'charge.refunded',
      ]),
    );
  });
});

describe('the CLI', () => {
  it('payments auto-recharge over the admin API', async () => {
    const { projectId } = await seedProject(f.ctx, { name: 'CLI recharge' });
    await connect(f.server, projectId, { presets: ['5', '10'], minimum: '5', maximum: '50' });
    const { stdout } = await adminCli(f.server.url, ROOT, [
      'payments',
      'auto-recharge',
      '--project',
      projectId,
      '--offered',
      'on',
      '--threshold',
      '2',
      '--amount',
      '10',
      '--monthly-cap',
      '30',
    ]);
    expect(stdout).toContain(
      'auto-recharge: offered; below 2.00, 10.00 at a time, at most 30.00 a month per user',
    );
  });
});

describe('the dashboard', () => {
  it('offers auto-recharge from the Payments page, with the threshold, amount and cap checked', async () => {
    const { projectId, cookie } = await developerWithProject(f.server, 'recharge', 'Dash recharge');
    await connect(f.server, projectId, { presets: ['5', '10'], minimum: '5', maximum: '50' });
    const url = `${f.server.url}/dashboard/projects/${projectId}/payments`;
    const html = await (await fetch(url, { headers: { cookie } })).text();
    expect(html).toContain('Offer automatic recharge');
    const csrf = /name="csrf" value="([^"]+)"/.exec(html)![1]!;
    const post = (form: Record<string, string>) =>
      fetch(`${url}/auto-recharge`, {
        method: 'POST',
        redirect: 'manual',
        headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ csrf, ...form }).toString(),
      });
    const saved = await post({ offered: 'on', threshold: '2', amount: '10', monthlyCap: '30' });
    expect(saved.status).toBe(303);
    expect(saved.headers.get('location')).toContain('done=auto_recharge_saved');
    const shown = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${projectId}/payments`);
    expect(shown.body.settings.autoRecharge).toEqual({
      offered: true,
      threshold: '2.00',
      amount: '10.00',
      monthlyCap: '30.00',
    });
    expect((await post({ offered: 'on', amount: '60' })).status).toBe(400);
  });
});

const twoPods = Boolean(process.env.TOLLGATE_TEST_PG);

describe.skipIf(!twoPods)('the monthly cap across pods (needs Postgres)', () => {
  let podA: TestServer;
  let podB: TestServer;
  let mock: MockUpstream;

  beforeAll(async () => {
    mock = await startMockUpstream();
    const env = { TOLLGATE_ADMIN_TOKEN: ROOT, STRIPE_API_URL: stand.url };
    [podA, podB] = (await startPods(env, 2)) as [TestServer, TestServer];
  });
  afterAll(async () => {
    await podB?.close();
    await podA?.close();
    await mock?.close();
  });

  it('holds with 32 concurrent requests on one wallet on two app instances', async () => {
    const { projectId, apiKey } = await seedProject(podA.ctx, {
      name: 'Cap',
      upstreamUrl: mock.baseUrl,
      upstreamKey: 'sk-mock-provider-key',
      models: [model],
    });
    await connect(podA, projectId, {
      ...SETTINGS,
      autoRecharge: { offered: true, threshold: '50', amount: '5', monthlyCap: '10' },
    });
    const card = await saveCardAtCheckout(podA, { projectId, apiKey }, 'carl', '5.00');
    const client = (pod: TestServer) =>
      new OpenAI({ baseURL: `${pod.url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });
    const clients = [client(podA), client(podB)];
    const replies = await Promise.all(Array.from({ length: 32 }, (_, i) => chat(clients[i % 2]!, 'carl')));
    for (const reply of replies) expect(reply).not.toMatch(LINK);
    await quiet(podA, podB);
    // Both pods' jobs, at once and again: the cap (10 = two recharges of 5) still holds.
    const scans = () => Promise.all([podA, podB, podA, podB].map((p) => p.ctx.payments.recharges.scan()));
    await scans();
    await quiet(podA, podB);
    await scans();
    await quiet(podA, podB);

    const recharges = await rechargesOf(podA.ctx, 'carl');
    expect(recharges.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
    expect(recharges.reduce((s, r) => s.plus(r.amount), new Money(0)).toFixed()).toBe('10');
    expect(intentCreates(card.customer_id)).toHaveLength(2);
    const wallet = (await findWallet(podA.ctx.db, projectId, 'carl'))!;
    // 5.00 paid at checkout − 32 × 0.05 + 2 × 5 recharged.
    expect(wallet.balance).toBe('13.4');
    // Never two in flight: every reservation saw the previous one settled.
    const pendingNow = await podA.ctx.db
      .selectFrom('recharges')
      .select('id')
      .where('status', '=', 'pending')
      .where('project_id', '=', projectId)
      .execute();
    expect(pendingNow).toHaveLength(0);
  });
});
