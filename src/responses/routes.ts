import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { meteredFlowOf } from '../metering/flow.ts';
import { responsesApi } from './api.ts';

/**
 * `POST /v1/responses` (metered, paywalled), and every other `/v1/responses/…` call (retrieve, delete,
 * cancel, input items, …) passed through unmetered to providers that support them.
 */
export async function responsesRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const flow = meteredFlowOf(app.ctx);
  app.addHook('onClose', () => flow.close());
  app.post('/responses', { schema: { body: responsesApi.schema } }, (request, reply) =>
    flow.handle(responsesApi, request, reply, request.body),
  );
  app.all('/responses/*', (request, reply) => {
    const url = request.raw.url ?? '';
    const path = url.slice(url.indexOf('/responses/'));
    return flow.passthrough(request, reply, path);
  });
}
