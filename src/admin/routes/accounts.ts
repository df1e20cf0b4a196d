import { z } from 'zod';
import { ApiError } from '../../core/errors.ts';
import { routeModule } from '../../core/plugins.ts';
import { textInput } from '../../core/validation.ts';
import {
  admitSignUp,
  checkCredentials,
  createAdminToken,
  createInvite,
  createSession,
  credentialsSchema,
  endSession,
  getDeveloper,
  inviteSchema,
  inviteUrl,
  listAdminTokens,
  revokeAdminToken,
  SIGN_UP_ANSWER,
  signUp,
  signUpSchema,
} from '../accounts.ts';
import { list } from '../service.ts';
import { principalOf } from './principal.ts';
import { nameBody } from './schemas.ts';

/**
 * Accounts: sign-up (`POST /developers`) and sign-in (`POST /sessions`), which need no token
 * (`signUpRoutes`; limits: ../rate-limit.ts, shared with the dashboard); and with a bearer
 * (`accountRoutes`): who am I, sign-out, admin tokens, invites.
 */

export const signUpRoutes = routeModule((app, ctx) => {
  // The same answer whether or not the address had an account (it must not tell who has one).
  app.post('/developers', { schema: { body: signUpSchema } }, async (request, reply) => {
    await app.accountLimits.signUp(request);
    // A full-access admin may create accounts whatever TOLLGATE_SIGNUP says.
    const bearer = request.headers.authorization;
    const fullAccess = bearer ? (await principalOf(app, bearer)).developerId === null : false;
    admitSignUp(ctx.config.TOLLGATE_SIGNUP, ctx.sealer, request.body, fullAccess);
    await signUp(ctx.db, request.body);
    reply.status(202);
    return { object: 'sign_up', status: 'accepted', message: SIGN_UP_ANSWER };
  });

  app.post('/sessions', { schema: { body: credentialsSchema } }, async (request, reply) => {
    // The attempt is counted before the password is checked.
    await app.accountLimits.signIn(request, request.body.email);
    const developer = await checkCredentials(ctx.db, request.body);
    const session = await createSession(ctx.db, developer.id);
    reply.status(201);
    return { developer, session: { token: session.token, expiresAt: session.expiresAt.toISOString() } };
  });
});

export const accountRoutes = routeModule((app, ctx) => {
  app.get('/me', async (request) => {
    const p = request.principal;
    return {
      object: 'principal',
      access: p.developerId ? 'developer' : 'full',
      developer: p.developerId ? await getDeveloper(ctx.db, p.developerId) : null,
      actorType: p.actorType,
      actorId: p.actorId,
    };
  });

  app.delete('/sessions/current', async (request) => {
    if (!request.principal.sessionId)
      throw new ApiError(400, 'invalid_request_error', 'This bearer is not a session token.', {
        code: 'not_a_session',
      });
    await endSession(ctx.db, request.principal.sessionId);
    return { object: 'session', deleted: true };
  });

  app.post('/admin-tokens', { schema: { body: nameBody } }, async (request, reply) => {
    reply.status(201);
    return createAdminToken(ctx.db, request.principal, request.body.name);
  });
  app.get('/admin-tokens', async (request) => list(await listAdminTokens(ctx.db, request.principal), false));
  app.delete('/admin-tokens/:id', { schema: { params: z.object({ id: textInput(255) }) } }, async (request) =>
    revokeAdminToken(ctx.db, request.principal, request.params.id),
  );

  // invites (TOLLGATE_SIGNUP=invite): made by a full-access admin, for one e-mail address
  app.post('/invites', { schema: { body: inviteSchema } }, async (request, reply) => {
    if (request.principal.developerId !== null)
      throw new ApiError(403, 'permission_error', 'Only a full-access admin token can invite.', {
        code: 'full_access_required',
      });
    const invite = createInvite(ctx.sealer, request.body.email, request.body.expiresInDays);
    reply.status(201);
    return {
      object: 'invite',
      email: invite.email,
      code: invite.code,
      url: inviteUrl(ctx.publicBaseUrl, invite.code),
      expiresAt: invite.expiresAt.toISOString(),
    };
  });
});
