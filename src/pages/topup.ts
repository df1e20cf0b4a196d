import type { FastifyReply } from 'fastify';
import { findWallet } from '../billing/ledger.ts';
import { amountSchema, currencyDecimals, formatForCurrency, Money } from '../core/money.ts';
import { routeModule } from '../core/plugins.ts';
import type { PaymentSettings } from '../db/schema.ts';
import { PRIVATE_HEADERS, sendPage } from '../html/hosted-page.ts';
import { money as amount, html, raw } from '../html/index.ts';
import { openConnection } from '../payments/connection.ts';
import { PaymentProviderError } from '../payments/provider.ts';
import { startCheckout } from '../payments/service.ts';
import { checkSettings } from '../payments/settings.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { type LinkPayload, linkSettingsOf } from '../users/links.ts';
import { portalLink } from '../users/sessions.ts';
import {
  CHECKOUT_STYLE,
  type Ctx,
  foreignPost,
  formProof,
  openToken,
  problemPage,
  TOKEN_SHAPE,
  tokenParam,
} from './links.ts';

/**
 * The top-up pages (no API key; signed tokens are the credentials):
 * - `GET /topup/{token}` — with a payment provider connected, the checkout page: the user, the amount
 *   needed, the available balance, the project's preset amounts and a custom amount, and "Pay";
 *   otherwise redirects (303) to the project's `checkoutUrl` with `user`, `amount`, `currency` and
 *   `project`, or shows how to top up when none is configured
 * - `POST /topup/{token}` — the checkout page's own form (a hidden field only the page carries): creates
 *   the provider's checkout and answers 303 to it; the provider's cancel comes back to the top-up page
 * - `GET /payments/done/{token}` — where the provider returns after paying
 */

/**
 * The done page's token: `base64url({"p": payment id, "exp": seconds}).{signature}` — it expires like
 * the other links (LINK_TOKEN_TTL_SECONDS) and is verified under every key of the ring.
 */
function doneToken(ctx: Ctx, paymentId: string, now = Date.now()): string {
  const exp = Math.floor(now / 1000) + ctx.config.LINK_TOKEN_TTL_SECONDS;
  const body = Buffer.from(JSON.stringify({ p: paymentId, exp })).toString('base64url');
  return `${body}.${ctx.sealer.sign(`payment-done:${body}`)}`;
}

/** The payment a done token names, or why it cannot be used (one made before it expired is `expired`). */
function openDoneToken(
  ctx: Ctx,
  token: string,
): { paymentId: string } | { problem: 'malformed' | 'forged' | 'expired' } {
  if (!TOKEN_SHAPE.test(token)) return { problem: 'malformed' };
  const [body, signature] = token.split('.') as [string, string];
  if (!ctx.sealer.verify(`payment-done:${body}`, signature)) return { problem: 'forged' };
  let payload: { p?: unknown; exp?: unknown };
  try {
    payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as typeof payload;
  } catch {
    // a done token from before they expired (the payment id alone): expired now
    return { problem: 'expired' };
  }
  if (typeof payload?.p !== 'string' || typeof payload.exp !== 'number') return { problem: 'expired' };
  if (payload.exp * 1000 <= Date.now()) return { problem: 'expired' };
  return { paymentId: payload.p };
}

const TEST_NOTICE = html`<p class="muted" role="note"><strong>Test payments</strong> — you pay on a test checkout with a test card; no money moves.</p>`;

/**
 * What a top-up link asks for: for a refusal's link, the gap — what the refused request needs less the
 * available balance now (undefined when that already covers it) — otherwise the amount the link names.
 */
async function neededOf(
  ctx: Ctx,
  project: ProjectContext,
  payload: LinkPayload,
): Promise<string | undefined> {
  if (typeof payload.r !== 'string') return typeof payload.a === 'string' ? payload.a : undefined;
  const wallet = await findWallet(ctx.db, project.id, payload.u);
  const gap = new Money(payload.r).minus(wallet?.available ?? '0');
  if (gap.lte(0)) return undefined;
  const minor = gap.toDecimalPlaces(currencyDecimals(project.currency), Money.ROUND_UP);
  return formatForCurrency(minor, project.currency);
}

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
    /** The test provider is connected: the page says so, and that no money moves. */
    test: boolean;
  },
) {
  const { project, user, settings } = input;
  const currency = project.currency;
  const money = (v: string) => html`${amount(v, currency)} ${currency.toUpperCase()}`;
  const wallet = await findWallet(ctx.db, project.id, user);
  const available = wallet?.available ?? '0';
  // The first preset that covers what is needed is chosen; none does: the custom amount, prefilled.
  const needed = input.needed && new Money(input.needed).gt(0) ? input.needed : undefined;
  const chosen = settings.presets.find((p) => !needed || new Money(p).gte(needed));
  const custom = chosen
    ? ''
    : formatForCurrency(Money.max(new Money(needed ?? settings.minimum), settings.minimum), currency);
  const portal = portalLink(linkSettingsOf(ctx), project.id, user).url;
  return sendPage(
    reply,
    input.status ?? 200,
    `Top up your ${project.name} balance`,
    html`${raw(CHECKOUT_STYLE)}${input.test ? TEST_NOTICE : raw('')}<h1>Top up your ${project.name} balance</h1>
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

function topupInstructionsPage(
  reply: FastifyReply,
  project: ProjectContext,
  user: string,
  amount: string | undefined,
) {
  const currency = project.currency.toUpperCase();
  return sendPage(
    reply,
    200,
    `Top up your ${project.name} balance`,
    html`<h1>Top up your ${project.name} balance</h1>
${amount ? html`<p>You need <strong>${amount} ${currency}</strong> more to continue.</p>` : raw('')}
<p>${project.name} has not set up online top-ups yet. To add funds, contact ${project.name} and ask them to credit your balance.</p>
<p>Mention your account id: <strong>${user}</strong></p>
<p class="muted">Once the funds are added, go back to ${project.name} and try again.</p>`,
  );
}

/** The checkout URL with the top-up details as query parameters (existing parameters are kept). */
export function checkoutRedirect(
  checkoutUrl: string,
  input: { user: string; amount: string | undefined; currency: string; project: string },
): string {
  const url = new URL(checkoutUrl);
  url.searchParams.set('user', input.user);
  if (input.amount) url.searchParams.set('amount', input.amount);
  url.searchParams.set('currency', input.currency);
  url.searchParams.set('project', input.project);
  return url.toString();
}

export const topupPageRoutes = routeModule((app, ctx) => {
  app.get('/topup/*', async (request, reply) => {
    const token = tokenParam(request);
    const opened = await openToken(reply, ctx, 'topup', token);
    if (!opened) return reply;
    const { project, payload } = opened;
    const amount = await neededOf(ctx, project, payload);
    // With a payment provider connected, the hosted checkout page.
    const connection = (await openConnection(ctx, project.id))?.connection;
    if (connection) {
      const cancelled = (request.query as Record<string, unknown> | undefined)?.cancelled !== undefined;
      return checkoutPage(reply, ctx, {
        project,
        user: payload.u,
        needed: amount,
        settings: checkSettings(project.currency, connection.settings),
        proof: formProof(ctx, 'topup', token),
        notice: cancelled ? 'The payment was cancelled; nothing was charged.' : undefined,
        test: connection.provider === 'test',
      });
    }
    const checkoutUrl = project.settings.checkoutUrl;
    if (checkoutUrl) {
      const target = checkoutRedirect(checkoutUrl, {
        user: payload.u,
        amount,
        currency: project.currency,
        project: project.id,
      });
      return reply.headers(PRIVATE_HEADERS).redirect(target, 303);
    }
    return topupInstructionsPage(reply, project, payload.u, amount);
  });

  app.post('/topup/*', async (request, reply) => {
    const token = tokenParam(request);
    const opened = await openToken(reply, ctx, 'topup', token);
    if (!opened) return reply;
    const { project, payload } = opened;
    const connection = (await openConnection(ctx, project.id))?.connection;
    if (!connection) return reply.headers(PRIVATE_HEADERS).redirect(`/topup/${token}`, 303);
    const test = connection.provider === 'test';
    const settings = checkSettings(project.currency, connection.settings);
    const proof = formProof(ctx, 'topup', token);
    const needed = await neededOf(ctx, project, payload);
    const again = (error: string, status: number) =>
      checkoutPage(reply, ctx, { project, user: payload.u, needed, settings, proof, error, status, test });
    if (foreignPost(request, ctx, 'topup', token)) return again('Press Pay on this page to pay.', 400);
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
    const opened = openDoneToken(ctx, tokenParam(request));
    if ('problem' in opened) return problemPage(reply, opened.problem);
    const { paymentId } = opened;
    const payment = await ctx.db
      .selectFrom('payments')
      .selectAll()
      .where('id', '=', paymentId)
      .executeTakeFirst();
    if (!payment) return problemPage(reply, 'forged');
    const project = await ctx.projects.get(payment.project_id);
    if (!project) return problemPage(reply, 'unknown_project');
    const money = (v: string) => html`${amount(v, payment.currency)} ${payment.currency.toUpperCase()}`;
    const wallet = await findWallet(ctx.db, project.id, payment.external_id);
    const paid = ['paid', 'refunded', 'disputed'].includes(payment.status);
    const portal = portalLink(linkSettingsOf(ctx), project.id, payment.external_id).url;
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
});
