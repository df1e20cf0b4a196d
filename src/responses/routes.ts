import type { FastifyInstance } from 'fastify';
import { meteredFlowOf } from '../metering/flow.ts';
import { responsesApi } from './api.ts';

/**
 * `POST /v1/responses` (metered, paywalled), and every other `/v1/responses/…` call (retrieve, delete,
 * cancel, input items, …) passed through unmetered to providers that support them.
 */
export async function responsesRoutes(app: FastifyInstance): Promise<void> {
  const flow = meteredFlowOf(app.ctx);
  app.addHook('onClose', () => flow.close());
  app.post('/responses', (request, reply) => flow.handle(responsesApi, request, reply));
  app.all('/responses/*', (request, reply) => {
    const url = request.raw.url ?? '';
    const path = url.slice(url.indexOf('/responses/'));
    return flow.passthrough(request, reply, path);
  });
}
