import type { V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/registry.ts';
import { GROUP, VERSION } from './api.ts';
import type { KindHandler } from './handler.ts';
import { Reconciler } from './reconciler.ts';
import { Informer, type InformerEvent, type ListResult } from './runtime/informer.ts';
import { type KubeClients, type KubeObject, keyOf, kubeErrorMessage } from './runtime/kube.ts';
import { isTerminal } from './runtime/reconcile.ts';
import { WorkQueue } from './runtime/workqueue.ts';
import type { Resource } from './status.ts';

/**
 * The operator's one controller manager, after controller-runtime's: informers per kind and namespace,
 * and one on Secrets, feed one keyed work queue (`<Kind>:<namespace>/<name>`); workers drain it through
 * each kind's reconciler. A resource is queued when its spec or metadata changes (not its status: our
 * own writes), when an object one of its kind's watches names changes, and on a database change notice
 * that concerns it. What happens next is the reconcile's Result: a requeue-after (the resync), a retry
 * with exponential backoff (a result asking for it, or an error), or nothing (a TerminalError, until the
 * resource changes).
 */

export interface ManagerOptions {
  kube: KubeClients;
  handlers: KindHandler[];
  log: Logger;
  metrics: Pick<Metrics, 'reconciles' | 'reconcileDuration'>;
  /** Namespaces to watch; empty: all namespaces. */
  namespaces: string[];
  /** Reporting instance in Events (the pod name). */
  identity: string;
  /**
   * A synced resource asks to be reconciled again after this long (its Result's requeueAfter): status
   * mirrored from its rows, drift of the rows put back. Undefined: only on changes and notices.
   */
  resyncMs?: number;
  workers?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
}

type Secret = V1Secret & { metadata: { name: string } };

interface Kind {
  handler: KindHandler;
  informers: Informer<Resource>[];
  reconciler: Reconciler;
}

export class Manager {
  readonly #o: ManagerOptions;
  readonly #queue: WorkQueue;
  readonly #kinds = new Map<string, Kind>();
  readonly #secrets: Informer<Secret>[];
  #workers: Promise<void>[] = [];
  #unsubscribe: Array<() => Promise<void>> = [];
  #running = false;

  constructor(options: ManagerOptions) {
    this.#o = options;
    this.#queue = new WorkQueue({
      baseDelayMs: options.baseBackoffMs ?? 500,
      maxDelayMs: options.maxBackoffMs ?? 5 * 60_000,
    });
    const scopes = options.namespaces.length ? options.namespaces : [undefined];
    const { custom, core } = options.kube;
    this.#secrets = scopes.map((namespace) =>
      this.#informer<Secret>(
        'secrets',
        namespace,
        namespace ? `/api/v1/namespaces/${namespace}` : '/api/v1',
        () => (namespace ? core.listNamespacedSecret({ namespace }) : core.listSecretForAllNamespaces()),
      ),
    );
    for (const handler of options.handlers) {
      const { plural } = handler;
      const informers = scopes.map((namespace) =>
        this.#informer<Resource>(
          plural,
          namespace,
          `/apis/${GROUP}/${VERSION}${namespace ? `/namespaces/${namespace}` : ''}`,
          () =>
            namespace
              ? custom.listNamespacedCustomObject({ group: GROUP, version: VERSION, namespace, plural })
              : custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural }),
          handler.kind,
        ),
      );
      const reconciler = new Reconciler({
        kube: options.kube,
        handler,
        log: options.log,
        identity: options.identity,
        ...(options.resyncMs !== undefined ? { resyncMs: options.resyncMs } : {}),
        getResource: (key) => find(informers, key),
        getSecret: (namespace, name) => find(this.#secrets, `${namespace}/${name}`),
      });
      this.#kinds.set(handler.kind, { handler, informers, reconciler });
    }
  }

  /** An informer on a collection (`plural` under `prefix`); its changes reach #onChange as `kind`. */
  #informer<T extends KubeObject>(
    plural: string,
    namespace: string | undefined,
    prefix: string,
    list: () => Promise<unknown>,
    kind = 'Secret',
  ): Informer<T> {
    return new Informer<T>({
      name: `${plural}${namespace ? ` in ${namespace}` : ''}`,
      kubeConfig: this.#o.kube.config,
      log: this.#o.log,
      watchPath: `${prefix}/${plural}`,
      list: async () => (await list()) as ListResult<T>,
      onEvent: (event, object, old) => this.#onChange(kind, event, object, old),
    });
  }

  get queue(): WorkQueue {
    return this.#queue;
  }

  #informers(): Informer<KubeObject>[] {
    return [...[...this.#kinds.values()].flatMap((k) => k.informers), ...this.#secrets];
  }

  /**
   * Starts the informers, waits for the Secrets' first list, then starts the workers. A kind's keys are
   * queued from its informer's first list, so a kind whose CRD is missing (not installed yet) holds up
   * none of the others: its informer keeps retrying.
   */
  async start(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    for (const informer of this.#informers()) informer.start();
    await Promise.all(this.#secrets.map((i) => i.waitForSync()));
    if (!this.#running) return;
    for (let i = 0; i < (this.#o.workers ?? 2); i++) this.#workers.push(this.#work());
    for (const kind of this.#kinds.values()) await this.#subscribe(kind);
    this.#o.log.info(
      `controller started: watching ${this.#o.namespaces.length ? this.#o.namespaces.join(', ') : 'all namespaces'}`,
    );
  }

  /** Stops at once: no new reconcile starts; the ones running finish. */
  async stop(): Promise<void> {
    if (!this.#running) return;
    this.#running = false;
    await Promise.all(this.#unsubscribe.map((unsubscribe) => unsubscribe().catch(() => {})));
    this.#unsubscribe = [];
    this.#queue.shutDown();
    await Promise.all(this.#informers().map((i) => i.stop()));
    await Promise.all(this.#workers);
    this.#workers = [];
  }

  /** Database change notices naming a project reconcile the resources they concern at once. */
  async #subscribe({ handler, informers }: Kind): Promise<void> {
    const notices = handler.notices;
    if (!notices) return;
    try {
      const unsubscribe = await notices.subscribe((projectId) => {
        for (const resource of informers.flatMap((i) => i.list()))
          if (notices.affects(projectId, resource)) this.#enqueue(handler.kind, resource);
      });
      this.#unsubscribe.push(unsubscribe);
    } catch (err) {
      this.#o.log.warn(
        { err },
        'controller: no change notices from the database; relying on the status sync',
      );
    }
  }

  #enqueue(kind: string, object: KubeObject): void {
    this.#queue.add(`${kind}:${keyOf(object)}`);
  }

  #onChange(kind: string, event: InformerEvent, object: KubeObject, old?: KubeObject): void {
    // Status-only changes (our own writes) need no reconcile: only spec (generation) and metadata matter.
    const statusOnly =
      event === 'update' &&
      old &&
      old.metadata.generation === object.metadata.generation &&
      JSON.stringify(old.metadata.finalizers ?? []) === JSON.stringify(object.metadata.finalizers ?? []) &&
      old.metadata.deletionTimestamp === object.metadata.deletionTimestamp;
    if (this.#kinds.has(kind) && !statusOnly) this.#enqueue(kind, object);
    // The resources that depend on it (a Project becoming Ready, a Secret, a provider) look again.
    for (const { handler, informers } of this.#kinds.values())
      for (const watch of handler.watches ?? [])
        if (watch.kind === kind)
          for (const resource of informers.flatMap((i) => i.list()))
            if (watch.affects(object, resource)) this.#enqueue(handler.kind, resource);
  }

  async #work(): Promise<void> {
    const { log, metrics } = this.#o;
    for (;;) {
      const key = await this.#queue.get();
      if (key === undefined) return;
      const started = performance.now();
      const colon = key.indexOf(':');
      const reconciler = this.#kinds.get(key.slice(0, colon))?.reconciler;
      let result: string;
      try {
        const outcome = (await reconciler?.reconcile(key.slice(colon + 1))) ?? { outcome: 'gone' };
        if (outcome.requeue) {
          const delay = this.#queue.addRateLimited(key);
          log.info(`${key}: ${outcome.outcome}; retrying in ${delay} ms`);
          result = outcome.outcome === 'error' ? 'error' : 'requeue';
        } else {
          this.#queue.forget(key);
          if (outcome.requeueAfterMs !== undefined) this.#queue.addAfter(key, outcome.requeueAfterMs);
          result = 'success';
        }
      } catch (err) {
        if (isTerminal(err)) {
          this.#queue.forget(key);
          log.info(`${key}: not retried until the resource changes: ${err.message}`);
          result = 'terminal';
        } else {
          const delay = this.#queue.addRateLimited(key);
          log.warn(`${key}: reconcile failed (${kubeErrorMessage(err)}); retrying in ${delay} ms`);
          result = 'error';
        }
      } finally {
        this.#queue.done(key);
      }
      metrics.reconciles.inc({ result });
      metrics.reconcileDuration.observe((performance.now() - started) / 1000);
    }
  }
}

function find<T extends KubeObject>(informers: Informer<T>[], key: string): T | undefined {
  for (const informer of informers) {
    const found = informer.get(key);
    if (found) return found;
  }
  return undefined;
}
