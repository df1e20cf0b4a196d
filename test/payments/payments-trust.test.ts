import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';
import { type StandInEvent, type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * Stripe credits only what Tollgate created (issue 35): a session is credited only when it is the one
 * stored for its payment, with the payment's amount and currency; one payment credits once whatever
 * names it; refunds and disputes never take back more than the payment less its earlier reversals.
 * Sessions are made with the official `stripe` library against the loopback stand-in, and every event
 * is delivered signed with the endpoint's secret. Balances are exact.
 */
const ROOT = 'root-admin-token-for-trust-tests-0123456789';
const KEY = 'sk_test_standin_trust_4242';
let stand: StripeStandIn;
let server: TestServer;
let stripe: Stripe;

beforeAll(async () => {
  stand = await startStripeStandIn({ keys: [KEY] });
  server = await startTestServer({ TOLLGATE_ADMIN_TOKEN: ROOT, STRIPE_API_URL: stand.url });
  const base = new URL(stand.url);
  stripe = new Stripe(KEY, { host: base.hostname, port: base.port, protocol: 'http' });
});
afterAll(async () => {
  await server?.close();
  await stand?.close();
});

async function connectedProject(name: string) {
  const project = await seedProject(server.ctx, { name });
  const res = await api(server, ROOT, 'PUT', `/admin/v1/projects/${project.projectId}/payments`, {
    stripeKey: KEY,
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return project;
}

/** The user opens the top-up link and presses Pay: Tollgate's pending payment and its session. */
async function startTopUp(apiKey: string, user: string, amount: string) {
  const link = await api(server, apiKey, 'POST', '/v1/user/topup', { user });
  const url = link.body.url as string;
  const proof = /name="confirm" value="([^"]+)"/.exec(await (await fetch(url)).text())![1]!;
  const pay = await fetch(url, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ confirm: proof, amount: 'custom', custom: amount }).toString(),
  });
  expect(pay.status).toBe(303);
  const sessionId = new URL(pay.headers.get('location')!).pathname.split('/').pop()!;
  const payment = await server.ctx.db
    .selectFrom('payments')
    .selectAll()
    .where('checkout_id', '=', sessionId)
    .executeTakeFirstOrThrow();
  return { sessionId, payment };
}

/** A top-up paid: the session completed and its event delivered. */
async function paidTopUp(apiKey: string, user: string, amount: string) {
  const { sessionId, payment } = await startTopUp(apiKey, user, amount);
  await stand.pay(sessionId);
  const intent = stand.sessions.get(sessionId)!.payment_intent as string;
  const charge = stand.intents.get(intent)!.latest_charge as string;
  return { sessionId, payment, intent, charge };
}

/** A session made in the developer's Stripe account that names a payment, as Tollgate's own do. */
function lookalike(projectId: string, paymentId: string, user: string, amountMinor: number) {
  return stripe.checkout.sessions.create({
    mode: 'payment',
    line_items: [
      {
        quantity: 1,
        price_data: { currency: 'usd', unit_amount: amountMinor, product_data: { name: 'Top-up' } },
      },
    ],
    client_reference_id: paymentId,
    metadata: { tollgate_payment: paymentId, tollgate_project: projectId, tollgate_user: user },
    success_url: 'https://shop.example.com/done',
    cancel_url: 'https://shop.example.com/cancel',
  });
}

/** Delivers an event for a charge or a dispute as Stripe would (a new event id, signed). */
async function deliverAbout(type: string, object: Record<string, unknown>) {
  const template = stand.events.at(-1)!;
  const event: StandInEvent = {
    ...template,
    id: `evt_trust_${Math.random().toString(36).slice(2)}`,
    type,
    data: { object: structuredClone(object) },
  };
  const statuses = await stand.deliver(event);
  expect(statuses.length).toBeGreaterThan(0);
  expect(statuses.every((s) => s === 200)).toBe(true);
}

async function balanceOf(projectId: string, user: string) {
  const wallet = await server.ctx.db
    .selectFrom('end_users')
    .select(['id', 'balance'])
    .where('project_id', '=', projectId)
    .where('external_id', '=', user)
    .executeTakeFirstOrThrow();
  const entries = await server.ctx.db
    .selectFrom('ledger_entries')
    .select(['kind', 'amount'])
    .where('user_id', '=', wallet.id)
    .orderBy('created_at')
    .orderBy('id')
    .execute();
  const sum = entries.reduce((s, e) => s.plus(e.amount), new Money(0));
  expect(sum.eq(wallet.balance)).toBe(true);
  return {
    balance: new Money(wallet.balance).toFixed(2),
    entries: entries.map((e) => `${e.kind} ${new Money(e.amount).toFixed(2)}`),
  };
}

/** A payment's row, its amounts as `5.00`. */
async function paymentRow(id: string) {
  const row = await server.ctx.db
    .selectFrom('payments')
    .selectAll()
    .where('id', '=', id)
    .executeTakeFirstOrThrow();
  const fixed = (v: string) => new Money(v).toFixed(2);
  return {
    ...row,
    amount: fixed(row.amount),
    reversed: fixed(row.reversed),
    disputed: fixed(row.disputed),
    refunded: fixed(row.refunded),
  };
}

describe('sessions Tollgate did not create', () => {
  it('a forged session naming a real payment is acknowledged and kept uncredited; the real one credits 5.00 once; a second session credits nothing', async () => {
    const { projectId, apiKey } = await connectedProject('Forged');
    const { sessionId, payment } = await startTopUp(apiKey, 'mallory', '5.00');

    // A session Tollgate never created names the pending payment and pays 25.00: nothing is credited.
    const forged = await lookalike(projectId, payment.id, 'mallory', 2500);
    const completed = await stand.pay(forged.id, { deliver: false });
    const statuses = [...(await stand.deliver(completed)), ...(await stand.deliver(completed))];
    expect(statuses.every((s) => s === 200)).toBe(true);
    expect((await balanceOf(projectId, 'mallory')).balance).toBe('0.00');
    expect(await paymentRow(payment.id)).toMatchObject({ status: 'pending', checkout_id: sessionId });
    const kept = await server.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('checkout_id', '=', forged.id)
      .execute();
    expect(kept).toHaveLength(1);
    expect(kept[0]).toMatchObject({ status: 'uncredited', external_id: 'mallory' });
    expect(new Money(kept[0]!.amount).toFixed(2)).toBe('25.00');
    expect(kept[0]!.problem).toContain(`names payment ${payment.id} but is not the one Tollgate created`);

    // The session Tollgate created credits its 5.00.
    await stand.pay(sessionId);
    expect(await balanceOf(projectId, 'mallory')).toEqual({ balance: '5.00', entries: ['deposit 5.00'] });

    // A second, real-looking session for the same payment (same reference, same amount): nothing.
    const second = await lookalike(projectId, payment.id, 'mallory', 500);
    await stand.pay(second.id);
    expect(await balanceOf(projectId, 'mallory')).toEqual({ balance: '5.00', entries: ['deposit 5.00'] });
    expect(await paymentRow(payment.id)).toMatchObject({ status: 'paid', amount: '5.00' });

    // Refunding or disputing the forged payment's charge moves nothing of the user's wallet.
    const forgedIntent = stand.sessions.get(forged.id)!.payment_intent as string;
    await stand.refund(forgedIntent);
    await stand.dispute(stand.intents.get(forgedIntent)!.latest_charge as string);
    expect(await balanceOf(projectId, 'mallory')).toEqual({ balance: '5.00', entries: ['deposit 5.00'] });
  });

  it('the session Tollgate created, paid in another amount or currency, credits nothing and says why', async () => {
    const { projectId, apiKey } = await connectedProject('Mismatch');
    const more = await startTopUp(apiKey, 'nina', '5.00');
    stand.sessions.get(more.sessionId)!.amount_total = 2500;
    await stand.pay(more.sessionId);
    const euros = await startTopUp(apiKey, 'nina', '5.00');
    stand.sessions.get(euros.sessionId)!.currency = 'eur';
    await stand.pay(euros.sessionId);

    expect((await balanceOf(projectId, 'nina')).balance).toBe('0.00');
    const amountRow = await paymentRow(more.payment.id);
    expect(amountRow.status).toBe('uncredited');
    expect(amountRow.problem).toBe(
      'Paid 25.00 USD, not the 5.00 USD its payment asked for: not credited. Refund it, or credit the user by hand.',
    );
    const currencyRow = await paymentRow(euros.payment.id);
    expect(currencyRow.status).toBe('uncredited');
    expect(currencyRow.problem).toMatch(/^Paid 5\.00 EUR, not in the project’s currency \(USD\)/);
  });
});

describe('refunds and disputes are capped at the payment', () => {
  it('a refund of 400.00 after a 5.00 payment debits 5.00; a later dispute takes nothing more', async () => {
    const { projectId, apiKey } = await connectedProject('Refund cap');
    await paidTopUp(apiKey, 'oscar', '10.00');
    const small = await paidTopUp(apiKey, 'oscar', '5.00');
    const charge = stand.charges.get(small.charge)!;
    await deliverAbout('charge.refunded', { ...charge, amount_refunded: 40000, refunded: true });
    expect(await balanceOf(projectId, 'oscar')).toEqual({
      balance: '10.00',
      entries: ['deposit 10.00', 'deposit 5.00', 'charge -5.00'],
    });
    expect(await paymentRow(small.payment.id)).toMatchObject({
      status: 'refunded',
      reversed: '5.00',
      refunded: '400.00',
    });

    // A dispute of 40.00 on the same charge: nothing left to take back.
    await stand.dispute(small.charge, { amount: 4000 });
    expect((await balanceOf(projectId, 'oscar')).balance).toBe('10.00');

    // A dispute larger than its own payment, on a fresh one: the payment, no more.
    const other = await paidTopUp(apiKey, 'oscar', '5.00');
    await stand.dispute(other.charge, { amount: 39500 });
    expect(await balanceOf(projectId, 'oscar')).toEqual({
      balance: '10.00',
      entries: ['deposit 10.00', 'deposit 5.00', 'charge -5.00', 'deposit 5.00', 'charge -5.00'],
    });
  });

  it('two partial refunds then a dispute are capped cumulatively; a won dispute gives back only what it took', async () => {
    const { projectId, apiKey } = await connectedProject('Cumulative');
    await paidTopUp(apiKey, 'petra', '10.00');
    const paid = await paidTopUp(apiKey, 'petra', '10.00');
    await stand.refund(paid.intent, 300);
    await stand.refund(paid.intent, 400);
    expect((await balanceOf(projectId, 'petra')).balance).toBe('13.00');
    const opened = await stand.dispute(paid.charge, { amount: 1000 });
    expect(await balanceOf(projectId, 'petra')).toEqual({
      balance: '10.00',
      entries: ['deposit 10.00', 'deposit 10.00', 'charge -3.00', 'charge -4.00', 'charge -3.00'],
    });
    expect(await paymentRow(paid.payment.id)).toMatchObject({ reversed: '10.00', disputed: '3.00' });
    // A replayed refund event and a late one with a smaller total move nothing.
    const refunds = stand.events.filter((e) => e.type === 'charge.refunded');
    await stand.deliver(refunds.at(-1)!);
    await stand.deliver(refunds.at(-2)!);
    expect((await balanceOf(projectId, 'petra')).balance).toBe('10.00');

    await stand.closeDispute(opened.data.object.id as string, 'won');
    expect((await balanceOf(projectId, 'petra')).balance).toBe('13.00');
    expect(await paymentRow(paid.payment.id)).toMatchObject({ reversed: '7.00', disputed: '0.00' });
    // What is left of the payment (3.00) is all a further refund can take.
    await deliverAbout('charge.refunded', { ...stand.charges.get(paid.charge)!, amount_refunded: 1000 });
    expect((await balanceOf(projectId, 'petra')).balance).toBe('10.00');
    await deliverAbout('charge.refunded', { ...stand.charges.get(paid.charge)!, amount_refunded: 5000 });
    expect((await balanceOf(projectId, 'petra')).balance).toBe('10.00');
  });
});
