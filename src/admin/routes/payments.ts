import { z } from 'zod';
import { routeModule } from '../../core/plugins.ts';
import { textInput } from '../../core/validation.ts';
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
} from '../../payments/service.ts';
import { actorOf } from '../accounts.ts';
import { projectParams } from './schemas.ts';

/**
 * The admin API of payments, under `/admin/v1/projects/{id}`:
 * - `PUT /payments` — connect Stripe (`stripeKey`, optional `webhookSecret`, optional `settings`) or, where test payments are on, the test provider (`{"provider":"test"}`)
 * - `GET /payments` — the connection (never the key nor the secret)
 * - `PATCH /payments` — top-up options (`presets`, `minimum`, `maximum`)
 * - `DELETE /payments` — disconnect (deletes the webhook endpoint Tollgate created)
 * - `GET /payments/list` (`user`, `limit`, `starting_after`) — top-ups, newest first
 * - `POST /payments/{paymentId}/refund` (`amount` optional: all that is left) — through Stripe's API
 */
const paymentParams = projectParams.extend({ payment: textInput(255, 'a payment id') });
const listQuery = z.strictObject({
  user: textInput(256).optional(),
  limit: z.coerce.number().int().min(1).max(100).default(20),
  starting_after: textInput(255).optional(),
});

export const paymentRoutes = routeModule((app, ctx) => {
  const params = projectParams;

  app.put('/projects/:project/payments', { schema: { params, body: connectBody } }, async (request) =>
    connectPayments(ctx, request.ownedProject.id, request.body, actorOf(request.principal)),
  );
  app.get('/projects/:project/payments', { schema: { params } }, async (request) =>
    showPayments(ctx, request.ownedProject.id),
  );
  app.patch(
    '/projects/:project/payments',
    { schema: { params, body: paymentSettingsSchema } },
    async (request) =>
      updatePaymentSettings(ctx, request.ownedProject.id, request.body, actorOf(request.principal)),
  );
  app.delete('/projects/:project/payments', { schema: { params } }, async (request) =>
    disconnectPayments(ctx, request.ownedProject.id, actorOf(request.principal)),
  );
  app.get(
    '/projects/:project/payments/list',
    { schema: { params, querystring: listQuery } },
    async (request) =>
      listPayments(ctx, request.ownedProject.id, {
        user: request.query.user,
        limit: request.query.limit,
        startingAfter: request.query.starting_after,
      }),
  );
  app.post(
    '/projects/:project/payments/:payment/refund',
    { schema: { params: paymentParams, body: refundBody } },
    async (request) => {
      const { ownedProject: project, params, principal } = request;
      return refundPayment(ctx, project.id, params.payment, request.body ?? {}, actorOf(principal));
    },
  );
});
