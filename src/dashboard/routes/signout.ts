import { endSession } from '../../admin/accounts.ts';
import { routeModule } from '../../core/plugins.ts';
import { formBody, SESSION_COOKIE } from '../pages.ts';

/** `POST /dashboard/signout`: ends the session on the server, not only in the browser. */
export default routeModule((app) => {
  app.post('/signout', { schema: { body: formBody({}) } }, async (request, reply) => {
    const sessionId = request.dashboard?.principal.sessionId;
    if (sessionId) await endSession(app.ctx.db, sessionId);
    reply.clearCookie(SESSION_COOKIE, { path: '/' });
    return reply.redirect('/dashboard/signin?done=signed_out', 303);
  });
});
