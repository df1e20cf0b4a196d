import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { AppContext } from '../app/context.ts';
import { chatRequestSchema } from './schema.ts';
import { ChatService } from './service.ts';

const services = new WeakMap<AppContext, ChatService>();

/** The chat service serving a context (tests wait on `idle()` for settles after a response). */
export function chatServiceOf(ctx: AppContext): ChatService | undefined {
  return services.get(ctx);
}

/** `POST /v1/chat/completions` (registered inside the authenticated `/v1` scope). */
export async function chatRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const service = new ChatService(app.ctx);
  services.set(app.ctx, service);
  // Settles still running when the server stops are finished before the database closes.
  app.addHook('onClose', () => service.close());
  app.post('/chat/completions', { schema: { body: chatRequestSchema } }, (request, reply) =>
    service.handle(request, reply, request.body),
  );
}
