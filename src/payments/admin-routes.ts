import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf, ownedProject } from '../admin/service.ts';
import { textInput } from '../core/validation.ts';
import {
  connectBody,
  connectPayments,
  disconnectPayments,
  listPayments,
  paymentSettingsSchema,
  refundBody,
  refundPayment,
  showPayments,
  updatePaymentSettings,
} from './service.ts';

/**
 * The admin API of payments, under `/admin/v1/projects/{id}` (registered inside the admin API's
 * authenticated scope, ../admin/routes.ts):
 * - `PUT /payments` — connect Stripe (`stripeKey`, optional `webhookSecret`, optional `settings`)
 * - `GET /payments` — the connection (never the key nor the secret)
 * - `PATCH /payments` — top-up options (`presets`, `minimum`, `maximum`)
 * - `DELETE /payments` — disconnect (deletes the webhook endpoint Tollgate created)
 * - `GET /payments/list` (`user`, `limit`, `starting_after`) — top-ups, newest first
 * - `POST /payments/{paymentId}/refund` (`amount` optional: all that is left) — through Stripe's API
 */
const projectParams = z.object({ project: textInput(255, 'a project id') });
const paymentParams = projectParams.extend({ payment: textInput(255, 'a payment id') });
const listQuery = z.strictObject({
  user: textInput(256).optional(),
  limit: z.coerce.number().int().min(1).max(100).default(20),
  starting_after: textInput(255).optional(),
});

export async function paymentAdminRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const ctx = app.ctx;

  app.put(
    '/projects/:project/payments',
    { schema: { params: projectParams, body: connectBody } },
    async (request) => {
      await ownedProject(ctx, request.principal, request.params.project);
      return connectPayments(ctx, request.params.project, request.body, actorOf(request.principal));
    },
  );
  app.get('/projects/:project/payments', { schema: { params: projectParams } }, async (request) => {
    await ownedProject(ctx, request.principal, request.params.project);
    return showPayments(ctx, request.params.project);
  });
  app.patch(
    '/projects/:project/payments',
    { schema: { params: projectParams, body: paymentSettingsSchema } },
    async (request) => {
      await ownedProject(ctx, request.principal, request.params.project);
      return updatePaymentSettings(ctx, request.params.project, request.body, actorOf(request.principal));
    },
  );
  app.delete('/projects/:project/payments', { schema: { params: projectParams } }, async (request) => {
    await ownedProject(ctx, request.principal, request.params.project);
    return disconnectPayments(ctx, request.params.project, actorOf(request.principal));
  });
  app.get(
    '/projects/:project/payments/list',
    { schema: { params: projectParams, querystring: listQuery } },
    async (request) => {
      await ownedProject(ctx, request.principal, request.params.project);
      return listPayments(ctx, request.params.project, {
        user: request.query.user,
        limit: request.query.limit,
        startingAfter: request.query.starting_after,
      });
    },
  );
  app.post(
    '/projects/:project/payments/:payment/refund',
    { schema: { params: paymentParams, body: refundBody } },
    async (request) => {
      await ownedProject(ctx, request.principal, request.params.project);
      return refundPayment(
        ctx,
        request.params.project,
        request.params.payment,
        request.body ?? {},
        actorOf(request.principal),
      );
    },
  );
}
