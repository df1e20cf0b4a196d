import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { AppContext } from '../app/context.ts';
import { addFastPath } from '../core/validation.ts';
import { existingFlowOf, type MeteredFlow, meteredFlowOf } from '../metering/flow.ts';
import { chatApi } from './api.ts';
import { fastChatRequest } from './schema-fast.ts';

/** The metered flow serving a context (tests wait on `idle()` for settles after a response). */
export function chatServiceOf(ctx: AppContext): MeteredFlow | undefined {
  return existingFlowOf(ctx);
}

/** `POST /v1/chat/completions` (registered inside the authenticated `/v1` scope). */
export async function chatRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const flow = meteredFlowOf(app.ctx);
  // Settles still running when the server stops are finished before the database closes.
  app.addHook('onClose', () => flow.close());
  // The common request is checked without zod (./schema-fast.ts); the rest by the schema.
  addFastPath(chatApi.schema, fastChatRequest);
  app.post('/chat/completions', { schema: { body: chatApi.schema } }, (request, reply) =>
    flow.handle(chatApi, request, reply, request.body),
  );
}
