import { checkProvider, pricingAudit } from '../admin/service.ts';
import { type AppContext, createContext } from '../app/context.ts';
import type { Config } from '../config/index.ts';
import { pendingMigrations, ping } from '../db/index.ts';
import { type RunningOperator, startReplica } from '../operator/replica.ts';
import { kindHandlers } from '../operator/resources/index.ts';
import { type KubeClients, loadKubeConfig, makeClients } from '../operator/runtime/kube.ts';
import { startHealthServer } from '../operator/server.ts';
import { operatorStores } from '../operator/stores.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../webhooks/worker/index.ts';

/**
 * `tollgate operator`: the operator composed from the app context — its kinds' stores and handlers, the
 * replica campaigning for the lease, the delivery worker — with its health and metrics server.
 */

export interface OperatorOptions {
  kube: KubeClients;
  /** Empty: all namespaces. */
  namespaces: string[];
  /** Leader-election identity (the pod name). */
  identity?: string;
  /** Starts the webhook delivery worker (default: the real one). */
  startWorker?: (ctx: AppContext) => DeliveryWorker;
}

/**
 * Campaigns for the lease; while leader, reconciles the deployment's resources (Project, ApiKey,
 * ModelProvider, PriceList, LimitPolicy, WebhookSubscription) and runs the delivery worker.
 */
export function startOperator(ctx: AppContext, options: OperatorOptions): RunningOperator {
  const admin = {
    checkProvider: (input: { baseUrl: string; apiKey?: string }) => checkProvider(ctx, input),
    pricingAudit,
  };
  const startWorker = options.startWorker ?? startDeliveryWorker;
  return startReplica({
    config: ctx.config,
    log: ctx.log,
    metrics: ctx.metrics,
    kube: options.kube,
    namespaces: options.namespaces,
    ...(options.identity !== undefined ? { identity: options.identity } : {}),
    handlers: kindHandlers(operatorStores(ctx, admin)),
    startWorker: () => startWorker(ctx),
  });
}

/** Entry of `tollgate operator`. */
export async function runOperator(config: Config, options: { namespaces: string[] }): Promise<number> {
  let signal: string | undefined;
  let onSignal: ((s: string) => void) | undefined;
  const signalled = new Promise<string>((resolve) => {
    onSignal = (s) => {
      signal = s;
      resolve(s);
    };
    process.once('SIGTERM', onSignal);
    process.once('SIGINT', onSignal);
  });
  const kube = makeClients(loadKubeConfig());
  const ctx = await createContext(config);
  const operator = startOperator(ctx, { kube, namespaces: options.namespaces });
  const health = await startHealthServer({
    port: config.OPERATOR_PORT,
    host: config.HOST,
    registry: ctx.metrics.registry,
    // Ready: the database answers with every migration applied (a follower is ready too: it takes
    // over without a restart).
    ready: async () => {
      await ping(ctx.db);
      const pending = await pendingMigrations(ctx.database);
      return {
        ok: pending.length === 0,
        detail: {
          leader: operator.isLeader(),
          identity: operator.identity,
          database: 'ok',
          migrations: pending.length ? `pending: ${pending.join(', ')}` : 'ok',
        },
      };
    },
  });
  ctx.log.info(
    `tollgate operator ${operator.identity}: health and metrics on port ${health.port}; watching ${
      options.namespaces.length ? options.namespaces.join(', ') : 'all namespaces'
    }`,
  );
  await signalled;
  const graceMs = config.OPERATOR_SHUTDOWN_GRACE_SECONDS * 1000;
  ctx.log.info(
    `${signal} received: finishing deliveries in flight (up to ${graceMs} ms), then releasing the lease`,
  );
  await operator.shutdown(graceMs);
  await health.close();
  await ctx.close();
  return 0;
}
