import { z } from 'zod';
import { routeModule } from '../core/plugins.ts';
import { idParams, textInput } from '../core/validation.ts';
import { getDeliveryLog, listDeliveryLogs, logsQuerySchema, retryDelivery, sendTestPing } from './logs.ts';
import {
  createSubscription,
  getSubscription,
  listSubscriptions,
  setSubscriptionActive,
  subscriptionInputSchema,
} from './subscriptions.ts';

const listQuerySchema = z.strictObject({
  status: z.enum(['active', 'inactive'], { error: "must be 'active' or 'inactive'" }).optional(),
  limit: logsQuerySchema.shape.limit,
  starting_after: textInput(100).optional(),
});

const byId = { schema: { params: idParams } };

/** `/v1/webhooks/*`: subscriptions and delivery logs of the API key's project. */
export const webhookRoutes = routeModule((app, ctx) => {
  app.post(
    '/webhooks/subscriptions',
    { schema: { body: subscriptionInputSchema } },
    async (request, reply) => {
      const { subscription, secret } = await createSubscription(ctx, request.project.id, request.body, {
        createdBy: `key:${request.apiKeyId}`,
        actor: { type: 'api_key', id: request.apiKeyId, ip: request.ip, via: 'v1' },
      });
      reply.status(201);
      return { subscription: { ...subscription, secret } };
    },
  );

  app.get('/webhooks/subscriptions', { schema: { querystring: listQuerySchema } }, async (request) => {
    const query = request.query;
    const { data, hasMore } = await listSubscriptions(ctx, request.project.id, {
      status: query.status,
      limit: query.limit,
      startingAfter: query.starting_after,
    });
    return { object: 'list', data, has_more: hasMore };
  });

  app.get('/webhooks/subscriptions/:id', byId, async (request) => ({
    subscription: await getSubscription(ctx, request.project.id, request.params.id),
  }));

  app.delete('/webhooks/subscriptions/:id', byId, async (request) => ({
    subscription: await setSubscriptionActive(ctx, request.project.id, request.params.id, false, {
      actor: { type: 'api_key', id: request.apiKeyId, ip: request.ip, via: 'v1' },
    }),
  }));

  app.post('/webhooks/subscriptions/:id/test', byId, async (request, reply) => {
    const delivery = await sendTestPing(ctx, request.project, request.params.id, {
      type: 'api_key',
      id: request.apiKeyId,
    });
    reply.status(202);
    return delivery;
  });

  app.get('/webhooks/logs', { schema: { querystring: logsQuerySchema } }, async (request) => {
    const { data, hasMore } = await listDeliveryLogs(ctx, request.project.id, request.query);
    return { object: 'list', data, has_more: hasMore };
  });

  app.get('/webhooks/logs/:id', byId, async (request) =>
    getDeliveryLog(ctx, request.project.id, request.params.id),
  );

  app.post('/webhooks/logs/:id/retry', byId, async (request, reply) => {
    const delivery = await retryDelivery(ctx, request.project.id, request.params.id);
    reply.status(202);
    return delivery;
  });
});
