import {
  type AuditQuery,
  type AuditScope,
  auditCsv,
  auditQuerySchema,
  listAudit,
} from '../../audit/index.ts';
import { routeModule } from '../../core/plugins.ts';
import type { Database } from '../../db/index.ts';
import { list } from '../service.ts';
import { projectParams, sendCsv } from './schemas.ts';

/**
 * The audit log (../../audit): newest first, `format=csv` exports it. `auditRoutes`: every entry the
 * principal may see — all (full access), or a developer's projects' and their own; `projectAuditRoutes`:
 * a project's entries.
 */

const querystring = auditQuerySchema;

/** The entries as a JSON list or a CSV download. */
async function answer(
  db: Database,
  scope: AuditScope,
  raw: AuditQuery,
  csvName: string,
  reply: Parameters<typeof sendCsv>[0],
) {
  const { format, ...query } = raw;
  const { data, hasMore } = await listAudit(db, scope, query);
  if (format === 'json') return list(data, hasMore);
  return sendCsv(reply, csvName, auditCsv(data));
}

export const auditRoutes = routeModule((app, ctx) => {
  app.get('/audit', { schema: { querystring } }, async (request, reply) => {
    const { developerId } = request.principal;
    const scope = developerId === null ? {} : { developerId };
    return answer(ctx.db, scope, request.query, 'tollgate-audit.csv', reply);
  });
});

export const projectAuditRoutes = routeModule((app, ctx) => {
  app.get(
    '/projects/:project/audit',
    { schema: { params: projectParams, querystring } },
    async (request, reply) => {
      const projectId = request.params.project;
      return answer(ctx.db, { projectId }, request.query, `tollgate-audit-${projectId}.csv`, reply);
    },
  );
});
