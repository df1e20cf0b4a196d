import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { Money } from '../../src/core/money.ts';
import { connectUser } from '../../src/users/service.ts';
import { type ChatFixture, perRequestModel, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * The escrow is an implementation detail (issue 35): a pod's slice of a wallet (64 requests' worth here
 * 16, kept 30 s after the last request) is never shown. Outside the pod — the balance API, the refusal's
 * message, the hosted top-up page, the balance events, auto-recharge — `held` is what requests in flight
 * reserved and `available` the balance less that; and a refund taken back by Stripe stops the slice at
 * once. Official clients: `openai` for the requests, `stripe` (the stand-in) for payments.
 */
const ROOT = 'root-admin-token-for-escrow-invisible-0123456789';
const KEY = 'sk_test_standin_escrow_4242';
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const SETTINGS = {
  presets: ['1', '5', '10'],
  minimum: '0.10',
  maximum: '100',
  autoRecharge: { offered: true, threshold: '3', amount: '5', monthlyCap: '50' },
};
const LINK = /\/(topup|connect)\//;

let stand: StripeStandIn;
let f: ChatFixture;

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [KEY] });
  f = await startChatFixture({
    models: [
      perRequestModel('cheap', '0.05'),
      perRequestModel('dear', '0.41'),
      perRequestModel('big', '3.10'),
    ],
    env: {
      TOLLGATE_ADMIN_TOKEN: ROOT,
      STRIPE_API_URL: stand.url,
      ESCROW_IDLE_MS: '30000',
      ESCROW_SLICE_REQUESTS: '16',
    },
  });
  const res = await api(f.server, ROOT, 'PUT', `/admin/v1/projects/${f.project.id}/payments`, {
    stripeKey: KEY,
    settings: SETTINGS,
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  await f.subscribe(['balance.*', 'payment.*']);
});
afterAll(async () => {
  await f?.close();
  await stand?.close();
});

async function chat(user: string, model: string): Promise<string> {
  const res = await f.client.chat.completions.create({
    model,
    user,
    messages: [{ role: 'user', content: 'hello' }],
  });
  return res.choices[0]!.message.content ?? '';
}

async function balance(user: string) {
  const res = await api(f.server, f.apiKey, 'GET', `/v1/user/balance?user=${user}`);
  expect(res.status).toBe(200);
  return res.body as { balance: string; held: string; available: string };
}

/** The pods' slices of the wallet: what nobody outside the pod sees. */
async function slices(ctx: AppContext, user: string): Promise<string> {
  const row = await ctx.db
    .selectFrom('end_users')
    .select('held')
    .where('project_id', '=', f.project.id)
    .where('external_id', '=', user)
    .executeTakeFirstOrThrow();
  return new Money(row.held).toFixed();
}

/** Every settle, recharge and webhook the stand-in sent, done. */
async function quiet() {
  await f.settled();
  await f.ctx.payments.recharges.idle();
  await stand.idle();
}

/** Pays `amount` on the hosted checkout (saving the card when asked); returns the PaymentIntent's id. */
async function payAtCheckout(user: string, amount: string, saveCard = false): Promise<string> {
  await connectUser(f.ctx.db, f.ctx.events, f.project, user, trigger);
  const link = (await api(f.server, f.apiKey, 'POST', '/v1/user/topup', { user })).body.url as string;
  const page = await (await fetch(link)).text();
  const proof = /name="confirm" value="([^"]+)"/.exec(page)![1]!;
  const form: Record<string, string> = { confirm: proof, amount: 'custom', custom: amount };
  if (saveCard) form.saveCard = 'on';
  const res = await fetch(link, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams(form).toString(),
  });
  expect(res.status).toBe(303);
  const sessionId = new URL(res.headers.get('location')!).pathname.split('/').pop()!;
  await stand.pay(sessionId);
  await quiet();
  const payment = await f.ctx.db
    .selectFrom('payments')
    .select('payment_intent_id')
    .where('checkout_id', '=', sessionId)
    .executeTakeFirstOrThrow();
  return payment.payment_intent_id!;
}

describe('the held amount users see', () => {
  it('is 0 right after a chat, with the whole balance available, while the pod keeps its slice', async () => {
    await f.fund('bea', '1');
    expect(await chat('bea', 'cheap')).not.toMatch(LINK);
    await f.settled();
    expect(await balance('bea')).toMatchObject({ balance: '0.95', held: '0.00', available: '0.95' });
    expect(await slices(f.ctx, 'bea')).toBe('0.75'); // 16 × 0.05, less the charge
    // the dashboard's list of users says the same
    const listed = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${f.project.id}/users?q=bea`);
    expect(listed.body.data[0]).toMatchObject({ balance: '0.95', held: '0.00', available: '0.95' });
  });

  it('refuses with the real available balance, and the top-up page asks for the gap', async () => {
    await f.fund('cal', '0.30');
    expect(await chat('cal', 'cheap')).not.toMatch(LINK); // the slice takes all 0.30
    await f.settled();
    expect(await slices(f.ctx, 'cal')).toBe('0.25');
    const refused = await chat('cal', 'dear');
    expect(refused).toContain('(0.41 usd needed, 0.25 usd available)');
    const link = /https?:\/\/\S+\/topup\/[A-Za-z0-9._-]+/.exec(refused)![0];
    const page = await (await fetch(link)).text();
    expect(page).toContain('<dt>Needed</dt><dd><strong>0.16 USD</strong></dd>');
    expect(page).toContain('<dt>Available balance</dt><dd>0.25 USD</dd>');
    // a top-up of the gap is enough
    await f.ctx.billing.deposit({
      project: f.project,
      externalId: 'cal',
      amount: '0.16',
      source: 't',
      trigger,
    });
    expect(await chat('cal', 'dear')).not.toMatch(LINK);
    await f.settled();
    expect(await balance('cal')).toMatchObject({ balance: '0.00', held: '0.00', available: '0.00' });
  });

  it('balance.low and balance.depleted carry the real available balance', async () => {
    await f.fund('dot', '0.10');
    await f.ctx.db
      .updateTable('end_users')
      .set({ low_balance_threshold: '0.08' })
      .where('project_id', '=', f.project.id)
      .where('external_id', '=', 'dot')
      .execute();
    expect(await chat('dot', 'cheap')).not.toMatch(LINK); // 0.05: below 0.08
    expect(await chat('dot', 'cheap')).not.toMatch(LINK); // 0.00: depleted
    const mine = (envelopes: any[]) =>
      envelopes.filter((e) => e.data.externalUserId === 'dot').map((e) => e.data);
    expect(mine(await f.events('balance.low'))).toEqual([
      expect.objectContaining({ balance: '0.05', available: '0.05', threshold: '0.08' }),
    ]);
    expect(mine(await f.events('balance.depleted'))).toEqual([
      expect.objectContaining({ balance: '0', available: '0' }),
    ]);
  });
});

describe('auto-recharge', () => {
  it('never charges the card while the available balance is at or above the threshold', async () => {
    await payAtCheckout('eve', '50.00', true);
    const card = await f.ctx.db
      .selectFrom('payment_customers as c')
      .innerJoin('end_users as e', 'e.id', 'c.user_id')
      .select(['c.customer_id', 'c.auto_recharge'])
      .where('e.external_id', '=', 'eve')
      .executeTakeFirstOrThrow();
    expect(card.auto_recharge).toBe(true);
    const intents = () =>
      stand.requests.filter(
        (r) =>
          r.method === 'POST' && r.path === '/v1/payment_intents' && r.body.customer === card.customer_id,
      );
    // one request of 3.10: the pod's slice takes the whole 50.00 (16 × 3.10 = 49.60 … all of it)
    expect(await chat('eve', 'big')).not.toMatch(LINK);
    await quiet();
    expect(new Money(await slices(f.ctx, 'eve')).gt(40)).toBe(true);
    expect(await balance('eve')).toMatchObject({ balance: '46.90', held: '0.00', available: '46.90' });
    expect(intents()).toHaveLength(0);
    // 14 more: 46.90 − 14 × 3.10 = 3.50, still at or above 3 — no recharge
    for (let i = 0; i < 14; i++) expect(await chat('eve', 'big')).not.toMatch(LINK);
    await quiet();
    expect((await balance('eve')).available).toBe('3.50');
    expect(intents()).toHaveLength(0);
    // the next one crosses: 0.40 < 3 — one recharge of 5.00, credited by its webhook
    expect(await chat('eve', 'big')).not.toMatch(LINK);
    await quiet();
    expect(intents()).toHaveLength(1);
    expect(intents()[0]!.body).toMatchObject({ amount: '500', currency: 'usd' });
    expect(await balance('eve')).toMatchObject({ balance: '5.40', held: '0.00', available: '5.40' });
  });
});

describe('a refund after a partly spent payment', () => {
  it('stops service at once: the slice is taken back before the refund commits', async () => {
    const intent = await payAtCheckout('fay', '1.00');
    for (let i = 0; i < 3; i++) expect(await chat('fay', 'cheap')).not.toMatch(LINK);
    await f.settled();
    expect(await slices(f.ctx, 'fay')).toBe('0.65'); // 16 × 0.05 = 0.80, less three charges
    await stand.refund(intent); // the whole 1.00, from Stripe's dashboard
    await quiet();
    expect(await balance('fay')).toMatchObject({ balance: '-0.15', held: '0.00', available: '-0.15' });
    // the next request is refused with the top-up link: nothing more is served from the old slice
    const refused = await chat('fay', 'cheap');
    expect(refused).toContain('/topup/');
    await f.settled();
    expect(await slices(f.ctx, 'fay')).toBe('0');
    expect((await balance('fay')).balance).toBe('-0.15');
    const entries = await f.ledger('fay');
    expect(entries.map((e) => [e.kind, new Money(e.amount).toFixed()])).toEqual([
      ['deposit', '1'],
      ['charge', '-0.05'],
      ['charge', '-0.05'],
      ['charge', '-0.05'],
      ['charge', '-1'],
    ]);
  });
});

describe('activity', () => {
  it('replays after 40 concurrent chats, deposits, grants and charges: each balance is the previous one plus its amount', async () => {
    await f.fund('gil', '5');
    const ops = Array.from({ length: 40 }, (_, i) => {
      switch (i % 4) {
        case 0:
          return chat('gil', 'cheap');
        case 1:
          return api(f.server, f.apiKey, 'POST', '/v1/user/balance/deposit', { user: 'gil', amount: '0.10' });
        case 2:
          return api(f.server, f.apiKey, 'POST', '/v1/user/credits', {
            user: 'gil',
            amount: '0.03',
            reason: 'promo',
          });
        default:
          return api(f.server, f.apiKey, 'POST', '/v1/user/charge', { user: 'gil', amount: '0.07' });
      }
    });
    await Promise.all(ops);
    await f.settled();
    const listed: Array<{ amount: string; balance: string; type: string }> = [];
    let after: string | undefined;
    for (;;) {
      const page = await api(
        f.server,
        f.apiKey,
        'GET',
        `/v1/user/activity?user=gil&limit=15${after ? `&after=${after}` : ''}`,
      );
      expect(page.status).toBe(200);
      listed.push(...page.body.data);
      if (!page.body.has_more) break;
      after = page.body.last_id;
    }
    expect(listed).toHaveLength(41);
    const oldestFirst = listed.reverse();
    let replayed = new Money(0);
    const chain = oldestFirst.map((e) => {
      replayed = replayed.plus(e.amount);
      return { type: e.type, balance: e.balance, replayed: replayed.toFixed(2) };
    });
    expect(chain).toEqual(chain.map((c) => ({ ...c, balance: c.replayed })));
    // 5 + 10 × (−0.05 + 0.10 + 0.03 − 0.07) = 5.10
    expect(chain.at(-1)!.balance).toBe('5.10');
    expect(await balance('gil')).toMatchObject({ balance: '5.10', held: '0.00', available: '5.10' });
  });
});
