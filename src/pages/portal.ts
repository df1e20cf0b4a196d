import type { FastifyReply, FastifyRequest } from 'fastify';
import { getUserKey, listUserKeys } from '../auth/user-keys.ts';
import { findWallet } from '../billing/ledger.ts';
import { formatForCurrency, Money } from '../core/money.ts';
import { routeModule } from '../core/plugins.ts';
import { sendPage } from '../html/hosted-page.ts';
import { money as amount, html, type Raw, raw } from '../html/index.ts';
import { autoRechargeOf, setAutoRecharge } from '../payments/recharge.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { issueUserKey } from '../users/keys.ts';
import { linkSettingsOf, newLinkUrl } from '../users/links.ts';
import { keyNameOf } from '../users/schema.ts';
import { CHECKOUT_STYLE, type Ctx, foreignPost, formProof, openToken, tokenParam } from './links.ts';

/**
 * The user's portal (`/portal/{token}`, a link from `POST /v1/user/portal` and the top-up pages): the
 * balance, top-ups with receipts, usage, a top-up button, the auto-recharge form (on/off, the user's
 * own threshold and amount; a post of the page's own form), and the user's own end-user keys: create
 * one (shown once) and revoke one (`action=create_key|revoke_key` posts of the page's forms).
 */

type Opened = { token: string; project: ProjectContext; user: string };

/** The portal's key forms: a new key (shown once on the page), or a key of this user revoked. */
async function keyAction(reply: FastifyReply, ctx: Ctx, opened: Opened, body: Record<string, unknown>) {
  const { project, user } = opened;
  if (body.action === 'create_key') {
    const name = keyNameOf({ key: body.name });
    if (name === undefined)
      return portalPage(reply, ctx, {
        ...opened,
        error: 'Give the key a name (up to 64 characters).',
        status: 400,
      });
    const created = await issueUserKey(ctx, project.id, { user, name });
    return portalPage(reply, ctx, { ...opened, newKey: { name, key: created.key } });
  }
  const id = typeof body.key === 'string' ? body.key : '';
  const found = await getUserKey(ctx.db, project.id, id, user).catch(() => undefined);
  if (!found) return portalPage(reply, ctx, { ...opened, error: 'No such key.', status: 404 });
  await ctx.keys.revokeUserKey(project.id, id);
  return portalPage(reply, ctx, { ...opened, notice: `Revoked the key “${found.name}”.` });
}

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
    if (foreignPost(request, ctx, 'portal', opened.token))
      return portalPage(reply, ctx, { ...opened, error: 'Press Save on this page.', status: 400 });
    const body = (request.body ?? {}) as Record<string, unknown>;
    if (body.action === 'create_key' || body.action === 'revoke_key')
      return keyAction(reply, ctx, opened, body);
    const wallet = await findWallet(ctx.db, opened.project.id, opened.user);
    if (!wallet)
      return portalPage(reply, ctx, { ...opened, error: 'Top up first to save a card.', status: 400 });
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
  input: Opened & {
    newKey?: { name: string; key: string };
    notice?: string;
    error?: string;
    status?: number;
  },
) {
  const { project, user } = input;
  const money = (v: string) => html`${amount(v, project.currency)} ${project.currency.toUpperCase()}`;
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
  const keys = await listUserKeys(ctx.db, project.id, user);
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
${keysSection(formProof(ctx, 'portal', input.token), keys, input.newKey)}
<h2>Top-ups</h2>
<table><thead><tr><th>Date</th><th class="num">Amount</th><th>Status</th><th>Receipt</th></tr></thead><tbody>
${rows(
  payments.map(
    (p) =>
      html`<tr><td>${day(p.paid_at ?? p.created_at)}</td><td class="num">${money(p.amount)}${
        p.provider === 'test' ? html` <span class="muted">(test)</span>` : raw('')
      }</td><td>${p.status}${
        new Money(p.refunded).gt(0) ? html` (${money(p.refunded)} refunded)` : raw('')
      }</td><td>${p.receipt_url ? html`<a href="${p.receipt_url}">Receipt</a>` : raw('—')}</td></tr>`,
  ),
  4,
)}
</tbody></table>
<h2>Usage and credits</h2>
<table><thead><tr><th>Date</th><th>What</th><th class="num">Amount</th></tr></thead><tbody>
${rows(
  activity.map(
    (e) =>
      html`<tr><td>${day(e.created_at)}</td><td>${e.description ?? `${e.kind} (${e.source})`}</td><td class="num">${money(e.amount)}</td></tr>`,
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
  money: (v: string) => Raw,
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
<input type="hidden" name="confirm" value="${formProof(ctx, 'portal', token)}">
<p><label><input type="checkbox" name="autoRecharge" value="on"${raw(r.on ? ' checked' : '')}> Recharge automatically</label></p>
<p><label>When the balance falls below: <input type="text" name="threshold" inputmode="decimal" value="${formatForCurrency(r.threshold, currency)}"></label></p>
<p><label>Recharge (${money(r.minimum)} to ${money(r.maximum)}): <input type="text" name="rechargeAmount" inputmode="decimal" value="${formatForCurrency(r.amount, currency)}"></label></p>
<button type="submit">Save</button>
</form>`;
}

/** The user's own keys: each active one with a Revoke button, and a form for a new one. */
function keysSection(
  proof: string,
  keys: Awaited<ReturnType<typeof listUserKeys>>,
  newKey: { name: string; key: string } | undefined,
): Raw {
  const now = Date.now();
  const active = keys.filter((k) => !k.revoked_at);
  const shown = newKey
    ? html`<p role="status">Your new key “${newKey.name}” (copy it now: it is not shown again):</p>
<p><code id="new-key">${newKey.key}</code></p>`
    : raw('');
  const rows = active.map(
    (k) =>
      html`<tr><td>${k.name}</td><td><code>${k.prefix}…</code></td><td>${
        k.expires_at
          ? `${k.expires_at.getTime() <= now ? 'expired ' : ''}${k.expires_at.toISOString().slice(0, 16).replace('T', ' ')}`
          : 'never'
      }</td><td><form method="post"><input type="hidden" name="confirm" value="${proof}"><input type="hidden" name="action" value="revoke_key"><input type="hidden" name="key" value="${k.id}"><button type="submit">Revoke</button></form></td></tr>`,
  );
  return html`<h2>API keys</h2>
<p class="muted">A key of your own for coding agents and other tools: requests made with it are charged to this balance.</p>
${shown}
<table><thead><tr><th>Name</th><th>Key</th><th>Expires</th><th></th></tr></thead><tbody>
${rows.length ? rows : [html`<tr><td colspan="4">None yet.</td></tr>`]}
</tbody></table>
<form method="post">
<input type="hidden" name="confirm" value="${proof}">
<input type="hidden" name="action" value="create_key">
<p><label>Name: <input type="text" name="name" maxlength="64" value="laptop"></label> <button type="submit">Create a key</button></p>
</form>`;
}
