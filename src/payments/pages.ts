import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { findWallet } from '../billing/ledger.ts';
import { safeEqual } from '../core/crypto.ts';
import { amountSchema, formatForCurrency, Money } from '../core/money.ts';
import type { PaymentSettings } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { createLinkToken, linkUrl } from '../users/links.ts';
import { html, PRIVATE_HEADERS, problemPage, type Raw, raw, sendPage, TOKEN_SHAPE } from '../users/pages.ts';
import { openLink } from '../users/service.ts';
import { PaymentProviderError } from './provider.ts';
import { autoRechargeOf, setAutoRecharge } from './recharge.ts';
import { checkSettings, type PaymentsContext, paymentsOf, startCheckout } from './service.ts';

/**
 * The hosted pages of payments (no API key; signed tokens are the credentials), in the look of the
 * connect page (../users/pages.ts registers them in its scope, which parses form posts):
 * - `GET /topup/{token}` with payments connected — the checkout page: the user, the amount needed, the
 *   available balance, the project's preset amounts and a custom amount, and "Pay"
 * - `POST /topup/{token}` — the page's own form (a hidden field only the page carries): creates the
 *   provider's checkout and answers 303 to it; the provider's cancel comes back to the top-up page
 * - `GET /payments/done/{token}` — where the provider returns after paying
 * - `GET /portal/{token}` — the user's portal: balance, top-ups with receipts, usage, a top-up button
 */

type Ctx = FastifyInstance['ctx'];

/** Whether the top-up link of this project leads to the hosted checkout. */
export async function hostedCheckout(ctx: Ctx, projectId: string) {
  return paymentsOf(ctx as PaymentsContext, projectId);
}

function linkSettings(ctx: Ctx) {
  return {
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
  };
}

/** A signed link to a user's portal (`POST /v1/user/portal`, the top-up and done pages). */
export function portalLink(ctx: Ctx, projectId: string, externalId: string) {
  const s = linkSettings(ctx);
  const token = createLinkToken(s.sealer, {
    kind: 'portal',
    projectId,
    externalId,
    ttlSeconds: s.ttlSeconds,
  });
  const url = linkUrl(s.publicBaseUrl, 'portal', token);
  const exp = JSON.parse(Buffer.from(token.split('.')[0]!, 'base64url').toString('utf8')).exp as number;
  return { url, expiresAt: new Date(exp * 1000).toISOString() };
}

function topupUrl(ctx: Ctx, projectId: string, externalId: string): string {
  const s = linkSettings(ctx);
  const token = createLinkToken(s.sealer, { kind: 'topup', projectId, externalId, ttlSeconds: s.ttlSeconds });
  return linkUrl(s.publicBaseUrl, 'topup', token);
}

/** `{payment id}.{signature}`: the done page's token (a payment id is not a secret, the pairing is). */
function doneToken(ctx: Ctx, paymentId: string): string {
  const body = Buffer.from(paymentId).toString('base64url');
  return `${body}.${ctx.sealer.sign(`payment-done:${body}`)}`;
}

function formProof(ctx: Ctx, token: string): string {
  return ctx.sealer.sign(`topup-form:${token}`);
}

/** Page CSS beside the connect page's; a string, not raw(): ../users/pages.ts imports this module. */
const CHECKOUT_STYLE = `<style>
fieldset{border:0;padding:0;margin:0 0 1rem}
.amounts{display:flex;flex-wrap:wrap;gap:.5rem;margin:.5rem 0 1rem}
.amounts label{border:1px solid var(--muted);border-radius:8px;padding:.5rem .9rem;cursor:pointer}
.amounts input{margin-right:.4rem}
input[type=text]{font:inherit;padding:.45rem .6rem;border-radius:6px;border:1px solid var(--muted);width:9rem}
dl{display:grid;grid-template-columns:auto 1fr;gap:.25rem 1rem;margin:0 0 1rem}
dt{color:var(--muted)}dd{margin:0}
.error{color:#c62828;font-weight:600}
table{border-collapse:collapse;width:100%;margin:0 0 1rem;font-size:.925rem}
th,td{text-align:left;padding:.3rem .4rem;border-bottom:1px solid rgba(127,127,127,.25)}
</style>`;

async function checkoutPage(
  reply: FastifyReply,
  ctx: Ctx,
  input: {
    project: ProjectContext;
    user: string;
    needed: string | undefined;
    settings: Required<PaymentSettings>;
    proof: string;
    notice?: string | undefined;
    error?: string | undefined;
    status?: number;
  },
) {
  const { project, user, settings } = input;
  const currency = project.currency;
  const money = (v: string) => `${formatForCurrency(v, currency)} ${currency.toUpperCase()}`;
  const wallet = await findWallet(ctx.db, project.id, user);
  const available = wallet?.available ?? '0';
  // The first preset that covers what is needed is chosen; none does: the custom amount, prefilled.
  const needed = input.needed && new Money(input.needed).gt(0) ? input.needed : undefined;
  const chosen = settings.presets.find((p) => !needed || new Money(p).gte(needed));
  const custom = chosen
    ? ''
    : formatForCurrency(Money.max(new Money(needed ?? settings.minimum), settings.minimum), currency);
  const portal = portalLink(ctx, project.id, user).url;
  return sendPage(
    reply,
    input.status ?? 200,
    `Top up your ${project.name} balance`,
    html`${raw(CHECKOUT_STYLE)}<h1>Top up your ${project.name} balance</h1>
${input.notice ? html`<p class="muted">${input.notice}</p>` : raw('')}
${input.error ? html`<p class="error" role="alert">${input.error}</p>` : raw('')}
<dl>
<dt>Account</dt><dd>${user}</dd>
${needed ? html`<dt>Needed</dt><dd><strong>${money(needed)}</strong></dd>` : raw('')}
<dt>Available balance</dt><dd>${money(available)}</dd>
</dl>
<form method="post">
<input type="hidden" name="confirm" value="${input.proof}">
<fieldset>
<legend>Amount</legend>
<div class="amounts">
${settings.presets.map(
  (p) =>
    html`<label><input type="radio" name="amount" value="${p}"${raw(p === chosen ? ' checked' : '')}>${money(p)}</label>`,
)}
<label><input type="radio" name="amount" value="custom"${raw(chosen ? '' : ' checked')}>Other:</label>
</div>
<label>Other amount (${money(settings.minimum)} to ${money(settings.maximum)}):
<input type="text" name="custom" inputmode="decimal" value="${custom}" aria-label="Other amount"></label>
</fieldset>
${
  settings.autoRecharge.offered
    ? html`<p><label><input type="checkbox" name="saveCard" value="on"> Save this card and recharge automatically: when your available balance falls below ${money(settings.autoRecharge.threshold)}, ${money(settings.autoRecharge.amount)} is charged to it (at most ${money(settings.autoRecharge.monthlyCap)} a month; change or turn it off in your portal)</label></p>`
    : raw('')
}
<button type="submit">Pay</button>
</form>
<p class="muted">You pay on a secure checkout page; your balance is credited as soon as the payment is confirmed. <a href="${portal}">Your balance and receipts</a></p>`,
  );
}

/** The amount the form chose, checked against the currency and the project's minimum and maximum. */
function chosenAmount(
  body: Record<string, unknown>,
  currency: string,
  settings: Required<PaymentSettings>,
): { ok: true; amount: string } | { ok: false; error: string } {
  const pick = typeof body.amount === 'string' ? body.amount : '';
  const value = pick === 'custom' || pick === '' ? String(body.custom ?? '').trim() : pick;
  const parsed = amountSchema(currency).safeParse(value);
  if (!parsed.success) return { ok: false, error: `Enter an amount such as ${settings.minimum}.` };
  const amount = parsed.data;
  if (new Money(amount).lt(settings.minimum) || new Money(amount).gt(settings.maximum)) {
    const m = (v: string) => `${formatForCurrency(v, currency)} ${currency.toUpperCase()}`;
    return { ok: false, error: `Choose an amount from ${m(settings.minimum)} to ${m(settings.maximum)}.` };
  }
  return { ok: true, amount };
}

function isOwnForm(request: FastifyRequest, expected: string): boolean {
  if (request.headers['sec-fetch-site'] === 'cross-site') return false;
  const type = String(request.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  if (type !== 'application/x-www-form-urlencoded') return false;
  const proof = (request.body as Record<string, unknown> | undefined)?.confirm;
  return typeof proof === 'string' && safeEqual(proof, expected);
}

/** The GET /topup/{token} answer when payments are connected (../users/pages.ts asks first). */
export async function topupCheckoutPage(
  reply: FastifyReply,
  ctx: Ctx,
  request: FastifyRequest,
  input: {
    token: string;
    project: ProjectContext;
    user: string;
    needed: string | undefined;
    settings: PaymentSettings;
  },
) {
  const cancelled = (request.query as Record<string, unknown> | undefined)?.cancelled !== undefined;
  return checkoutPage(reply, ctx, {
    project: input.project,
    user: input.user,
    needed: input.needed,
    settings: checkSettings(input.project.currency, input.settings),
    proof: formProof(ctx, input.token),
    notice: cancelled ? 'The payment was cancelled; nothing was charged.' : undefined,
  });
}

const tokenParam = (request: FastifyRequest) => (request.params as { '*': string })['*'];

export async function paymentPageRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;

  app.post('/topup/*', async (request, reply) => {
    const token = tokenParam(request);
    if (!TOKEN_SHAPE.test(token)) return problemPage(reply, 'malformed');
    const opened = await openLink(ctx, 'topup', token);
    if (!opened.ok) return problemPage(reply, opened.problem);
    const { project, payload } = opened;
    const payments = await hostedCheckout(ctx, project.id);
    if (!payments) return reply.headers(PRIVATE_HEADERS).redirect(`/topup/${token}`, 303);
    const settings = checkSettings(project.currency, payments.connection.settings);
    const proof = formProof(ctx, token);
    const needed = typeof payload.a === 'string' ? payload.a : undefined;
    const again = (error: string, status: number) =>
      checkoutPage(reply, ctx, { project, user: payload.u, needed, settings, proof, error, status });
    if (!isOwnForm(request, proof)) return again('Press Pay on this page to pay.', 400);
    const body = (request.body ?? {}) as Record<string, unknown>;
    const chosen = chosenAmount(body, project.currency, settings);
    if (!chosen.ok) return again(chosen.error, 400);
    const saveCard = settings.autoRecharge.offered && body.saveCard === 'on';
    try {
      const checkout = await startCheckout(ctx, {
        project,
        externalId: payload.u,
        amount: chosen.amount,
        successUrl: (paymentId) => `${ctx.publicBaseUrl}/payments/done/${doneToken(ctx, paymentId)}`,
        cancelUrl: `${ctx.publicBaseUrl}/topup/${token}?cancelled=1`,
        saveCard,
      });
      return reply.headers(PRIVATE_HEADERS).redirect(checkout.url, 303);
    } catch (err) {
      if (!(err instanceof PaymentProviderError)) throw err;
      request.log.warn({ err, projectId: project.id }, 'could not create a checkout');
      return again('The payment page could not be opened. Please try again in a moment.', 502);
    }
  });

  app.get('/payments/done/*', async (request, reply) => {
    const token = tokenParam(request);
    if (!TOKEN_SHAPE.test(token)) return problemPage(reply, 'malformed');
    const [body, signature] = token.split('.') as [string, string];
    if (!safeEqual(ctx.sealer.sign(`payment-done:${body}`), signature)) return problemPage(reply, 'forged');
    const paymentId = Buffer.from(body, 'base64url').toString('utf8');
    const payment = await ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('id', '=', paymentId)
      .executeTakeFirst();
    if (!payment) return problemPage(reply, 'forged');
    const project = await ctx.projects.get(payment.project_id);
    if (!project) return problemPage(reply, 'unknown_project');
    const money = (v: string) =>
      `${formatForCurrency(v, payment.currency)} ${payment.currency.toUpperCase()}`;
    const wallet = await findWallet(ctx.db, project.id, payment.external_id);
    const paid = payment.status !== 'pending' && payment.status !== 'failed';
    const portal = portalLink(ctx, project.id, payment.external_id).url;
    return sendPage(
      reply,
      200,
      paid ? 'Payment received' : 'Payment being confirmed',
      html`<h1>${paid ? 'Thank you — payment received' : 'Thank you — your payment is being confirmed'}</h1>
${
  paid
    ? html`<p><strong>${money(payment.amount)}</strong> was added to your ${project.name} balance.</p>`
    : html`<p>Your ${money(payment.amount)} top-up is credited as soon as the payment is confirmed, usually within seconds.</p>`
}
<p>Available balance: <strong>${money(wallet?.available ?? '0')}</strong></p>
${payment.receipt_url ? html`<p><a href="${payment.receipt_url}">Receipt</a></p>` : raw('')}
<p>You can close this page and go back to ${project.name}. <a href="${portal}">Your balance and receipts</a></p>`,
    );
  });

  const openPortal = async (request: FastifyRequest, reply: FastifyReply) => {
    const token = tokenParam(request);
    if (!TOKEN_SHAPE.test(token)) {
      await problemPage(reply, 'malformed');
      return undefined;
    }
    const opened = await openLink(ctx, 'portal', token);
    if (!opened.ok) {
      await problemPage(reply, opened.problem);
      return undefined;
    }
    return { token, project: opened.project, user: opened.payload.u };
  };

  app.get('/portal/*', async (request, reply) => {
    const opened = await openPortal(request, reply);
    if (!opened) return reply;
    return portalPage(reply, ctx, opened);
  });

  // The portal's auto-recharge form: on/off, the user's own threshold and amount.
  app.post('/portal/*', async (request, reply) => {
    const opened = await openPortal(request, reply);
    if (!opened) return reply;
    const proof = ctx.sealer.sign(`portal-form:${opened.token}`);
    if (!isOwnForm(request, proof))
      return portalPage(reply, ctx, { ...opened, error: 'Press Save on this page.', status: 400 });
    const wallet = await findWallet(ctx.db, opened.project.id, opened.user);
    if (!wallet)
      return portalPage(reply, ctx, { ...opened, error: 'Top up first to save a card.', status: 400 });
    const body = (request.body ?? {}) as Record<string, unknown>;
    const saved = await setAutoRecharge(ctx as PaymentsContext, opened.project, wallet.userId, {
      on: body.autoRecharge === 'on',
      threshold: String(body.threshold ?? ''),
      amount: String(body.rechargeAmount ?? ''),
    });
    if (!saved.ok) return portalPage(reply, ctx, { ...opened, error: saved.error, status: 400 });
    return portalPage(reply, ctx, { ...opened, notice: 'Saved.' });
  });
}

async function portalPage(
  reply: FastifyReply,
  ctx: Ctx,
  input: {
    token: string;
    project: ProjectContext;
    user: string;
    notice?: string;
    error?: string;
    status?: number;
  },
) {
  const { project, user } = input;
  const money = (v: string) => `${formatForCurrency(v, project.currency)} ${project.currency.toUpperCase()}`;
  const wallet = await findWallet(ctx.db, project.id, user);
  const payments = wallet
    ? await ctx.db
        .selectFrom('payments')
        .selectAll()
        .where('project_id', '=', project.id)
        .where('user_id', '=', wallet.userId)
        .where('status', '!=', 'pending')
        .orderBy('id', 'desc')
        .limit(50)
        .execute()
    : [];
  const activity = wallet
    ? await ctx.db
        .selectFrom('ledger_entries')
        .select(['id', 'kind', 'amount', 'source', 'description', 'created_at'])
        .where('user_id', '=', wallet.userId)
        .where('kind', 'in', ['deposit', 'charge'])
        .orderBy('id', 'desc')
        .limit(30)
        .execute()
    : [];
  const day = (d: Date) => d.toISOString().slice(0, 16).replace('T', ' ');
  const rows = (items: Raw[], columns: number) =>
    items.length ? items : [html`<tr><td colspan="${columns}">None yet.</td></tr>`];
  const recharge = await autoRechargeOf(ctx as PaymentsContext, project, wallet?.userId);
  return sendPage(
    reply,
    input.status ?? 200,
    `Your ${project.name} balance`,
    html`${raw(CHECKOUT_STYLE)}<h1>Your ${project.name} balance</h1>
<dl>
<dt>Account</dt><dd>${user}</dd>
<dt>Balance</dt><dd><strong>${money(wallet?.balance ?? '0')}</strong></dd>
<dt>Available</dt><dd>${money(wallet?.available ?? '0')}</dd>
</dl>
${input.notice ? html`<p class="muted" role="status">${input.notice}</p>` : raw('')}
${input.error ? html`<p class="error" role="alert">${input.error}</p>` : raw('')}
<p><a class="button" href="${topupUrl(ctx, project.id, user)}">Top up</a></p>
${recharge ? rechargeSection(ctx, input.token, recharge, money, project.currency) : raw('')}
<h2>Top-ups</h2>
<table><thead><tr><th>Date</th><th>Amount</th><th>Status</th><th>Receipt</th></tr></thead><tbody>
${rows(
  payments.map(
    (p) =>
      html`<tr><td>${day(p.paid_at ?? p.created_at)}</td><td>${money(p.amount)}</td><td>${p.status}${
        new Money(p.refunded).gt(0) ? html` (${money(p.refunded)} refunded)` : raw('')
      }</td><td>${p.receipt_url ? html`<a href="${p.receipt_url}">Receipt</a>` : raw('—')}</td></tr>`,
  ),
  4,
)}
</tbody></table>
<h2>Usage and credits</h2>
<table><thead><tr><th>Date</th><th>What</th><th>Amount</th></tr></thead><tbody>
${rows(
  activity.map(
    (e) =>
      html`<tr><td>${day(e.created_at)}</td><td>${e.description ?? `${e.kind} (${e.source})`}</td><td>${money(e.amount)}</td></tr>`,
  ),
  3,
)}
</tbody></table>
<p class="muted">This page is private to you; the link expires.</p>`,
  );
}

function rechargeSection(
  ctx: Ctx,
  token: string,
  r: NonNullable<Awaited<ReturnType<typeof autoRechargeOf>>>,
  money: (v: string) => string,
  currency: string,
): Raw {
  const failed = r.failureReason
    ? html`<p class="error" role="alert" id="recharge-failed">Automatic recharge was turned off: the last recharge failed — ${r.failureReason} Turn it on again once the card works, or save another card at your next top-up.</p>`
    : raw('');
  if (!r.saved)
    return html`<h2>Automatic recharge</h2>${failed}<p class="muted">Tick “save this card and recharge automatically” when you top up, and your balance is recharged when it runs low.</p>`;
  return html`<h2>Automatic recharge</h2>${failed}
<p>${r.on ? html`On: when your available balance falls below <strong>${money(r.threshold)}</strong>, <strong>${money(r.amount)}</strong> is charged to your saved card (at most ${money(r.settings.monthlyCap)} a month).` : raw('Off.')}</p>
<form method="post">
<input type="hidden" name="confirm" value="${ctx.sealer.sign(`portal-form:${token}`)}">
<p><label><input type="checkbox" name="autoRecharge" value="on"${raw(r.on ? ' checked' : '')}> Recharge automatically</label></p>
<p><label>When the balance falls below: <input type="text" name="threshold" inputmode="decimal" value="${formatForCurrency(r.threshold, currency)}"></label></p>
<p><label>Recharge (${money(r.minimum)} to ${money(r.maximum)}): <input type="text" name="rechargeAmount" inputmode="decimal" value="${formatForCurrency(r.amount, currency)}"></label></p>
<button type="submit">Save</button>
</form>`;
}
