import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Principal } from '../admin/accounts.ts';
import { ownedProject } from '../admin/service.ts';
import {
  connectPayments,
  disconnectPayments,
  listPayments,
  refundPayment,
  showPayments,
} from '../payments/service.ts';
import { html, type Raw } from './html.ts';

/**
 * The dashboard's Payments page of a project (`/dashboard/projects/{id}/payments`): connect Stripe
 * (a secret or restricted key, checked live and sealed; the webhook endpoint is created, or a pasted
 * signing secret is used), the top-up options, disconnect, and the top-ups with a Refund button (through
 * Stripe's API: the refund's webhook does the ledger work). Registered by ./routes.ts with its session,
 * page and form helpers, so it shares the dashboard's cookie session and CSRF check.
 */

type Form = Record<string, string | undefined>;

export interface DashboardHelpers {
  session(
    request: FastifyRequest,
    reply: FastifyReply,
  ): { principal: Principal; email: string; csrf: string } | undefined;
  page(request: FastifyRequest, reply: FastifyReply, title: string, body: Raw): FastifyReply;
  action(reply: FastifyReply, backTo: string, fn: () => Promise<string | undefined>): Promise<FastifyReply>;
  nav(project: { id: string; name: string }, current: string): Raw;
  csrfField(csrf: string): Raw;
}

type P = { Params: { id: string } };

export function paymentDashboardRoutes(app: FastifyInstance, h: DashboardHelpers): void {
  const ctx = app.ctx;
  const pathOf = (id: string) => `/dashboard/projects/${encodeURIComponent(id)}/payments`;

  app.get<P & { Querystring: { user?: string } }>('/projects/:id/payments', async (request, reply) => {
    const s = h.session(request, reply);
    if (!s) return reply;
    const project = await ownedProject(ctx, s.principal, request.params.id);
    const view = await showPayments(ctx, project.id);
    const user =
      typeof request.query.user === 'string' && request.query.user.trim()
        ? request.query.user.trim().slice(0, 256)
        : undefined;
    const payments = await listPayments(ctx, project.id, { limit: 50, user });
    const path = pathOf(project.id);
    const c = view.connected ? (view as Extract<typeof view, { keyHint: string }>) : undefined;
    const body = html`${h.nav(project, 'Payments')}
<section class="card" aria-labelledby="pay-h"><h1 id="pay-h">Payments (Stripe)</h1>
${
  c
    ? html`<p>Connected: <code>${c.keyHint}</code> (${c.livemode ? 'live' : 'test'} mode). The key is sealed and never shown again.</p>
<p>Webhook: <code>${c.webhook.url}</code> — ${c.webhook.managed ? html`endpoint <code>${c.webhook.endpointId}</code> created in your Stripe account` : 'an endpoint you made by hand'}.</p>
<p>Top-ups: presets ${c.settings.presets?.join(', ')}; minimum ${c.settings.minimum}; maximum ${c.settings.maximum} ${project.currency.toUpperCase()}.</p>
<form method="post" action="${path}/disconnect">${h.csrfField(s.csrf)}<button type="submit" class="secondary">Disconnect Stripe</button></form>`
    : html`<p>Connect your Stripe account and users who run out pay on a hosted checkout from their top-up link; each payment becomes exactly one deposit.</p>`
}
<h2>${c ? 'Replace the connection' : 'Connect Stripe'}</h2>
<form method="post" action="${path}">${h.csrfField(s.csrf)}
<label for="stripeKey">Stripe secret key or restricted key (<code>sk_…</code> or <code>rk_…</code>)</label><input id="stripeKey" name="stripeKey" type="password" autocomplete="off" required>
<label for="webhookSecret">Webhook signing secret (optional: only if you created the endpoint yourself)</label><input id="webhookSecret" name="webhookSecret" type="password" autocomplete="off">
<label for="presets">Preset amounts (comma-separated)</label><input id="presets" name="presets" value="${c?.settings.presets?.join(', ') ?? ''}">
<div class="row"><div><label for="minimum">Minimum</label><input id="minimum" name="minimum" value="${c?.settings.minimum ?? ''}"></div>
<div><label for="maximum">Maximum</label><input id="maximum" name="maximum" value="${c?.settings.maximum ?? ''}"></div></div>
<button type="submit">Check and connect</button></form>
</section>
<section class="card" aria-labelledby="topups-h"><h2 id="topups-h">Top-ups${user ? html` of ${user}` : ''}</h2>
<form method="get" action="${path}" class="row"><div><label for="user">User</label><input id="user" name="user" value="${user ?? ''}" maxlength="256"></div><div><button type="submit" class="secondary">Show</button></div></form>
<table><thead><tr><th>Payment</th><th>User</th><th>Amount</th><th>Status</th><th>Receipt</th><th><span class="muted">Action</span></th></tr></thead><tbody>
${
  payments.data.length
    ? payments.data.map(
        (p) =>
          html`<tr><td><code>${p.id}</code></td><td>${p.user}</td><td>${p.amount} ${p.currency}${p.refunded !== '0.00' && p.refunded !== '0' ? html` (${p.refunded} refunded)` : ''}</td><td>${p.status}</td><td>${p.receiptUrl ? html`<a href="${p.receiptUrl}">Receipt</a>` : '—'}</td><td>${
            p.status === 'paid'
              ? html`<form method="post" action="${path}/${encodeURIComponent(p.id)}/refund">${h.csrfField(s.csrf)}<button type="submit" class="secondary" aria-label="Refund ${p.id}">Refund</button></form>`
              : ''
          }</td></tr>`,
      )
    : html`<tr><td colspan="6">No top-ups yet.</td></tr>`
}
</tbody></table></section>`;
    return h.page(request, reply, `Payments · ${project.name}`, body);
  });

  app.post<P>('/projects/:id/payments', async (request, reply) => {
    const s = h.session(request, reply);
    if (!s) return reply;
    const path = pathOf(request.params.id);
    return h.action(reply, path, async () => {
      await ownedProject(ctx, s.principal, request.params.id);
      const f = request.body as Form;
      const value = (name: string) => (f[name]?.trim() ? f[name]!.trim() : undefined);
      const presets = value('presets');
      const settings = {
        ...(presets ? { presets: presets.split(',').map((p) => p.trim()) } : {}),
        ...(value('minimum') ? { minimum: value('minimum') } : {}),
        ...(value('maximum') ? { maximum: value('maximum') } : {}),
      };
      await connectPayments(ctx, request.params.id, {
        stripeKey: value('stripeKey') ?? '',
        ...(value('webhookSecret') ? { webhookSecret: value('webhookSecret') } : {}),
        ...(Object.keys(settings).length ? { settings } : {}),
      });
      return 'Stripe connected: the key was checked and sealed.';
    });
  });

  app.post<P>('/projects/:id/payments/disconnect', async (request, reply) => {
    const s = h.session(request, reply);
    if (!s) return reply;
    return h.action(reply, pathOf(request.params.id), async () => {
      await ownedProject(ctx, s.principal, request.params.id);
      await disconnectPayments(ctx, request.params.id);
      return 'Stripe disconnected.';
    });
  });

  app.post<{ Params: { id: string; payment: string } }>(
    '/projects/:id/payments/:payment/refund',
    async (request, reply) => {
      const s = h.session(request, reply);
      if (!s) return reply;
      return h.action(reply, pathOf(request.params.id), async () => {
        await ownedProject(ctx, s.principal, request.params.id);
        const refund = await refundPayment(ctx, request.params.id, request.params.payment, {});
        return `Refund ${refund.id} of ${refund.amount} ${refund.currency} asked; the balance is debited when Stripe confirms it.`;
      });
    },
  );
}
