import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { meteredFlowOf } from '../metering/flow.ts';
import { embeddingsApi } from './api.ts';

/** `POST /v1/embeddings` (metered per input token, paywalled with a 402). */
export async function embeddingsRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const flow = meteredFlowOf(app.ctx);
  app.addHook('onClose', () => flow.close());
  app.post('/embeddings', { schema: { body: embeddingsApi.schema } }, (request, reply) =>
    flow.handle(embeddingsApi, request, reply, request.body),
  );
}
