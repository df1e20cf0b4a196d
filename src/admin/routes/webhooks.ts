import { routeModule } from '../../core/plugins.ts';
import { listDeliveryLogs, logsQuerySchema, retryDelivery } from '../../webhooks/logs.ts';
import {
  createSubscription,
  listSubscriptions,
  setSubscriptionActive,
  subscriptionInputSchema,
} from '../../webhooks/subscriptions.ts';
import { actorOf } from '../accounts.ts';
import { list } from '../service.ts';
import { pageQuery, projectItemParams, projectParams } from './schemas.ts';

/** A project's webhook subscriptions and delivery logs (../../webhooks). */
export const webhookRoutes = routeModule((app, ctx) => {
  app.get(
    '/projects/:project/webhooks/subscriptions',
    { schema: { params: projectParams, querystring: pageQuery } },
    async (request) => {
      const { data, hasMore } = await listSubscriptions(ctx, request.ownedProject.id, {
        status: undefined,
        limit: request.query.limit,
        startingAfter: request.query.starting_after,
      });
      return list(data, hasMore);
    },
  );
  app.post(
    '/projects/:project/webhooks/subscriptions',
    { schema: { params: projectParams, body: subscriptionInputSchema } },
    async (request, reply) => {
      const { principal } = request;
      const { subscription, secret } = await createSubscription(ctx, request.ownedProject.id, request.body, {
        createdBy: `${principal.actorType}:${principal.actorId}`,
        actor: actorOf(principal),
      });
      reply.status(201);
      return { subscription: { ...subscription, secret } };
    },
  );
  app.delete(
    '/projects/:project/webhooks/subscriptions/:id',
    { schema: { params: projectItemParams } },
    async (request) => ({
      subscription: await setSubscriptionActive(ctx, request.ownedProject.id, request.params.id, false, {
        actor: actorOf(request.principal),
      }),
    }),
  );
  app.get(
    '/projects/:project/webhooks/logs',
    { schema: { params: projectParams, querystring: logsQuerySchema } },
    async (request) => {
      const { data, hasMore } = await listDeliveryLogs(ctx, request.ownedProject.id, request.query);
      return list(data, hasMore);
    },
  );
  app.post(
    '/projects/:project/webhooks/logs/:id/resend',
    { schema: { params: projectItemParams } },
    async (request, reply) => {
      reply.status(202);
      return retryDelivery(ctx, request.ownedProject.id, request.params.id);
    },
  );
});
