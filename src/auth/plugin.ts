import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError, unauthorized } from '../core/errors.ts';
import type { ProjectContext } from '../projects/directory.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The project (paywall) whose API key authenticated this request. */
    project: ProjectContext;
    apiKeyId: string;
  }
}

/**
 * Bearer authentication for every `/v1` route: `Authorization: Bearer <key>`, or `x-api-key: <key>` as
 * Anthropic's clients send it. Missing, unknown or revoked keys get 401 `invalid_api_key` in OpenAI's
 * error shape (Anthropic's on `/v1/messages`; the official clients raise their AuthenticationError).
 * Warm keys and projects are served from memory.
 */
export function installAuth(app: FastifyInstance): void {
  app.decorateRequest('project', null as unknown as ProjectContext);
  app.decorateRequest('apiKeyId', '');
  const { keys, projects } = app.ctx;
  // A callback hook: a warm key and project authenticate without a promise.
  app.addHook('onRequest', (request: FastifyRequest, _reply, done) => {
    const secret = presentedKey(request);
    const key = keys.cached(secret);
    const project = key ? projects.cached(key.projectId) : undefined;
    if (key && project) {
      request.project = project;
      request.apiKeyId = key.id;
      done();
      return;
    }
    authenticate(app, request, secret).then(() => done(), done);
  });
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
}
