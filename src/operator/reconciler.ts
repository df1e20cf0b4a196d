import type { CoreV1Event, V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ApiError } from '../core/errors.ts';
import { API_VERSION, GROUP, VERSION } from './api.ts';
import { asFailure, type FailureInfo, isKubeError, kubeFailure } from './failure.ts';
import { type HandlerContext, type KindHandler, managedByOf, type RecordedEvent } from './handler.ts';
import {
  FIELD_MANAGER,
  isConflict,
  isNotFound,
  type KubeClients,
  kubeErrorMessage,
  mergePatch,
  splitKey,
} from './runtime/kube.ts';
import { type Result, TerminalError } from './runtime/reconcile.ts';
import { type Condition, type Resource, readyCondition, setCondition, statusPatch } from './status.ts';

/**
 * The reconcile of one resource of a kind, the same for every kind: the finalizer added before anything
 * is written and removed once the handler has undone its rows; the handler's events; status with
 * observedGeneration and the Ready condition; a failure as Ready=False with its reason and a Warning
 * Event; what to do next as a Result (requeue-after for the resync, backoff, or a TerminalError).
 */

export interface ReconcileResult extends Result {
  /** What happened, for logs and metrics. */
  outcome: 'synced' | 'not ready' | 'finalized' | 'gone' | 'failed' | 'error';
}

export interface ReconcilerOptions<R extends Resource> {
  kube: KubeClients;
  handler: KindHandler<R>;
  log: Logger;
  /** The reconciler's view of the resource `<namespace>/<name>` (the informer's cache). */
  getResource(key: string): R | undefined;
  /** A Secret from the informer's cache, when there is one (else it is read from the API). */
  getSecret?(namespace: string, name: string): V1Secret | undefined;
  /** Reporting instance in Events (the pod name). */
  identity: string;
  /** A synced resource is reconciled again after this long: status mirrors its rows, drift is put back. */
  resyncMs?: number;
  now?: () => Date;
}

export class Reconciler<R extends Resource = Resource> {
  readonly #o: ReconcilerOptions<R>;
  readonly #handler: KindHandler<R>;

  /**
   * What this reconciler last wrote per key, until the informer's cache has caught up with it: a cached
   * object whose resourceVersion we have already superseded is older than what we know.
   */
  readonly #written = new Map<string, { superseded: Set<string>; latest: R }>();

  constructor(options: ReconcilerOptions<R>) {
    this.#o = options;
    this.#handler = options.handler;
  }

  #current(key: string): R | undefined {
    const cached = this.#o.getResource(key);
    const written = this.#written.get(key);
    if (!cached || !written) {
      if (!cached) this.#written.delete(key);
      return cached;
    }
    if (written.superseded.has(cached.metadata.resourceVersion ?? '')) return written.latest;
    this.#written.delete(key);
    return cached;
  }

  #wrote(before: R, after: R): R {
    const key = `${before.metadata.namespace ?? ''}/${before.metadata.name}`;
    const entry = this.#written.get(key) ?? { superseded: new Set<string>(), latest: after };
    entry.superseded.add(before.metadata.resourceVersion ?? '');
    entry.latest = after;
    this.#written.set(key, entry);
    return after;
  }

  #now(): Date {
    return this.#o.now?.() ?? new Date();
  }

  #context(managedBy: string): HandlerContext {
    const { kube, log, getSecret } = this.#o;
    return {
      kube,
      log,
      managedBy,
      secret: async (namespace, name, opts = {}) => {
        const cached = opts.fresh ? undefined : getSecret?.(namespace, name);
        if (cached) return cached;
        try {
          return await kube.core.readNamespacedSecret({ name, namespace });
        } catch (err) {
          if (isNotFound(err)) return undefined;
          throw err;
        }
      },
    };
  }

  /**
   * Level-triggered and idempotent: makes the rows and the status agree with the resource
   * `<namespace>/<name>`. Resolves with what to do next (see Result); throws a TerminalError for a spec
   * that no retry can fix (its status says why). A failed Kubernetes API call shows as
   * Ready=False/ReconcileError with a Warning Event, and is retried.
   */
  async reconcile(key: string): Promise<ReconcileResult> {
    const { namespace, name } = splitKey(key);
    const h = this.#context(managedByOf(this.#handler.kind, namespace, name));
    const resource = this.#current(key);
    if (!resource) {
      await this.#handler.orphan?.(h.managedBy, h);
      return { outcome: 'gone' };
    }
    try {
      if (resource.metadata.deletionTimestamp) return await this.#finalize(resource, h);
      return await this.#sync(resource, h);
    } catch (err) {
      // A 409 is optimistic concurrency at work (our cached copy was stale): retried, not reported.
      if (err instanceof TerminalError || !isKubeError(err) || isConflict(err)) throw err;
      return this.#fail(this.#current(key) ?? resource, kubeFailure(err));
    }
  }

  async #sync(resource: R, h: HandlerContext): Promise<ReconcileResult> {
    const { finalizer } = this.#handler;
    if (!resource.metadata.finalizers?.includes(finalizer))
      resource = await this.#patchMeta(resource, {
        finalizers: [...(resource.metadata.finalizers ?? []), finalizer],
      });
    let synced: Awaited<ReturnType<KindHandler<R>['sync']>>;
    try {
      synced = await this.#handler.sync(resource, h);
    } catch (err) {
      if (isConflict(err) && !(err instanceof ApiError)) throw err;
      return this.#fail(resource, asFailure(err, this.#handler.invalidReason));
    }
    await this.#events(resource, synced.events ?? []);
    await this.#writeStatus(resource, synced.status ?? {}, {
      status: synced.notReady ? 'False' : 'True',
      reason: synced.reason,
      message: synced.message,
    });
    if (synced.notReady === 'retry') return { outcome: 'not ready', requeue: true };
    return {
      outcome: 'synced',
      ...(this.#o.resyncMs !== undefined ? { requeueAfterMs: this.#o.resyncMs } : {}),
    };
  }

  async #finalize(resource: R, h: HandlerContext): Promise<ReconcileResult> {
    const { finalizer } = this.#handler;
    if (!resource.metadata.finalizers?.includes(finalizer)) return { outcome: 'finalized' };
    let events: RecordedEvent[];
    try {
      events = await this.#handler.finalize(resource, h);
    } catch (err) {
      const failure = asFailure(err, this.#handler.invalidReason);
      this.#o.log.warn(`${h.managedBy} is being deleted but: ${failure.reason}: ${failure.message}`);
      return { outcome: 'failed', requeue: true };
    }
    await this.#events(resource, events);
    await this.#patchMeta(resource, {
      finalizers: resource.metadata.finalizers.filter((f) => f !== finalizer),
    });
    return { outcome: 'finalized' };
  }

  /**
   * Reports a failure on the resource: Ready=False with the reason, and a Warning Event when the reason or
   * message is new. A status write that fails in turn (the API server refusing it too) is logged; the
   * retry comes from the result. A failure that no retry fixes ends in a TerminalError.
   */
  async #fail(resource: R, failure: FailureInfo): Promise<ReconcileResult> {
    const previous = readyCondition(resource);
    const changed = previous?.reason !== failure.reason || previous?.message !== failure.message;
    const what = `${this.#handler.kind} ${resource.metadata.namespace}/${resource.metadata.name}`;
    this.#o.log.warn(`${what}: ${failure.reason}: ${failure.message}`);
    if (changed)
      await this.#event(resource, { type: 'Warning', reason: failure.reason, message: failure.message });
    try {
      await this.#writeStatus(
        resource,
        {},
        { status: 'False', reason: failure.reason, message: failure.message },
      );
    } catch (err) {
      if (!isNotFound(err))
        this.#o.log.warn(`${what}: could not write status ${failure.reason}: ${kubeErrorMessage(err)}`);
    }
    if (!failure.retry) throw new TerminalError(`${failure.reason}: ${failure.message}`);
    return { outcome: failure.reason === 'ReconcileError' ? 'error' : 'failed', requeue: true };
  }

  /** Merge patch of metadata, conditional on the resourceVersion read (409 on a stale read). */
  async #patchMeta(resource: R, metadata: Record<string, unknown>): Promise<R> {
    const body = { metadata: { ...metadata, resourceVersion: resource.metadata.resourceVersion } };
    const patched = (await this.#o.kube.custom.patchNamespacedCustomObject(
      { ...this.#path(resource), body },
      mergePatch,
    )) as R;
    return this.#wrote(resource, patched);
  }

  async #writeStatus(
    resource: R,
    fields: Record<string, unknown>,
    ready: Pick<Condition, 'status' | 'reason' | 'message'>,
  ): Promise<void> {
    const generation = resource.metadata.generation;
    const observed = generation !== undefined ? { observedGeneration: generation } : {};
    const next = {
      ...fields,
      ...observed,
      conditions: setCondition(
        resource.status?.conditions,
        { type: 'Ready', ...ready, ...observed },
        this.#now(),
      ),
    };
    const patch = statusPatch(resource.status, next);
    if (!patch) return;
    const patched = (await this.#o.kube.custom.patchNamespacedCustomObjectStatus(
      { ...this.#path(resource), body: { status: patch } },
      mergePatch,
    )) as R;
    this.#wrote(resource, patched);
  }

  #path(resource: R) {
    const { namespace = '', name } = resource.metadata;
    const plural = this.#handler.plural;
    return { group: GROUP, version: VERSION, namespace, plural, name, fieldManager: FIELD_MANAGER };
  }

  async #events(resource: R, events: RecordedEvent[]): Promise<void> {
    for (const event of events) await this.#event(resource, event);
  }

  /** Records a Kubernetes Event on the resource; a failure to record one is logged, never fatal. */
  async #event(resource: R, { type, reason, message }: RecordedEvent): Promise<void> {
    const { namespace = 'default', name, uid, resourceVersion } = resource.metadata;
    const kind = this.#handler.kind;
    const now = this.#now();
    const body: CoreV1Event = {
      metadata: { generateName: `${name}.`, namespace },
      involvedObject: { apiVersion: API_VERSION, kind, name, namespace, uid, resourceVersion },
      type,
      reason,
      message: message.slice(0, 1024),
      source: { component: FIELD_MANAGER },
      reportingComponent: `${GROUP}/operator`,
      reportingInstance: this.#o.identity,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
    try {
      await this.#o.kube.core.createNamespacedEvent({ namespace, body });
    } catch (err) {
      this.#o.log.warn(
        `could not record event ${reason} on ${kind} ${namespace}/${name}: ${kubeErrorMessage(err)}`,
      );
    }
  }
}
