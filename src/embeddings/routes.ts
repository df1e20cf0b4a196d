import type { FastifyInstance } from 'fastify';
import { meteredFlowOf } from '../metering/flow.ts';
import { embeddingsApi } from './api.ts';

/** `POST /v1/embeddings` (metered per input token, paywalled with a 402). */
export async function embeddingsRoutes(app: FastifyInstance): Promise<void> {
  const flow = meteredFlowOf(app.ctx);
  app.addHook('onClose', () => flow.close());
  app.post('/embeddings', (request, reply) => flow.handle(embeddingsApi, request, reply));
}
