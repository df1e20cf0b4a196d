import type { V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/registry.ts';
import { GROUP, PLURAL, VERSION } from './api.ts';
import { Reconciler, type SubscriptionStore, secretSourceOf } from './reconciler.ts';
import { Informer, type InformerEvent } from './runtime/informer.ts';
import { type KubeClients, keyOf, kubeErrorMessage } from './runtime/kube.ts';
import { isTerminal } from './runtime/reconcile.ts';
import { WorkQueue } from './runtime/workqueue.ts';
import type { WebhookSubscription } from './status.ts';

export interface ControllerOptions {
  kube: KubeClients;
  store: SubscriptionStore;
  log: Logger;
  metrics: Metrics;
  /** Namespaces to watch; empty: all namespaces. */
  namespaces: string[];
  identity: string;
  /**
   * A synced resource asks to be reconciled again after this long (its Result's requeueAfter): delivery
   * stats mirrored into status, drift of the row put back. Undefined: only on changes and notices.
   */
  statusSyncMs?: number;
  workers?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * Subscribes to "the subscriptions of this paywall changed" notices (the bus); the resources of that
   * paywall are reconciled at once instead of at their next requeue. Returns the unsubscribe function.
   */
  watchRows?: (onPaywall: (paywallId: string) => void) => Promise<() => Promise<void>>;
}

/**
 * The WebhookSubscription controller: informers on the resources and on Secrets feed a keyed work queue,
 * workers drain it through the reconciler. What happens next is the reconcile's Result: a requeue-after
 * (status mirroring), a retry with exponential backoff (a result asking for it, or an error), or nothing
 * (a TerminalError, until the resource changes).
 */
export class Controller {
  readonly #o: ControllerOptions;
  readonly #queue: WorkQueue;
  readonly #resources: Informer<WebhookSubscription>[];
  readonly #secrets: Informer<V1Secret & { metadata: { name: string } }>[];
  readonly #reconciler: Reconciler;
  #workers: Promise<void>[] = [];
  #unwatchRows: (() => Promise<void>) | undefined;
  #running = false;

  constructor(options: ControllerOptions) {
    this.#o = options;
    this.#queue = new WorkQueue({
      baseDelayMs: options.baseBackoffMs ?? 500,
      maxDelayMs: options.maxBackoffMs ?? 5 * 60_000,
    });
    const scopes = options.namespaces.length ? options.namespaces : [undefined];
    const { custom, core, config } = options.kube;
    const log = options.log;
    this.#resources = scopes.map(
      (namespace) =>
        new Informer<WebhookSubscription>({
          name: `${PLURAL}${namespace ? ` in ${namespace}` : ''}`,
          kubeConfig: config,
          log,
          watchPath: namespace
            ? `/apis/${GROUP}/${VERSION}/namespaces/${namespace}/${PLURAL}`
            : `/apis/${GROUP}/${VERSION}/${PLURAL}`,
          list: async () =>
            (namespace
              ? await custom.listNamespacedCustomObject({
                  group: GROUP,
                  version: VERSION,
                  namespace,
                  plural: PLURAL,
                })
              : await custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL })) as {
              items: WebhookSubscription[];
              metadata?: { resourceVersion?: string };
            },
          onEvent: (event, object, old) => this.#onResource(event, object, old),
        }),
    );
    this.#secrets = scopes.map(
      (namespace) =>
        new Informer<V1Secret & { metadata: { name: string } }>({
          name: `secrets${namespace ? ` in ${namespace}` : ''}`,
          kubeConfig: config,
          log,
          watchPath: namespace ? `/api/v1/namespaces/${namespace}/secrets` : '/api/v1/secrets',
          list: async () =>
            (namespace
              ? await core.listNamespacedSecret({ namespace })
              : await core.listSecretForAllNamespaces()) as {
              items: Array<V1Secret & { metadata: { name: string } }>;
              metadata?: { resourceVersion?: string };
            },
          onEvent: (_event, secret) => this.#onSecret(secret),
        }),
    );
    this.#reconciler = new Reconciler({
      kube: options.kube,
      store: options.store,
      log,
      identity: options.identity,
      ...(options.statusSyncMs !== undefined ? { statusSyncMs: options.statusSyncMs } : {}),
      getResource: (key) => this.#getResource(key),
      getSecret: (namespace, name) => {
        for (const informer of this.#secrets) {
          const found = informer.get(`${namespace}/${name}`);
          if (found) return found;
        }
        return undefined;
      },
    });
  }

  get queue(): WorkQueue {
    return this.#queue;
  }

  /** Starts the informers, waits for their first list (every key is queued from it), then the workers. */
  async start(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    for (const informer of [...this.#resources, ...this.#secrets]) informer.start();
    await Promise.all([...this.#resources, ...this.#secrets].map((i) => i.waitForSync()));
    if (!this.#running) return;
    const count = this.#o.workers ?? 2;
    for (let i = 0; i < count; i++) this.#workers.push(this.#work());
    if (this.#o.watchRows) {
      try {
        this.#unwatchRows = await this.#o.watchRows((paywallId) => this.#enqueuePaywall(paywallId));
      } catch (err) {
        this.#o.log.warn(
          { err },
          'controller: no change notices from the database; relying on the status sync',
        );
      }
    }
    this.#o.log.info(
      `controller started: watching ${this.#o.namespaces.length ? this.#o.namespaces.join(', ') : 'all namespaces'}`,
    );
  }

  /** Stops at once: no new reconcile starts; the ones running finish. */
  async stop(): Promise<void> {
    if (!this.#running) return;
    this.#running = false;
    await this.#unwatchRows?.().catch(() => {});
    this.#unwatchRows = undefined;
    this.#queue.shutDown();
    await Promise.all([...this.#resources, ...this.#secrets].map((i) => i.stop()));
    await Promise.all(this.#workers);
    this.#workers = [];
  }

  #getResource(key: string): WebhookSubscription | undefined {
    for (const informer of this.#resources) {
      const found = informer.get(key);
      if (found) return found;
    }
    return undefined;
  }

  /** A Project resource changed: reconcile the subscriptions naming it (`spec.projectRef`). */
  enqueueProjectRef(namespace: string | undefined, name: string): void {
    for (const informer of this.#resources)
      for (const resource of informer.list())
        if (resource.metadata.namespace === namespace && resource.spec?.projectRef?.name === name)
          this.#queue.add(keyOf(resource));
  }

  #enqueuePaywall(paywallId: string): void {
    for (const informer of this.#resources)
      for (const resource of informer.list())
        if (resource.spec?.paywallId === paywallId) this.#queue.add(keyOf(resource));
  }

  #onResource(event: InformerEvent, object: WebhookSubscription, old?: WebhookSubscription): void {
    // Status-only changes (our own writes) need no reconcile: only spec (generation) and metadata matter.
    if (
      event === 'update' &&
      old &&
      old.metadata.generation === object.metadata.generation &&
      JSON.stringify(old.metadata.finalizers ?? []) === JSON.stringify(object.metadata.finalizers ?? []) &&
      old.metadata.deletionTimestamp === object.metadata.deletionTimestamp
    )
      return;
    this.#queue.add(keyOf(object));
  }

  /** A Secret changed: reconcile the resources that take their signing secret from it. */
  #onSecret(secret: V1Secret & { metadata: { name: string } }): void {
    const namespace = secret.metadata.namespace;
    for (const informer of this.#resources) {
      for (const resource of informer.list()) {
        if (resource.metadata.namespace !== namespace) continue;
        if (secretSourceOf(resource).name === secret.metadata.name) this.#queue.add(keyOf(resource));
      }
    }
  }

  async #work(): Promise<void> {
    for (;;) {
      const key = await this.#queue.get();
      if (key === undefined) return;
      const started = performance.now();
      let result: string;
      try {
        const outcome = await this.#reconciler.reconcile(key);
        if (outcome.requeue) {
          const delay = this.#queue.addRateLimited(key);
          this.#o.log.info(`${key}: ${outcome.outcome}; retrying in ${delay} ms`);
          result = outcome.outcome === 'error' ? 'error' : 'requeue';
        } else {
          this.#queue.forget(key);
          if (outcome.requeueAfterMs !== undefined) this.#queue.addAfter(key, outcome.requeueAfterMs);
          result = 'success';
        }
      } catch (err) {
        if (isTerminal(err)) {
          this.#queue.forget(key);
          this.#o.log.info(`${key}: not retried until the resource changes: ${err.message}`);
          result = 'terminal';
        } else {
          const delay = this.#queue.addRateLimited(key);
          this.#o.log.warn(`${key}: reconcile failed (${kubeErrorMessage(err)}); retrying in ${delay} ms`);
          result = 'error';
        }
      } finally {
        this.#queue.done(key);
      }
      this.#o.metrics.reconciles.inc({ result });
      this.#o.metrics.reconcileDuration.observe((performance.now() - started) / 1000);
    }
  }
}
