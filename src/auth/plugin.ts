import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError, unauthorized } from '../core/errors.ts';
import type { ProjectContext } from '../projects/directory.ts';
import type { ResolvedKey } from './key-directory.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The project (paywall) whose API key authenticated this request. */
    project: ProjectContext;
    apiKeyId: string;
    /** The end user whose key (`tgu_…`) authenticated this request; undefined for a project key. */
    endUser: string | undefined;
  }
}

/**
 * Bearer authentication for every `/v1` route: `Authorization: Bearer <key>`, or `x-api-key: <key>` as
 * Anthropic's clients send it. Missing, unknown or revoked keys get 401 `invalid_api_key` in OpenAI's
 * error shape (Anthropic's on `/v1/messages`; the official clients raise their AuthenticationError).
 * Warm keys and projects are served from memory.
 *
 * An end-user key (./user-keys.ts) authenticates as its user (`request.endUser`): past its expiry it is
 * a 401; it reaches the model APIs and its own balance and activity only (`USER_KEY_ROUTES`), anything
 * else is a 403 `permission_error`. The check is a map lookup on the route: no round trip.
 */
export function installAuth(app: FastifyInstance): void {
  app.decorateRequest('project', null as unknown as ProjectContext);
  app.decorateRequest('apiKeyId', '');
  app.decorateRequest('endUser', undefined);
  const { keys, projects } = app.ctx;
  // A callback hook: a warm key and project authenticate without a promise.
  app.addHook('onRequest', (request: FastifyRequest, _reply, done) => {
    const secret = presentedKey(request);
    const key = keys.cached(secret);
    const project = key ? projects.cached(key.projectId) : undefined;
    if (key && project) {
      request.project = project;
      request.apiKeyId = key.id;
      if (key.user !== undefined) {
        done(userKeyRefusal(request, key, key.user));
        return;
      }
      done();
      return;
    }
    authenticate(app, request, secret).then(() => done(), done);
  });
}

/**
 * What an end-user key may call: the model APIs (`model`), and its own balance and activity (`self`:
 * the `user` query parameter defaults to the key's user and may name no other). Everything else —
 * key management, deposits, charges, grants, links, spend caps, webhooks, stored responses — is 403.
 */
const USER_KEY_ROUTES = new Map<string, 'model' | 'self'>([
  ['POST /v1/chat/completions', 'model'],
  ['POST /v1/responses', 'model'],
  ['POST /v1/embeddings', 'model'],
  ['POST /v1/messages', 'model'],
  ['POST /v1/messages/count_tokens', 'model'],
  ['GET /v1/models', 'model'],
  ['GET /v1/models/*', 'model'],
  ['GET /v1/user/balance', 'self'],
  ['GET /v1/user/activity', 'self'],
]);

const forbidden = (message: string) =>
  new ApiError(403, 'permission_error', message, { code: 'end_user_key_forbidden' });

/** Sets the request's end user from its key; the error to answer with when the key may not do this. */
function userKeyRefusal(request: FastifyRequest, key: ResolvedKey, user: string): ApiError | undefined {
  if (key.expiresAt !== undefined && Date.now() >= key.expiresAt)
    return unauthorized(`This end-user key expired at ${new Date(key.expiresAt).toISOString()}.`);
  const route = request.routeOptions.url;
  // (An unknown URL answers its 404.)
  if (route === undefined) return undefined;
  const method = request.method === 'HEAD' ? 'GET' : request.method;
  const access = USER_KEY_ROUTES.get(`${method} ${route}`);
  if (!access)
    return forbidden(
      'An end-user key can call the model APIs and read its own balance and activity only; use the project key.',
    );
  if (access === 'self') {
    const query = request.query as Record<string, unknown>;
    if (query.user === undefined) query.user = user;
    else if (query.user !== user) return forbidden('An end-user key can read only its own user.');
  }
  request.endUser = user;
  return undefined;
}

/** The key a request presents; 401 when there is none or the header is malformed. */
function presentedKey(request: FastifyRequest): string {
  const header = request.headers.authorization;
  const apiKeyHeader = request.headers['x-api-key'];
  if (header) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!match) throw unauthorized('Malformed Authorization header. Expected `Authorization: Bearer <key>`.');
    return match[1]!;
  }
  if (typeof apiKeyHeader === 'string' && apiKeyHeader.trim()) return apiKeyHeader.trim();
  throw unauthorized('Missing API key. Send it as `Authorization: Bearer <key>` (or `x-api-key: <key>`).');
}

async function authenticate(app: FastifyInstance, request: FastifyRequest, secret: string): Promise<void> {
  const key = await app.ctx.keys.resolve(secret);
  if (!key) throw unauthorized('Incorrect API key provided, or the key was revoked.');
  const project = await app.ctx.projects.get(key.projectId);
  if (!project)
    throw new ApiError(401, 'authentication_error', 'The project of this API key no longer exists.', {
      code: 'invalid_api_key',
    });
  request.project = project;
  request.apiKeyId = key.id;
  if (key.user !== undefined) {
    const refusal = userKeyRefusal(request, key, key.user);
    if (refusal) throw refusal;
  }
}
