import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { actorOf } from '../../admin/accounts.ts';
import { projectView } from '../../admin/service.ts';
import { routeModule } from '../../core/plugins.ts';
import { isStorable, NOT_STORABLE } from '../../core/validation.ts';
import { dataTable, html } from '../../html/index.ts';
import { listDeliveryLogs, retryDelivery } from '../../webhooks/logs.ts';
import {
  createSubscription,
  listSubscriptions,
  setSubscriptionActive,
} from '../../webhooks/subscriptions.ts';
import { type FormSpec, formView, invalidBody, type Refused, refusedBy } from '../forms.ts';
import {
  csrfField,
  done,
  formBody,
  optionalField,
  page,
  projectItemAction,
  projectPage,
  projectPageSchema,
  projectParams,
  projectPath,
  secretBox,
} from '../pages.ts';

/** A project's webhooks (`/dashboard/projects/:id/webhooks`): subscriptions and the delivery log. */

const subscriptionForm = formBody({
  url: z.string().max(2048).default(''),
  events: z.string().max(4096).default(''),
  description: optionalField(z.string().trim().max(512).refine(isStorable, { message: NOT_STORABLE })),
});

/** The subscription form, shown again in place when refused (../forms.ts). */
const FORM = {
  name: 'subscription',
  fields: {
    url: { id: 'url', label: 'Endpoint URL' },
    events: { id: 'events', label: 'Events' },
    description: { id: 'description', label: 'Description' },
  },
} satisfies FormSpec;

/** The webhooks page, with the subscription form refused when `refused` says so. */
async function webhooksPage(request: FastifyRequest, reply: FastifyReply, refused?: Refused) {
  const ctx = request.server.ctx;
  const f = formView(FORM, refused);
  const project = projectView(request.ownedProject);
  const subs = await listSubscriptions(ctx, project.id, { status: undefined, limit: 100 });
  const logs = await listDeliveryLogs(ctx, project.id, { limit: 50 });
  const path = projectPath(project.id);
  return projectPage(
    reply,
    { project, title: `Webhooks · ${project.name}`, heading: 'Webhooks', tab: 'Webhooks' },
    (csrf) => html`
<section class="card"><h2>Subscriptions</h2>
${dataTable(
  [
    { label: 'URL' },
    { label: 'Events' },
    { label: 'Active' },
    { label: 'Failures', num: true },
    { label: 'Action', action: true },
  ],
  subs.data.map((w) => [
    html`<code>${w.url}</code>${w.description ? html`<br><span class="muted">${w.description}</span>` : ''}`,
    w.events.join(', '),
    w.isActive ? 'yes' : 'no',
    w.consecutiveFailures,
    w.isActive && !w.managedBy
      ? html`<form method="post" action="${path}/webhooks/${encodeURIComponent(w.id)}/deactivate">${csrfField(csrf)}<button type="submit" class="secondary" aria-label="Deactivate ${w.url}">Deactivate</button></form>`
      : w.managedBy
        ? html`<span class="muted">managed by ${w.managedBy}</span>`
        : '',
  ]),
  { id: 'subscriptions' },
)}
<form method="post" action="${path}/webhooks">${csrfField(csrf)}${f.alert()}
<div class="row"><div><label for="url">Endpoint URL</label><input id="url" name="url" type="url" required placeholder="https://example.com/tollgate"${f.input('url')}>${f.error('url')}</div>
<div><label for="events">Events (patterns, separated by spaces or commas)</label><input id="events" name="events" required${f.input('events', 'balance.* user.*')}>${f.error('events')}</div></div>
<label for="description">Description (optional)</label><input id="description" name="description" maxlength="512"${f.input('description')}>${f.error('description')}
<button type="submit">Add the subscription</button></form></section>
<section class="card"><h2>Delivery log</h2>
${dataTable(
  [
    { label: 'When (UTC)' },
    { label: 'Event' },
    { label: 'Status' },
    { label: 'Attempts', num: true },
    { label: 'Last answer' },
    { label: 'Action', action: true },
  ],
  logs.data.map((d) => [
    d.createdAt.replace('T', ' ').slice(0, 19),
    d.eventType,
    d.status,
    d.attempts,
    d.lastResponseStatus ?? d.lastError ?? '',
    d.status === 'pending'
      ? ''
      : html`<form method="post" action="${path}/webhooks/deliveries/${encodeURIComponent(d.id)}/resend">${csrfField(csrf)}<button type="submit" class="secondary" aria-label="Resend delivery ${d.id}">Resend</button></form>`,
  ]),
  { id: 'deliveries' },
)}${logs.data.length ? '' : html`<p class="muted">No deliveries yet.</p>`}</section>`,
    { status: refused ? 400 : 200 },
  );
}

export default routeModule((app, ctx) => {
  app.get('/projects/:id/webhooks', { schema: projectPageSchema }, async (request, reply) =>
    webhooksPage(request, reply),
  );

  app.post(
    '/projects/:id/webhooks',
    { schema: { params: projectParams, body: subscriptionForm }, attachValidation: true },
    async (request, reply) => {
      if (request.validationError)
        return webhooksPage(request, reply, invalidBody(FORM, subscriptionForm, request));
      const path = `${projectPath(request.params.id)}/webhooks`;
      const f = request.body;
      let created: Awaited<ReturnType<typeof createSubscription>>;
      try {
        created = await createSubscription(
          ctx,
          request.params.id,
          {
            url: f.url,
            events: f.events.split(/[\s,]+/).filter(Boolean),
            ...(f.description ? { description: f.description } : {}),
          },
          { createdBy: `developer:${request.developer.actorId}`, actor: actorOf(request.developer) },
        );
      } catch (err) {
        return webhooksPage(request, reply, refusedBy(FORM, err, f));
      }
      const { subscription, secret } = created;
      return page(
        request,
        reply,
        'Webhook secret',
        () => html`<section class="card"><h1>Subscription added</h1><p>Deliveries to <code>${subscription.url}</code> are signed with this secret.</p>
${secretBox('webhook-secret', 'Signing secret', secret)}
<p><a href="${path}">Back to webhooks</a></p></section>`,
        { script: true },
      );
    },
  );

  app.post(
    '/projects/:id/webhooks/:sub/deactivate',
    { schema: projectItemAction('sub', 'an id') },
    async (request, reply) => {
      await setSubscriptionActive(ctx, request.params.id, request.params.sub, false, {
        actor: actorOf(request.developer),
      });
      return reply.redirect(
        done(`${projectPath(request.params.id)}/webhooks`, 'subscription_deactivated'),
        303,
      );
    },
  );

  app.post(
    '/projects/:id/webhooks/deliveries/:delivery/resend',
    { schema: projectItemAction('delivery', 'an id') },
    async (request, reply) => {
      await retryDelivery(ctx, request.params.id, request.params.delivery);
      return reply.redirect(done(`${projectPath(request.params.id)}/webhooks`, 'delivery_queued'), 303);
    },
  );
});
