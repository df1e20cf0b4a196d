import type { FastifyInstance } from 'fastify';
import { safeEqual } from '../../core/crypto.ts';
import { ApiError } from '../../core/errors.ts';
import { type Principal, resolveAdminToken, resolveSession } from '../accounts.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** Who is calling the admin API (scopes with `authenticate`). */
    principal: Principal;
  }
}

/**
 * Who is calling the admin API: `Authorization: Bearer` with TOLLGATE_ADMIN_TOKEN (full access), an admin
 * token `tga_…`, or a session token `tgs_…` (sign-in). Anything else is a 401.
 */

const unauthenticated = (message: string) =>
  new ApiError(401, 'authentication_error', message, { code: 'invalid_admin_token' });

/** Resolves the bearer of an admin request: the full-access token, an admin token, or a session token. */
export async function principalOf(app: FastifyInstance, header: string | undefined): Promise<Principal> {
  if (!header) throw unauthenticated('Missing admin token. Send it as `Authorization: Bearer <token>`.');
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  if (!match)
    throw unauthenticated('Malformed Authorization header. Expected `Authorization: Bearer <token>`.');
  const token = match[1]!;
  const root = app.ctx.config.TOLLGATE_ADMIN_TOKEN;
  if (root && safeEqual(token, root)) {
    return { developerId: null, email: null, actorType: 'admin_token', actorId: 'TOLLGATE_ADMIN_TOKEN' };
  }
  const found = token.startsWith('tgs_')
    ? await resolveSession(app.ctx.db, token)
    : token.startsWith('tga_')
      ? await resolveAdminToken(app.ctx.db, token)
      : undefined;
  if (!found) throw unauthenticated('Incorrect admin token, or it was revoked or has expired.');
  return found;
}

/** The authentication hook of a scope: every route needs a bearer, read once into `request.principal`. */
export function authenticate(scope: FastifyInstance): void {
  scope.decorateRequest('principal', null as unknown as Principal);
  scope.addHook('onRequest', async (request) => {
    request.principal = await principalOf(scope, request.headers.authorization);
    // for the audit log: the address (TOLLGATE_TRUSTED_PROXIES honoured by fastify) and the way in
    request.principal.ip = request.ip;
    request.principal.via = 'admin_api';
  });
}
