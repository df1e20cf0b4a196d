import type { FastifyInstance } from 'fastify';
import { pendingMigrations, ping } from '../db/index.ts';

/** `/healthz`: the process is up. `/readyz`: the database answers and every migration is applied. */
export async function healthRoutes(app: FastifyInstance): Promise<void> {
  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/readyz', async (_request, reply) => {
    const checks: Record<string, string> = {};
    let ready = true;
    try {
      await ping(app.ctx.db);
      checks.database = 'ok';
      const pending = await pendingMigrations(app.ctx.database);
      checks.migrations = pending.length === 0 ? 'ok' : `pending: ${pending.join(', ')}`;
      ready = pending.length === 0;
    } catch (err) {
      checks.database = `unreachable: ${(err as Error).message}`;
      ready = false;
    }
    reply.status(ready ? 200 : 503);
    return { status: ready ? 'ready' : 'not_ready', checks };
  });
}
