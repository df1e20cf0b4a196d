import type { FastifyInstance } from 'fastify';
import { registerAll } from '../../core/plugins.ts';
import { ownProject } from '../hooks.ts';
import { accountRoutes, signUpRoutes } from './accounts.ts';
import { auditRoutes, projectAuditRoutes } from './audit.ts';
import { modelRoutes } from './models.ts';
import { paymentRoutes } from './payments.ts';
import { authenticate } from './principal.ts';
import { projectListRoutes, projectRoutes } from './projects.ts';
import { reportRoutes } from './reports.ts';
import { userRoutes } from './users.ts';
import { webhookRoutes } from './webhooks.ts';

/**
 * The admin API under `/admin/v1` (apart from the project-key `/v1`): accounts, sessions and admin
 * tokens; projects, their provider, API keys, models and pricing; end users and their money; usage
 * reports; the audit log; webhook subscriptions and delivery logs; payments. Authenticated with
 * `Authorization: Bearer` and one of: TOLLGATE_ADMIN_TOKEN (full access), an admin token `tga_…`, or a
 * session token `tgs_…` (sign-in; ./principal.ts). Sign-up and sign-in need no token. Errors have
 * OpenAI's shape; lists are cursor lists (`limit`, `starting_after`, `has_more`).
 *
 * One module per resource, registered in three scopes: no token; a bearer (the `authenticate` hook
 * sets `request.principal`); and the routes under `/projects/:project` (the `ownProject` hook, ../hooks.ts,
 * sets `request.ownedProject` once the principal may see it: another developer's project is a 404).
 */
export async function adminRoutes(app: FastifyInstance): Promise<void> {
  await app.register(signUpRoutes);

  await app.register(async (scoped) => {
    authenticate(scoped);
    await registerAll(scoped, [accountRoutes, projectListRoutes, auditRoutes]);

    await scoped.register(async (project) => {
      ownProject(project, { db: app.ctx.db, param: 'project', principal: (request) => request.principal });
      await registerAll(project, [
        projectRoutes,
        modelRoutes,
        userRoutes,
        projectAuditRoutes,
        reportRoutes,
        webhookRoutes,
        paymentRoutes,
      ]);
    });
  });
}
