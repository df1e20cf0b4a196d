import type { V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/registry.ts';
import { Informer, type InformerEvent } from './informer.ts';
import { GROUP, type KubeClients, keyOf, kubeErrorMessage, PLURAL, VERSION } from './kube.ts';
import { Reconciler, type SubscriptionStore, secretSourceOf } from './reconciler.ts';
import type { WebhookSubscription } from './status.ts';
import { WorkQueue } from './workqueue.ts';

export interface ControllerOptions {
  kube: KubeClients;
  store: SubscriptionStore;
  log: Logger;
  metrics: Metrics;
  /** Namespaces to watch; empty: all namespaces. */
  namespaces: string[];
  identity: string;
  /** Every resource is reconciled again this often (delivery stats, drift). */
  resyncMs: number;
  workers?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * Subscribes to "the subscriptions of this paywall changed" notices (the bus); the resources of that
   * paywall are reconciled at once instead of at the next resync. Returns the unsubscribe function.
   */
  watchRows?: (onPaywall: (paywallId: string) => void) => Promise<() => Promise<void>>;
}

/**
 * The WebhookSubscription controller: informers on the resources and on Secrets feed a keyed work queue,
 * workers drain it through the reconciler; failures come back with exponential backoff, and every key is
 * re-queued each resync period.
 */
export class Controller {
  readonly #o: ControllerOptions;
  readonly #queue: WorkQueue;
  readonly #resources: Informer<WebhookSubscription>[];
  readonly #secrets: Informer<V1Secret & { metadata: { name: string } }>[];
  readonly #reconciler: Reconciler;
  #workers: Promise<void>[] = [];
  #resync: NodeJS.Timeout | undefined;
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

  /** Starts the informers, waits for their first list, then the workers and the resync timer. */
  async start(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    for (const informer of [...this.#resources, ...this.#secrets]) informer.start();
    await Promise.all([...this.#resources, ...this.#secrets].map((i) => i.waitForSync()));
    if (!this.#running) return;
    const count = this.#o.workers ?? 2;
    for (let i = 0; i < count; i++) this.#workers.push(this.#work());
    this.#resync = setInterval(() => this.#enqueueAll(), this.#o.resyncMs);
    this.#resync.unref();
    if (this.#o.watchRows) {
      try {
        this.#unwatchRows = await this.#o.watchRows((paywallId) => this.#enqueuePaywall(paywallId));
      } catch (err) {
        this.#o.log.warn({ err }, 'controller: no change notices from the database; relying on the resync');
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
    clearInterval(this.#resync);
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

  #enqueuePaywall(paywallId: string): void {
    for (const informer of this.#resources)
      for (const resource of informer.list())
        if (resource.spec?.paywallId === paywallId) this.#queue.add(keyOf(resource));
  }

  #enqueueAll(): void {
    for (const informer of this.#resources) for (const key of informer.keys()) this.#queue.add(key);
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
        if (outcome.retry) {
          const delay = this.#queue.addRateLimited(key);
          this.#o.log.info(`${key}: ${outcome.outcome}; retrying in ${delay} ms`);
          result = 'requeue';
        } else {
          this.#queue.forget(key);
          result = 'success';
        }
      } catch (err) {
        const delay = this.#queue.addRateLimited(key);
        this.#o.log.warn(`${key}: reconcile failed (${kubeErrorMessage(err)}); retrying in ${delay} ms`);
        result = 'error';
      } finally {
        this.#queue.done(key);
      }
      this.#o.metrics.reconciles.inc({ result });
      this.#o.metrics.reconcileDuration.observe((performance.now() - started) / 1000);
    }
  }
}
