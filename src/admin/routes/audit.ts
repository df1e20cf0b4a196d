import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import {
  type AuditQuery,
  type AuditScope,
  auditCsv,
  auditQuerySchema,
  listAudit,
} from '../../audit/index.ts';
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
  plain: FastifyInstance,
  scope: AuditScope,
  raw: AuditQuery,
  csvName: string,
  reply: Parameters<typeof sendCsv>[0],
) {
  const { format, ...query } = raw;
  const { data, hasMore } = await listAudit(plain.ctx.db, scope, query);
  if (format === 'json') return list(data, hasMore);
  return sendCsv(reply, csvName, auditCsv(data));
}

export async function auditRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  app.get('/audit', { schema: { querystring } }, async (request, reply) => {
    const { developerId } = request.principal;
    const scope = developerId === null ? {} : { developerId };
    return answer(plain, scope, request.query, 'tollgate-audit.csv', reply);
  });
}

export async function projectAuditRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  app.get(
    '/projects/:project/audit',
    { schema: { params: projectParams, querystring } },
    async (request, reply) => {
      const projectId = request.params.project;
      return answer(plain, { projectId }, request.query, `tollgate-audit-${projectId}.csv`, reply);
    },
  );
}
