import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';
import { type StripeStandIn, startStripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * A paid checkout that cannot be credited — paid in another currency than the project's, or for a
 * payment (and a user) Tollgate does not know — is acknowledged, credits nothing, and is kept as an
 * `uncredited` payment with the reason, which the developer sees in the payments list of the admin API.
 * The checkouts are made with the official `stripe` library against the loopback stand-in of Stripe.
 */
const ROOT = 'root-admin-token-for-uncredited-tests-0123456789';
const KEY = 'sk_test_standin_uncredited_4242';
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

const admin = (method: string, path: string, body?: unknown) =>
  api(server, ROOT, method, `/admin/v1${path}`, body);

async function connectedProject(name: string) {
  const project = await seedProject(server.ctx, { name });
  const res = await admin('PUT', `/projects/${project.projectId}/payments`, { stripeKey: KEY });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return project;
}

/** A checkout made in the developer's Stripe account, with the reference Tollgate writes on its own. */
function checkout(input: { currency: string; amount: number; metadata: Record<string, string> }) {
  return stripe.checkout.sessions.create({
    mode: 'payment',
    line_items: [
      {
        quantity: 1,
        price_data: { currency: input.currency, unit_amount: input.amount, product_data: { name: 'Top-up' } },
      },
    ],
    ...(input.metadata.tollgate_payment ? { client_reference_id: input.metadata.tollgate_payment } : {}),
    metadata: input.metadata,
    success_url: 'https://shop.example.com/done',
    cancel_url: 'https://shop.example.com/cancel',
  });
}

async function depositsOf(projectId: string) {
  return server.ctx.db
    .selectFrom('ledger_entries')
    .select(['kind', 'amount'])
    .where('project_id', '=', projectId)
    .where('kind', '=', 'deposit')
    .execute();
}

async function listed(projectId: string) {
  const res = await admin('GET', `/projects/${projectId}/payments/list`);
  expect(res.status).toBe(200);
  return res.body.data as Array<Record<string, unknown>>;
}

describe('a paid checkout that cannot be credited', () => {
  it('a session naming a pending payment, paid in another currency: acknowledged, nothing credited, kept as uncredited with the reason', async () => {
    const { projectId, apiKey } = await connectedProject('Shop USD');
    // The user opens the top-up page and presses Pay: a pending payment in the project's currency.
    const link = await api(server, apiKey, 'POST', '/v1/user/topup', { user: 'erin' });
    const page = await (await fetch(link.body.url as string)).text();
    const proof = /name="confirm" value="([^"]+)"/.exec(page)![1]!;
    const pay = await fetch(link.body.url as string, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ confirm: proof, amount: 'custom', custom: '10.00' }).toString(),
    });
    expect(pay.status).toBe(303);
    const pending = await server.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('project_id', '=', projectId)
      .executeTakeFirstOrThrow();
    // Its reference on a checkout paid in euros.
    const session = await checkout({
      currency: 'eur',
      amount: 1000,
      metadata: { tollgate_payment: pending.id, tollgate_project: projectId, tollgate_user: 'erin' },
    });
    const completed = await stand.pay(session.id, { deliver: false });
    const statuses = [...(await stand.deliver(completed)), ...(await stand.deliver(completed))];
    expect(statuses.every((s) => s === 200)).toBe(true);

    expect(await depositsOf(projectId)).toEqual([]);
    // Not the session Tollgate created for the payment: the payment stays pending, the checkout is kept
    // once, beside it, as uncredited.
    const row = await server.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('id', '=', pending.id)
      .executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'pending' });
    const kept = await server.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('checkout_id', '=', session.id)
      .execute();
    expect(kept).toHaveLength(1);
    expect(kept[0]).toMatchObject({ status: 'uncredited', external_id: 'erin', currency: 'eur' });
    expect(kept[0]!.problem).toMatch(/10\.00 EUR/);
    const shown = (await listed(projectId)).find((p) => p.id === kept[0]!.id);
    expect(shown).toMatchObject({ status: 'uncredited', user: 'erin', checkoutId: session.id });
    expect(shown?.problem).toMatch(
      new RegExp(`names payment ${pending.id} but is not the one Tollgate created`),
    );
  });

  it('for a payment and a user Tollgate does not know: kept once, without a wallet; a foreign checkout is not kept', async () => {
    const { projectId } = await connectedProject('Shop unknown');
    const session = await checkout({
      currency: 'usd',
      amount: 700,
      metadata: { tollgate_payment: 'pay_unknown', tollgate_project: projectId, tollgate_user: 'ghost' },
    });
    const completed = await stand.pay(session.id, { deliver: false });
    await Promise.all([stand.deliver(completed), stand.deliver(completed)]);
    // A checkout of something else in the same Stripe account carries no reference of Tollgate's.
    const foreign = await checkout({ currency: 'usd', amount: 900, metadata: {} });
    await stand.pay(foreign.id);

    expect(await depositsOf(projectId)).toEqual([]);
    const users = await server.ctx.db
      .selectFrom('end_users')
      .select('id')
      .where('project_id', '=', projectId)
      .execute();
    expect(users).toEqual([]);
    const rows = await server.ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('project_id', '=', projectId)
      .execute();
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      status: 'uncredited',
      user_id: null,
      external_id: 'ghost',
      currency: 'usd',
      checkout_id: session.id,
    });
    const [shown] = await listed(projectId);
    expect(shown).toMatchObject({ status: 'uncredited', user: 'ghost', amount: '7.00', currency: 'usd' });
    expect(shown?.problem).toMatch(/pay_unknown/);
  });
});
