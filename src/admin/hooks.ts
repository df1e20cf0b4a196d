import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Database } from '../db/index.ts';
import type { Project } from '../db/schema.ts';
import type { Principal } from './accounts.ts';
import { ownedProject } from './service.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The project named by the route, once the principal may see it (scopes with `ownProject`). */
    ownedProject: Project;
  }
}

/**
 * The ownership hook of a scope whose routes all name a project (`/projects/:project/…` in the admin API,
 * `/projects/:id/…` in the dashboard): after the route's schema has checked the parameters, the project
 * is read once and kept on the request (`request.ownedProject`), or the request ends with a 404 when the principal may not see it
 * (another developer's project does not exist).
 */
export function ownProject(
  scope: FastifyInstance,
  options: { db: Database; param: string; principal: (request: FastifyRequest) => Principal },
): void {
  scope.decorateRequest('ownedProject', null as unknown as Project);
  scope.addHook('preHandler', async (request, reply) => {
    if (reply.sent) return; // an earlier hook answered (the dashboard's sign-in redirect)
    // a form route takes its refused body back (attachValidation), never a refused path
    const invalid = request.validationError as (Error & { validationContext?: string }) | undefined;
    if (invalid && invalid.validationContext !== 'body') throw invalid;
    const id = (request.params as Record<string, string>)[options.param]!;
    request.ownedProject = await ownedProject(options, options.principal(request), id);
  });
}
