import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { endSession } from '../../admin/accounts.ts';
import { formBody, SESSION_COOKIE } from '../pages.ts';

/** `POST /dashboard/signout`: ends the session on the server, not only in the browser. */
export default async function signOutRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  app.post('/signout', { schema: { body: formBody({}) } }, async (request, reply) => {
    const sessionId = request.dashboard?.principal.sessionId;
    if (sessionId) await endSession(app.ctx.db, sessionId);
    reply.clearCookie(SESSION_COOKIE, { path: '/' });
    return reply.redirect('/dashboard/signin?done=signed_out', 303);
  });
}
