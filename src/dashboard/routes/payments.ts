import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { actorOf } from '../../admin/accounts.ts';
import { testPaymentsAllowed } from '../../config/index.ts';
import { routeModule } from '../../core/plugins.ts';
import { dataTable, html, money } from '../../html/index.ts';
import {
  connectPayments,
  disconnectPayments,
  listPayments,
  refundPayment,
  showPayments,
  updatePaymentSettings,
} from '../../payments/service.ts';
import { userIdSchema } from '../../users/schema.ts';
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
import {
  csrfField,
  done,
  flashQuery,
  formBody,
  optionalField,
  projectItemAction,
  projectPage,
  projectParams,
  projectPath,
} from '../pages.ts';

/**
 * A project's Payments page (`/dashboard/projects/:id/payments`): connect Stripe (a secret or restricted
 * key, checked live and sealed; the webhook endpoint is created, or a pasted signing secret is used),
 * the top-up options, disconnect, and the top-ups with a Refund button (through Stripe's API: the
 * refund's webhook does the ledger work). Where test payments are on (`tollgate dev`), "Use test
 * payments" connects the test provider instead: a test checkout, no account, no money.
 */

const text = (max: number) => optionalField(z.string().trim().max(max));
const connectForm = formBody({
  stripeKey: z.string().trim().min(1, { message: 'must not be empty' }).max(500),
  webhookSecret: text(500),
  presets: text(200),
  minimum: text(40),
  maximum: text(40),
});
const rechargeForm = formBody({
  offered: optionalField(z.literal('on')),
  threshold: text(40),
  amount: text(40),
  monthlyCap: text(40),
});
const pageQuery = flashQuery.extend({ user: optionalField(userIdSchema) });

/** The payments page's forms, refused ones shown again in place (../forms.ts). */
const FORMS = {
  connect: {
    name: 'connect',
    fields: {
      stripeKey: { id: 'stripeKey', label: 'Stripe key', secret: true },
      webhookSecret: { id: 'webhookSecret', label: 'Webhook signing secret', secret: true },
      presets: { id: 'presets', label: 'Preset amounts' },
      minimum: { id: 'minimum', label: 'Minimum' },
      maximum: { id: 'maximum', label: 'Maximum' },
    },
  },
  recharge: {
    name: 'recharge',
    fields: {
      offered: { id: 'ar-offered', label: 'Offer automatic recharge' },
      threshold: { id: 'ar-threshold', label: 'Threshold' },
      amount: { id: 'ar-amount', label: 'Recharge amount' },
      monthlyCap: { id: 'ar-cap', label: 'Monthly cap per user' },
    },
  },
} satisfies Record<string, FormSpec>;

type Raw = ReturnType<typeof html>;

/** The project's top-ups, of one user when one is given, each refundable while paid. */
function topUpsCard(
  path: string,
  user: string | undefined,
  payments: Awaited<ReturnType<typeof listPayments>>['data'],
  csrf: string,
): Raw {
  return html`<section class="card" aria-labelledby="topups-h"><h2 id="topups-h">Top-ups${user ? html` of ${user}` : ''}</h2>
<form method="get" action="${path}" class="row"><div><label for="user">User</label><input id="user" name="user" value="${user ?? ''}" maxlength="256"></div><div><button type="submit" class="secondary">Show</button></div></form>
${dataTable(
  [
    { label: 'Payment' },
    { label: 'User' },
    { label: 'Amount' },
    { label: 'Status' },
    { label: 'Receipt' },
    { label: 'Action', action: true },
  ],
  payments.map((p) => [
    html`<code>${p.id}</code>`,
    p.user,
    html`${money(p.amount, p.currency)} ${p.currency}${p.provider === 'test' ? html` <span class="muted">(test)</span>` : ''}${p.refunded !== '0.00' && p.refunded !== '0' ? html` (${money(p.refunded, p.currency)} refunded)` : ''}`,
    p.status,
    p.receiptUrl ? html`<a href="${p.receiptUrl}">Receipt</a>` : '—',
    p.status === 'paid'
      ? html`<form method="post" action="${path}/${encodeURIComponent(p.id)}/refund">${csrfField(csrf)}<button type="submit" class="secondary" aria-label="Refund ${p.id}">Refund</button></form>`
      : '',
  ]),
  { id: 'topups', empty: 'No top-ups yet.' },
)}</section>`;
}

/** What is connected: test payments (labelled so), or the Stripe key's hint and mode. */
function connectedLine(c: { provider: string; keyHint: string; livemode: boolean }): Raw {
  return c.provider === 'test'
    ? html`<p><strong>Test payments</strong> are connected: users pay on a test checkout with test cards, and no money moves. Connect Stripe below to take real payments.</p>`
    : html`<p>Connected: <code>${c.keyHint}</code> (${c.livemode ? 'live' : 'test'} mode). The key is sealed and never shown again.</p>`;
}

/** Where test payments are on (`tollgate dev`): connect the test provider instead of Stripe. */
function useTestPayments(path: string, csrf: string): Raw {
  return html`<h2>Test payments</h2><p class="muted">Try the whole top-up flow without a Stripe account or the network: a test checkout with test cards (succeeds, declined, asks for authentication), credited through the same webhooks. Only in development (TOLLGATE_TEST_PAYMENTS; never in production).</p>
<form method="post" action="${path}/test">${csrfField(csrf)}<button type="submit" class="secondary">Use test payments</button></form>`;
}

/** Connect Stripe (or replace the Stripe connection): the key, a pasted signing secret, the top-up options. */
function stripeForm(
  path: string,
  csrf: string,
  c: { provider: string; settings: { presets?: string[]; minimum?: string; maximum?: string } } | undefined,
  refused?: Refused,
): Raw {
  const f = formView(FORMS.connect, refused);
  return html`<h2>${c && c.provider !== 'test' ? 'Replace the connection' : 'Connect Stripe'}</h2>
<form method="post" action="${path}">${csrfField(csrf)}${f.alert()}
<label for="stripeKey">Stripe secret key or restricted key (<code>sk_…</code> or <code>rk_…</code>)</label><input id="stripeKey" name="stripeKey" type="password" autocomplete="off" required${f.invalid('stripeKey')}>${f.error('stripeKey')}
<label for="webhookSecret">Webhook signing secret (optional: only if you created the endpoint yourself)</label><input id="webhookSecret" name="webhookSecret" type="password" autocomplete="off"${f.invalid('webhookSecret')}>${f.error('webhookSecret')}
<label for="presets">Preset amounts (comma-separated)</label><input id="presets" name="presets"${f.input('presets', c?.settings.presets?.join(', ') ?? '')}>${f.error('presets')}
<div class="row"><div><label for="minimum">Minimum</label><input id="minimum" name="minimum"${f.input('minimum', c?.settings.minimum ?? '')}>${f.error('minimum')}</div>
<div><label for="maximum">Maximum</label><input id="maximum" name="maximum"${f.input('maximum', c?.settings.maximum ?? '')}>${f.error('maximum')}</div></div>
<button type="submit">Check and connect</button></form>`;
}

const pathOf = (id: string) => `${projectPath(id)}/payments`;

/** The payments page, with its refused form (connect, automatic recharge) shown again. */
async function paymentsPage(
  request: FastifyRequest,
  reply: FastifyReply,
  user: string | undefined,
  refused?: Refused,
) {
  const ctx = request.server.ctx;
  const project = request.ownedProject;
  const view = await showPayments(ctx, project.id);
  const recharge = formView(FORMS.recharge, refused);
  const payments = await listPayments(ctx, project.id, { limit: 50, user });
  const path = pathOf(project.id);
  const c = view.connected ? (view as Extract<typeof view, { keyHint: string }>) : undefined;
  return projectPage(
    reply,
    { project, title: `Payments · ${project.name}`, heading: 'Payments', tab: 'Payments' },
    (csrf) => html`
<section class="card" aria-labelledby="pay-h"><h2 id="pay-h">${c?.provider === 'test' ? 'Test payments' : 'Stripe'}</h2>
${
  c
    ? html`${connectedLine(c)}
<p>Webhook: <code>${c.webhook.url}</code> — ${c.webhook.managed ? html`endpoint <code>${c.webhook.endpointId}</code> created in your ${c.provider === 'test' ? 'test' : 'Stripe'} account` : 'an endpoint you made by hand'}.</p>
<p>Top-ups: presets ${c.settings.presets?.join(', ')}; minimum ${c.settings.minimum}; maximum ${c.settings.maximum} ${project.currency.toUpperCase()}.</p>
<h2>Automatic recharge</h2>
<p class="muted">Users who tick “save this card and recharge automatically” at checkout have their saved card charged off session when their available balance falls below the threshold (their own, set in their portal, within these limits), at most the monthly cap per user. A declined card turns it off for that user (<code>payment.recharge.failed</code>).</p>
<form method="post" action="${path}/auto-recharge">${csrfField(csrf)}${recharge.alert()}
<label class="check"><input type="checkbox" id="ar-offered" name="offered" value="on"${recharge.checked('offered', Boolean(c.settings.autoRecharge?.offered))}${recharge.invalid('offered')}> Offer automatic recharge</label>${recharge.error('offered')}
<div class="row"><div><label for="ar-threshold">Threshold</label><input id="ar-threshold" name="threshold"${recharge.input('threshold', c.settings.autoRecharge?.threshold ?? '')}>${recharge.error('threshold')}</div>
<div><label for="ar-amount">Recharge amount</label><input id="ar-amount" name="amount"${recharge.input('amount', c.settings.autoRecharge?.amount ?? '')}>${recharge.error('amount')}</div>
<div><label for="ar-cap">Monthly cap per user</label><input id="ar-cap" name="monthlyCap"${recharge.input('monthlyCap', c.settings.autoRecharge?.monthlyCap ?? '')}>${recharge.error('monthlyCap')}</div></div>
<button type="submit">Save automatic recharge</button></form>
<form method="post" action="${path}/disconnect">${csrfField(csrf)}<button type="submit" class="secondary">Disconnect ${c.provider === 'test' ? 'test payments' : 'Stripe'}</button></form>`
    : html`<p>Connect your Stripe account and users who run out pay on a hosted checkout from their top-up link; each payment becomes exactly one deposit.</p>`
}
${testPaymentsAllowed(ctx.config) && c?.provider !== 'test' ? useTestPayments(path, csrf) : ''}
${stripeForm(path, csrf, c, refused)}
</section>
${topUpsCard(path, user, payments.data, csrf)}`,
    { status: refused ? 400 : 200 },
  );
}

export default routeModule((app, ctx) => {
  app.get(
    '/projects/:id/payments',
    { schema: { params: projectParams, querystring: pageQuery } },
    async (request, reply) => paymentsPage(request, reply, request.query.user),
  );

  app.post(
    '/projects/:id/payments',
    { schema: { params: projectParams, body: connectForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return paymentsPage(request, reply, undefined, invalidBody(FORMS.connect, connectForm, request));
      const { stripeKey, webhookSecret, presets, minimum, maximum } = request.body;
      const settings = {
        ...(presets ? { presets: presets.split(',').map((p) => p.trim()) } : {}),
        ...(minimum ? { minimum } : {}),
        ...(maximum ? { maximum } : {}),
      };
      try {
        await connectPayments(
          ctx,
          request.params.id,
          {
            stripeKey,
            ...(webhookSecret ? { webhookSecret } : {}),
            ...(Object.keys(settings).length ? { settings } : {}),
          },
          actorOf(request.developer),
        );
      } catch (err) {
        return paymentsPage(request, reply, undefined, refusedBy(FORMS.connect, err, request.body));
      }
      return reply.redirect(done(pathOf(request.params.id), 'payments_connected'), 303);
    },
  );

  app.post(
    '/projects/:id/payments/test',
    { schema: { params: projectParams, body: formBody({}) } },
    async (request, reply) => {
      await connectPayments(ctx, request.params.id, { provider: 'test' }, actorOf(request.developer));
      return reply.redirect(done(pathOf(request.params.id), 'payments_connected'), 303);
    },
  );

  app.post(
    '/projects/:id/payments/auto-recharge',
    { schema: { params: projectParams, body: rechargeForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return paymentsPage(request, reply, undefined, invalidBody(FORMS.recharge, rechargeForm, request));
      const { offered, threshold, amount, monthlyCap } = request.body;
      try {
        await updatePaymentSettings(
          ctx,
          request.params.id,
          {
            autoRecharge: {
              offered: offered === 'on',
              ...(threshold ? { threshold } : {}),
              ...(amount ? { amount } : {}),
              ...(monthlyCap ? { monthlyCap } : {}),
            },
          },
          actorOf(request.developer),
        );
      } catch (err) {
        return paymentsPage(request, reply, undefined, refusedBy(FORMS.recharge, err, request.body));
      }
      return reply.redirect(done(pathOf(request.params.id), 'auto_recharge_saved'), 303);
    },
  );

  app.post(
    '/projects/:id/payments/disconnect',
    { schema: { params: projectParams, body: formBody({}) } },
    async (request, reply) => {
      await disconnectPayments(ctx, request.params.id, actorOf(request.developer));
      return reply.redirect(done(pathOf(request.params.id), 'payments_disconnected'), 303);
    },
  );

  app.post(
    '/projects/:id/payments/:payment/refund',
    { schema: projectItemAction('payment', 'a payment id') },
    async (request, reply) => {
      await refundPayment(ctx, request.params.id, request.params.payment, {}, actorOf(request.developer));
      return reply.redirect(done(pathOf(request.params.id), 'refund_requested'), 303);
    },
  );
});
