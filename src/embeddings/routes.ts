import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { embeddingsApi } from './api.ts';

/** `POST /v1/embeddings` (metered per input token, paywalled with a 402), through `app.metering`. */
export async function embeddingsRoutes(plain: FastifyInstance): Promise<void> {
  const flow = plain.metering;
  plain
    .withTypeProvider<ZodTypeProvider>()
    .post('/embeddings', { schema: { body: embeddingsApi.schema } }, (request, reply) =>
      flow.handle(embeddingsApi, request.body, request, reply),
    );
}
