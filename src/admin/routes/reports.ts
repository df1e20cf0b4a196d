import { routeModule } from '../../core/plugins.ts';
import {
  reconciliationCsv,
  reconciliationQuerySchema,
  reconciliationReport,
  reportQuerySchema,
  usageReport,
} from '../reports.ts';
import { projectParams, sendCsv } from './schemas.ts';

/** A project's reports (../reports.ts): usage and revenue; the reconciliation (JSON, or CSV by default). */
export const reportRoutes = routeModule((app, ctx) => {
  app.get(
    '/projects/:project/reports/usage',
    { schema: { params: projectParams, querystring: reportQuerySchema } },
    async (request) => usageReport(ctx, request.ownedProject, request.query),
  );
  app.get(
    '/projects/:project/reports/reconciliation',
    { schema: { params: projectParams, querystring: reconciliationQuerySchema } },
    async (request, reply) => {
      const report = await reconciliationReport(ctx, request.ownedProject, request.query);
      if (request.query.format === 'json') return report;
      const name = `tollgate-reconciliation-${request.ownedProject.id}-${report.days}d.csv`;
      return sendCsv(reply, name, reconciliationCsv(report.data));
    },
  );
});
