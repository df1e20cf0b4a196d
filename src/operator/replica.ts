import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import type { Metrics } from '../metrics/registry.ts';
import type { DeliveryWorker } from '../webhooks/worker/index.ts';
import type { KindHandler } from './handler.ts';
import { Manager } from './manager.ts';
import type { KubeClients } from './runtime/kube.ts';
import { LeaderElector } from './runtime/leader-election.ts';

/**
 * One operator replica: campaigns for the lease; while leader, runs the manager (every kind's
 * reconcile) and the webhook delivery worker, and stops both the moment leadership is lost.
 */

const SERVICE_ACCOUNT_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

export interface ReplicaOptions {
  config: Config;
  log: Logger;
  metrics: Pick<Metrics, 'leader' | 'reconciles' | 'reconcileDuration'>;
  kube: KubeClients;
  /** Empty: all namespaces. */
  namespaces: string[];
  /** Leader-election identity (default: the pod name). */
  identity?: string;
  /** The kinds reconciled (src/operator/resources). */
  handlers: KindHandler[];
  /** Starts the webhook delivery worker. */
  startWorker(): DeliveryWorker;
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

export function startReplica(options: ReplicaOptions): RunningOperator {
  const { config, log, metrics } = options;
  const identity = options.identity ?? config.POD_NAME ?? hostname();
  let manager: Manager | undefined;
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
      metrics.leader.set(0);
      const running = [manager?.stop(), worker?.stop(graceMs)];
      manager = undefined;
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
        metrics.leader.set(1);
        worker = options.startWorker();
        manager = new Manager({
          kube: options.kube,
          handlers: options.handlers,
          log,
          metrics,
          namespaces: options.namespaces,
          identity,
          resyncMs: config.OPERATOR_STATUS_SYNC_SECONDS * 1000,
        });
        manager.start().catch((err) => log.error({ err }, 'operator: controller failed to start'));
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
