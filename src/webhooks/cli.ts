import { type AppContext, createContext } from '../app/context.ts';
import type { Output } from '../cli/output.ts';
import type { Config } from '../config/index.ts';
import { projectOfSubscription, setSubscriptionActive } from './subscriptions.ts';
import { startDeliveryWorker } from './worker/index.ts';

/** `tollgate webhooks enable|disable ID`: the re-enable operation the REST surface does not expose. */
export async function webhooksCommand(
  config: Config,
  action: string | undefined,
  id: string | undefined,
  out: Output,
  usage: (message: string) => Error,
): Promise<void> {
  if (action !== 'enable' && action !== 'disable')
    throw usage(`unknown command: webhooks ${action ?? ''}`.trim());
  if (!id) throw usage(`webhooks ${action} needs a subscription id`);
  const ctx: AppContext = await createContext(config);
  try {
    const projectId = await projectOfSubscription(ctx, id);
    const view = await setSubscriptionActive(ctx, projectId, id, action === 'enable');
    out.result(view, `${view.isActive ? 'Enabled' : 'Disabled'} webhook subscription ${id} (${view.url})`);
  } finally {
    await ctx.close();
  }
}

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
