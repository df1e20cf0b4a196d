import { createContext } from '../app/context.ts';
import type { Config } from '../config/index.ts';
import { startDeliveryWorker } from '../webhooks/worker/index.ts';

/**
 * `tollgate worker`: fan-out and delivery without the HTTP server, for deployments without the
 * operator. Any number may run; stops gracefully on SIGINT/SIGTERM.
 */
export async function runWorker(config: Config): Promise<number> {
  const stopRequested = new Promise<string>((resolve) => {
    process.once('SIGINT', () => resolve('SIGINT'));
    process.once('SIGTERM', () => resolve('SIGTERM'));
  });
  const ctx = await createContext(config);
  const worker = startDeliveryWorker(ctx);
  await worker.ready;
  ctx.log.info(
    { database: ctx.database.kind, bus: ctx.bus.kind, concurrency: config.WEBHOOK_WORKER_CONCURRENCY },
    'tollgate webhook worker started',
  );
  const signal = await stopRequested;
  ctx.log.info(`${signal} received: finishing deliveries in flight`);
  await worker.stop();
  await ctx.close();
  return 0;
}
