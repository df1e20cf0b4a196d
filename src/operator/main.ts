import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import type { AppContext } from '../app/context.ts';
import { createContext } from '../app/context.ts';
import type { Config } from '../config/index.ts';
import { pendingMigrations, ping } from '../db/index.ts';
import { findProjectByManager } from '../projects/service.ts';
import { subscriptionsChangedChannel } from '../webhooks/filter.ts';
import {
  createSubscription,
  findSubscriptionByManager,
  setSubscriptionActive,
  updateSubscription,
  validateSubscriptionInput,
} from '../webhooks/subscriptions.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../webhooks/worker/index.ts';
import { Controller } from './controller.ts';
import type { SubscriptionStore } from './reconciler.ts';
import { managedByOf, ResourcesController } from './resources/framework.ts';
import { RESOURCE_HANDLERS } from './resources/kinds.ts';
import { type KubeClients, loadKubeConfig, makeClients } from './runtime/kube.ts';
import { LeaderElector } from './runtime/leader-election.ts';
import { startHealthServer } from './server.ts';

const SERVICE_ACCOUNT_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

/** The subscription service the REST API uses, bound to a context. */
export function subscriptionStore(ctx: AppContext): SubscriptionStore {
  return {
    findByManager: (managedBy) => findSubscriptionByManager(ctx, managedBy),
    create: async (projectId, input, opts) =>
      (await createSubscription(ctx, projectId, input, opts)).subscription,
    update: (projectId, id, input, opts) => updateSubscription(ctx, projectId, id, input, opts),
    setActive: (projectId, id, active, opts) => setSubscriptionActive(ctx, projectId, id, active, opts),
    validate: (input) => validateSubscriptionInput(ctx, input),
    resolveProject: async (namespace, name) =>
      (await findProjectByManager(ctx.db, managedByOf('Project', namespace, name)))?.id,
  };
}

export interface OperatorOptions {
  kube: KubeClients;
  /** Empty: all namespaces. */
  namespaces: string[];
  /** Leader-election identity (the pod name). */
  identity?: string;
  /** Starts the webhook delivery worker (default: the real one). */
  startWorker?: (ctx: AppContext) => DeliveryWorker;
}

export interface RunningOperator {
  readonly identity: string;
  isLeader(): boolean;
  /** Stop reconciling; let deliveries in flight finish within graceMs; release the lease. */
  shutdown(graceMs: number): Promise<void>;
}

export function leaseNamespace(config: Config): string {
  if (config.OPERATOR_LEASE_NAMESPACE) return config.OPERATOR_LEASE_NAMESPACE;
  if (existsSync(SERVICE_ACCOUNT_NAMESPACE)) {
    const ns = readFileSync(SERVICE_ACCOUNT_NAMESPACE, 'utf8').trim();
    if (ns) return ns;
  }
  return 'default';
}

/**
 * Campaigns for the lease; while leader, runs the WebhookSubscription controller, the controller of the
 * deployment's resources (Project, ApiKey, ModelProvider, PriceList, LimitPolicy) and the delivery
 * worker, and stops both the moment leadership is lost.
 */
export function startOperator(ctx: AppContext, options: OperatorOptions): RunningOperator {
  const { config, log } = ctx;
  const identity = options.identity ?? config.POD_NAME ?? hostname();
  const startWorker = options.startWorker ?? ((c: AppContext) => startDeliveryWorker(c));
  let controller: Controller | undefined;
  let resources: ResourcesController | undefined;
  let worker: DeliveryWorker | undefined;
  // Leadership changes are applied one after the other, in order.
  let transitions: Promise<void> = Promise.resolve();
  const serially = (step: () => Promise<void>) => {
    transitions = transitions
      .then(step)
      .catch((err) => log.error({ err }, 'operator: leadership change failed'));
    return transitions;
  };

  const stopLeading = (graceMs: number) =>
    serially(async () => {
      ctx.metrics.leader.set(0);
      const running = [controller?.stop(), resources?.stop(), worker?.stop(graceMs)];
      controller = undefined;
      resources = undefined;
      worker = undefined;
      await Promise.allSettled(running);
    });

  const elector = new LeaderElector({
    api: options.kube.coordination,
    name: config.OPERATOR_LEASE_NAME,
    namespace: leaseNamespace(config),
    identity,
    leaseDurationMs: config.OPERATOR_LEASE_DURATION_SECONDS * 1000,
    renewDeadlineMs: config.OPERATOR_RENEW_DEADLINE_SECONDS * 1000,
    retryPeriodMs: config.OPERATOR_RETRY_PERIOD_SECONDS * 1000,
    log,
    onStartedLeading: () =>
      void serially(async () => {
        if (!elector.isLeader) return;
        ctx.metrics.leader.set(1);
        worker = startWorker(ctx);
        controller = new Controller({
          kube: options.kube,
          store: subscriptionStore(ctx),
          log,
          metrics: ctx.metrics,
          namespaces: options.namespaces,
          identity,
          statusSyncMs: config.OPERATOR_STATUS_SYNC_SECONDS * 1000,
          watchRows: (onPaywall) => ctx.bus.subscribe(subscriptionsChangedChannel, onPaywall),
        });
        const starting = controller;
        starting.start().catch((err) => log.error({ err }, 'operator: controller failed to start'));
        // Project, ApiKey, ModelProvider, PriceList, LimitPolicy (src/operator/resources).
        resources = new ResourcesController({
          ctx,
          kube: options.kube,
          handlers: RESOURCE_HANDLERS,
          namespaces: options.namespaces,
          identity,
          resyncMs: config.OPERATOR_STATUS_SYNC_SECONDS * 1000,
          onProject: (namespace, name) => starting.enqueueProjectRef(namespace, name),
        });
        resources
          .start()
          .catch((err) => log.error({ err }, 'operator: resources controller failed to start'));
      }),
    // Lost the lease: another replica may already be delivering, so stop now, without grace.
    onStoppedLeading: () => void stopLeading(0),
  });
  elector.start();
  log.info(
    `operator ${identity} campaigning for lease ${leaseNamespace(config)}/${config.OPERATOR_LEASE_NAME}`,
  );

  return {
    identity,
    isLeader: () => elector.isLeader,
    async shutdown(graceMs: number) {
      // Keep renewing while deliveries finish, then hand the lease over.
      await stopLeading(graceMs);
      await elector.stop({ release: true });
      await transitions;
    },
  };
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
