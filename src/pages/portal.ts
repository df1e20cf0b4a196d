import type { FastifyReply, FastifyRequest } from 'fastify';
import { findWallet } from '../billing/ledger.ts';
import { formatForCurrency, Money } from '../core/money.ts';
import { routeModule } from '../core/plugins.ts';
import { sendPage } from '../html/hosted-page.ts';
import { html, type Raw, raw } from '../html/index.ts';
import { autoRechargeOf, setAutoRecharge } from '../payments/recharge.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { linkSettingsOf, newLinkUrl } from '../users/links.ts';
import { CHECKOUT_STYLE, type Ctx, foreignPost, openToken, tokenParam } from './links.ts';

/**
 * The user's portal (`/portal/{token}`, a link from `POST /v1/user/portal` and the top-up pages): the
 * balance, top-ups with receipts, usage, a top-up button, and the auto-recharge form (on/off, the
 * user's own threshold and amount; a post of the page's own form).
 */

function topupUrl(ctx: Ctx, projectId: string, externalId: string): string {
  return newLinkUrl(linkSettingsOf(ctx), { kind: 'topup', projectId, externalId });
}

export const portalPageRoutes = routeModule((app, ctx) => {
  const openPortal = async (request: FastifyRequest, reply: FastifyReply) => {
    const token = tokenParam(request);
    const opened = await openToken(reply, ctx, 'portal', token);
    return opened && { token, project: opened.project, user: opened.payload.u };
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
    if (foreignPost(request, proof))
      return portalPage(reply, ctx, { ...opened, error: 'Press Save on this page.', status: 400 });
    const wallet = await findWallet(ctx.db, opened.project.id, opened.user);
    if (!wallet)
      return portalPage(reply, ctx, { ...opened, error: 'Top up first to save a card.', status: 400 });
    const body = (request.body ?? {}) as Record<string, unknown>;
    const saved = await setAutoRecharge(ctx, opened.project, wallet.userId, {
      on: body.autoRecharge === 'on',
      threshold: String(body.threshold ?? ''),
      amount: String(body.rechargeAmount ?? ''),
    });
    if (!saved.ok) return portalPage(reply, ctx, { ...opened, error: saved.error, status: 400 });
    return portalPage(reply, ctx, { ...opened, notice: 'Saved.' });
  });
});

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
        .orderBy('seq', 'desc')
        .limit(30)
        .execute()
    : [];
  const day = (d: Date) => d.toISOString().slice(0, 16).replace('T', ' ');
  const rows = (items: Raw[], columns: number) =>
    items.length ? items : [html`<tr><td colspan="${columns}">None yet.</td></tr>`];
  const recharge = await autoRechargeOf(ctx, project, wallet?.userId);
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
