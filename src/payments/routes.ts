import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { routeModule } from '../core/plugins.ts';
import { textInput } from '../core/validation.ts';
import { linkSettingsOf } from '../users/links.ts';
import { inCurrency, topupBody, userBody } from '../users/schema.ts';
import { portalLink, topupLink } from '../users/sessions.ts';
import { openConnection } from './connection.ts';
import { providerKind } from './providers.ts';
import { handleWebhook } from './webhooks/index.ts';

/**
 * `POST /payments/{provider}/{projectId}/webhook` — the receiver of the webhooks of a project's payment
 * provider account (`/payments/stripe/{projectId}/webhook` for Stripe). No API key: the provider's
 * signature header, checked against the project's sealed signing secret, is the credential. The body is
 * kept raw: the signature covers its bytes. A provider the registry does not know is not found (404).
 */
export const paymentWebhookRoutes = routeModule((app, ctx) => {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: 1024 * 1024 }, (_request, body, done) => {
    done(null, body);
  });
  const routes = app.withTypeProvider<ZodTypeProvider>();
  // The project id is checked like every id in a path (no control characters: 400, not a database error).
  const params = z.object({ provider: z.string(), project: textInput(255, 'a project id') });
  routes.post('/payments/:provider/:project/webhook', { schema: { params } }, async (request, reply) => {
    const kind = providerKind(request.params.provider, ctx.config);
    if (!kind) return reply.callNotFound();
    const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
    const signature = request.headers[kind.signatureHeader];
    const outcome = await handleWebhook(
      ctx,
      kind.name,
      request.params.project,
      body,
      typeof signature === 'string' ? signature : undefined,
    );
    return reply.status(outcome.status).send(outcome.body);
  });
});

/**
 * `/v1/user/*` routes that depend on payments: `POST /v1/user/portal` — a signed link to the user's
 * portal (balance, top-ups with receipts, usage); `POST /v1/user/topup` — a top-up link, which leads to
 * the hosted checkout when payments are connected (`checkout: hosted`), else to the project's
 * `checkoutUrl` (`redirect`) or to instructions.
 */
export const paymentUserRoutes = routeModule((app, ctx) => {
  const links = () => linkSettingsOf(ctx);
  app.post('/user/portal', { schema: { body: userBody } }, async (request) => {
    const { user } = request.body;
    return { object: 'user.portal_link', user, ...portalLink(links(), request.project.id, user) };
  });

  app.post('/user/topup', { schema: { body: topupBody }, preHandler: inCurrency }, async (request) => {
    const project = request.project;
    const { user, amount } = request.body;
    const link = topupLink(links(), project, user, amount);
    return {
      object: 'user.topup_link',
      user,
      amount: amount ?? null,
      currency: project.currency,
      checkout: (await openConnection(ctx, project.id))
        ? 'hosted'
        : project.settings.checkoutUrl
          ? 'redirect'
          : 'instructions',
      ...link,
    };
  });
});
