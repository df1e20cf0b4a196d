import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { parseInput } from '../core/validation.ts';
import { getDeliveryLog, listDeliveryLogs, logsQuerySchema, retryDelivery, sendTestPing } from './logs.ts';
import {
  createSubscription,
  getSubscription,
  listSubscriptions,
  setSubscriptionActive,
} from './subscriptions.ts';

const listQuerySchema = z.strictObject({
  status: z.enum(['active', 'inactive'], { error: "must be 'active' or 'inactive'" }).optional(),
  limit: logsQuerySchema.shape.limit,
  starting_after: z.string().min(1).max(100).optional(),
});

/** `/v1/webhooks/*`: subscriptions and delivery logs of the API key's project. */
export async function webhookRoutes(app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;

  app.post('/webhooks/subscriptions', async (request, reply) => {
    const { subscription, secret } = await createSubscription(
      ctx,
      request.project.id,
      (request.body ?? {}) as never,
      { createdBy: `key:${request.apiKeyId}` },
    );
    reply.status(201);
    return { subscription: { ...subscription, secret } };
  });

  app.get('/webhooks/subscriptions', async (request) => {
    const query = parseInput(listQuerySchema, request.query, 'query');
    const { data, hasMore } = await listSubscriptions(ctx, request.project.id, {
      status: query.status,
      limit: query.limit,
      startingAfter: query.starting_after,
    });
    return { object: 'list', data, has_more: hasMore };
  });

  app.get<{ Params: { id: string } }>('/webhooks/subscriptions/:id', async (request) => ({
    subscription: await getSubscription(ctx, request.project.id, request.params.id),
  }));

  app.delete<{ Params: { id: string } }>('/webhooks/subscriptions/:id', async (request) => ({
    subscription: await setSubscriptionActive(ctx, request.project.id, request.params.id, false),
  }));

  app.post<{ Params: { id: string } }>('/webhooks/subscriptions/:id/test', async (request, reply) => {
    const delivery = await sendTestPing(ctx, request.project, request.params.id, {
      type: 'api_key',
      id: request.apiKeyId,
    });
    reply.status(202);
    return delivery;
  });

  app.get('/webhooks/logs', async (request) => {
    const query = parseInput(logsQuerySchema, request.query, 'query');
    const { data, hasMore } = await listDeliveryLogs(ctx, request.project.id, query);
    return { object: 'list', data, has_more: hasMore };
  });

  app.get<{ Params: { id: string } }>('/webhooks/logs/:id', async (request) =>
    getDeliveryLog(ctx, request.project.id, request.params.id),
  );

  app.post<{ Params: { id: string } }>('/webhooks/logs/:id/retry', async (request, reply) => {
    const delivery = await retryDelivery(ctx, request.project.id, request.params.id);
    reply.status(202);
    return delivery;
  });
}
