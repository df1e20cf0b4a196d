import type { FastifyInstance } from 'fastify';
import { pendingMigrations, ping } from '../db/index.ts';

/** A readiness check that takes longer than this counts as failed (probes time out too). */
const CHECK_TIMEOUT_MS = 10_000;

function withinTimeout<T>(work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

/**
 * `/healthz`: the process is up (it stays up while the database is down: restarting it would not help).
 * `/readyz`: the database answers and every migration is applied; 503 while Postgres is down or
 * restarting, 200 again by itself once it is back.
 */
export async function healthRoutes(app: FastifyInstance): Promise<void> {
  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/readyz', async (_request, reply) => {
    const checks: Record<string, string> = {};
    let ready = true;
    try {
      await withinTimeout(ping(app.ctx.db));
      checks.database = 'ok';
      const pending = await withinTimeout(pendingMigrations(app.ctx.database));
      checks.migrations = pending.length === 0 ? 'ok' : `pending: ${pending.join(', ')}`;
      ready = pending.length === 0;
    } catch (err) {
      checks.database = `unreachable: ${(err as Error).message}`;
      ready = false;
    }
    reply.status(ready ? 200 : 503);
    if (!ready) reply.header('retry-after', '2');
    return { status: ready ? 'ready' : 'not_ready', checks };
  });
}
