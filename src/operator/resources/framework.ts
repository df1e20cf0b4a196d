import type { CoreV1Event, V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { AppContext } from '../../app/context.ts';
import { ApiError } from '../../core/errors.ts';
import { findProjectByManager } from '../../projects/service.ts';
import { API_VERSION, GROUP, VERSION } from '../api.ts';
import { classifyServiceError, kubeFailure } from '../reconciler.ts';
import { Informer, type InformerEvent } from '../runtime/informer.ts';
import {
  FIELD_MANAGER,
  isConflict,
  isNotFound,
  type KubeClients,
  type KubeObject,
  keyOf,
  kubeErrorMessage,
  mergePatch,
  splitKey,
  statusOf,
} from '../runtime/kube.ts';
import { isTerminal, type Result, TerminalError } from '../runtime/reconcile.ts';
import { WorkQueue } from '../runtime/workqueue.ts';
import { type Condition, setCondition } from '../status.ts';

/**
 * The deployment's resources (Project, ApiKey, ModelProvider, PriceList, LimitPolicy) on the same runtime
 * as WebhookSubscription (../runtime): informers per kind and namespace plus one on Secrets feed one keyed
 * work queue (`<Kind>:<namespace>/<name>`); each kind is a `KindHandler` whose `sync` makes its rows agree
 * with the spec (level-triggered, idempotent) and whose `finalize` undoes them. This module does what is
 * the same for every kind: the finalizer, status with observedGeneration and the Ready condition,
 * Kubernetes Events, failures as reasons, the requeue that corrects drift.
 */

export interface ResourceStatus {
  observedGeneration?: number;
  conditions?: Condition[];
  projectId?: string;
  [field: string]: unknown;
}

export interface Resource<S = unknown> extends KubeObject {
  spec?: S;
  status?: ResourceStatus;
}

/** A reconcile that cannot complete: its reason becomes Ready=False's reason. */
export class Failure extends Error {
  readonly reason: string;
  readonly retry: boolean;
  constructor(reason: string, message: string, retry: boolean) {
    super(message);
    this.reason = reason;
    this.retry = retry;
  }
}

export interface Synced {
  /** Ready=True's reason and message, or Ready=False's when `notReady` (then retried with backoff). */
  reason: string;
  message: string;
  notReady?: boolean;
  /** Status fields besides observedGeneration and conditions. */
  status?: Record<string, unknown>;
  events?: Array<{ type: 'Normal' | 'Warning'; reason: string; message: string }>;
}

export interface Helpers {
  ctx: AppContext;
  kube: KubeClients;
  log: Logger;
  /** `<Kind> <namespace>/<name>`: stored on the rows the resource manages. */
  managedBy: string;
  /** The project a `projectRef` names: the row its Project resource manages (ProjectNotFound otherwise). */
  project(namespace: string, name: string | undefined): Promise<{ id: string; currency: string }>;
  /** A Secret (informer cache first, then the API; `fresh`: the API only); undefined when missing. */
  secret(namespace: string, name: string, opts?: { fresh?: boolean }): Promise<V1Secret | undefined>;
}

export interface KindHandler<S = Record<string, unknown>> {
  kind: string;
  plural: string;
  finalizer: string;
  /** Reason of a spec the service refuses (400): `InvalidSpec`, or `InvalidPrice` for prices. */
  invalidReason?: string;
  /** Secrets the resource reads or writes: a change to one reconciles it. */
  secretsOf?(resource: Resource<S>): string[];
  /** The Project resource it refers to (same namespace): a change to that Project reconciles it. */
  projectOf?(resource: Resource<S>): string | undefined;
  sync(resource: Resource<S>, h: Helpers): Promise<Synced>;
  /** Undoes the rows (the resource is being deleted); events it returns are recorded. */
  finalize(resource: Resource<S>, h: Helpers): Promise<string | undefined>;
  /** The resource vanished without its finalizer running. */
  orphan?(managedBy: string, h: Helpers): Promise<void>;
}

export const managedByOf = (kind: string, namespace: string, name: string) => `${kind} ${namespace}/${name}`;

/** Throws ProjectNotFound unless the named Project resource has its row. */
async function projectOf(ctx: AppContext, namespace: string, name: string | undefined) {
  if (!name) throw new Failure('InvalidSpec', 'spec.projectRef.name is required', false);
  const row = await findProjectByManager(ctx.db, managedByOf('Project', namespace, name));
  if (!row)
    throw new Failure(
      'ProjectNotFound',
      `Project ${namespace}/${name} does not exist or is not Ready yet`,
      true,
    );
  return { id: row.id, currency: row.currency };
}

function asFailure(err: unknown, handler: KindHandler<never>): Failure {
  if (err instanceof Failure) return err;
  if (err instanceof ApiError && err.status === 409)
    return new Failure(
      err.code === 'managed_by_resource' ? 'ManagedElsewhere' : 'Conflict',
      err.message,
      true,
    );
  if (statusOf(err) !== undefined) {
    const f = kubeFailure(err);
    return new Failure(f.reason, f.message, true);
  }
  const f = classifyServiceError(err);
  if (f.reason === 'InvalidSpec')
    return new Failure(handler.invalidReason ?? 'InvalidSpec', f.message, false);
  if (f.reason === 'PaywallNotFound') return new Failure('ProjectNotFound', f.message, true);
  return new Failure(f.reason, f.message, f.retry);
}

export interface ResourcesControllerOptions {
  ctx: AppContext;
  kube: KubeClients;
  handlers: Array<KindHandler<never>>;
  namespaces: string[];
  identity: string;
  /** A synced resource is reconciled again after this long: drift of its rows is put back. */
  resyncMs?: number;
  /** A Project resource changed (other controllers' resources may name it). */
  onProject?(namespace: string | undefined, name: string): void;
  workers?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
}

type AnyResource = Resource;

export class ResourcesController {
  readonly #o: ResourcesControllerOptions;
  readonly #queue: WorkQueue;
  readonly #handlers = new Map<string, KindHandler<never>>();
  readonly #informers = new Map<string, Informer<AnyResource>[]>();
  readonly #secrets: Informer<V1Secret & { metadata: { name: string } }>[];
  readonly #written = new Map<string, { superseded: Set<string>; latest: AnyResource }>();
  #workers: Promise<void>[] = [];
  #running = false;

  constructor(options: ResourcesControllerOptions) {
    this.#o = options;
    this.#queue = new WorkQueue({
      baseDelayMs: options.baseBackoffMs ?? 500,
      maxDelayMs: options.maxBackoffMs ?? 5 * 60_000,
    });
    const scopes = options.namespaces.length ? options.namespaces : [undefined];
    const { custom, core, config } = options.kube;
    const log = options.ctx.log;
    for (const handler of options.handlers) {
      this.#handlers.set(handler.kind, handler);
      const plural = handler.plural;
      this.#informers.set(
        handler.kind,
        scopes.map(
          (namespace) =>
            new Informer<AnyResource>({
              name: `${plural}${namespace ? ` in ${namespace}` : ''}`,
              kubeConfig: config,
              log,
              watchPath: namespace
                ? `/apis/${GROUP}/${VERSION}/namespaces/${namespace}/${plural}`
                : `/apis/${GROUP}/${VERSION}/${plural}`,
              list: async () =>
                (namespace
                  ? await custom.listNamespacedCustomObject({
                      group: GROUP,
                      version: VERSION,
                      namespace,
                      plural,
                    })
                  : await custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural })) as {
                  items: AnyResource[];
                  metadata?: { resourceVersion?: string };
                },
              onEvent: (event, object, old) => this.#onResource(handler, event, object, old),
            }),
        ),
      );
    }
    this.#secrets = scopes.map(
      (namespace) =>
        new Informer<V1Secret & { metadata: { name: string } }>({
          name: `secrets${namespace ? ` in ${namespace}` : ''} (resources)`,
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
  }

  get queue(): WorkQueue {
    return this.#queue;
  }

  #allInformers() {
    return [...[...this.#informers.values()].flat(), ...this.#secrets];
  }

  async start(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    for (const informer of this.#allInformers()) informer.start();
    await Promise.all(this.#allInformers().map((i) => i.waitForSync()));
    if (!this.#running) return;
    for (let i = 0; i < (this.#o.workers ?? 2); i++) this.#workers.push(this.#work());
  }

  async stop(): Promise<void> {
    if (!this.#running) return;
    this.#running = false;
    this.#queue.shutDown();
    await Promise.all(this.#allInformers().map((i) => i.stop()));
    await Promise.all(this.#workers);
    this.#workers = [];
  }

  #resources(kind: string): AnyResource[] {
    return (this.#informers.get(kind) ?? []).flatMap((i) => i.list());
  }

  #onResource(handler: KindHandler<never>, event: InformerEvent, object: AnyResource, old?: AnyResource) {
    const statusOnly =
      event === 'update' &&
      old &&
      old.metadata.generation === object.metadata.generation &&
      JSON.stringify(old.metadata.finalizers ?? []) === JSON.stringify(object.metadata.finalizers ?? []) &&
      old.metadata.deletionTimestamp === object.metadata.deletionTimestamp;
    if (!statusOnly) this.#queue.add(`${handler.kind}:${keyOf(object)}`);
    // A provider that changes may satisfy the routes of the price lists of its namespace.
    if (handler.kind === 'ModelProvider')
      for (const r of this.#resources('PriceList'))
        if (r.metadata.namespace === object.metadata.namespace) this.#queue.add(`PriceList:${keyOf(r)}`);
    // A Project that changes (Ready, deleted) may unblock the resources that refer to it.
    if (handler.kind === 'Project') this.#o.onProject?.(object.metadata.namespace, object.metadata.name);
    if (handler.kind === 'Project')
      for (const other of this.#handlers.values())
        for (const r of this.#resources(other.kind))
          if (
            r.metadata.namespace === object.metadata.namespace &&
            other.projectOf?.(r as never) === object.metadata.name
          )
            this.#queue.add(`${other.kind}:${keyOf(r)}`);
  }

  #onSecret(secret: V1Secret & { metadata: { name: string } }) {
    for (const handler of this.#handlers.values())
      for (const r of this.#resources(handler.kind))
        if (
          r.metadata.namespace === secret.metadata.namespace &&
          handler.secretsOf?.(r as never).includes(secret.metadata.name)
        )
          this.#queue.add(`${handler.kind}:${keyOf(r)}`);
  }

  async #work(): Promise<void> {
    const { metrics, log } = this.#o.ctx;
    for (;;) {
      const key = await this.#queue.get();
      if (key === undefined) return;
      const started = performance.now();
      let result: string;
      try {
        const outcome = await this.reconcile(key);
        if (outcome.requeue) {
          const delay = this.#queue.addRateLimited(key);
          log.info(`${key}: not done; retrying in ${delay} ms`);
          result = 'requeue';
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

  // ---- the reconcile ----

  #helpers(managedBy: string): Helpers {
    const { ctx, kube } = this.#o;
    return {
      ctx,
      kube,
      log: ctx.log,
      managedBy,
      project: (namespace, name) => projectOf(ctx, namespace, name),
      secret: async (namespace, name, opts = {}) => {
        if (!opts.fresh)
          for (const informer of this.#secrets) {
            const found = informer.get(`${namespace}/${name}`);
            if (found) return found;
          }
        try {
          return await kube.core.readNamespacedSecret({ name, namespace });
        } catch (err) {
          if (isNotFound(err)) return undefined;
          throw err;
        }
      },
    };
  }

  #current(key: string, kind: string, objectKey: string): AnyResource | undefined {
    let cached: AnyResource | undefined;
    for (const informer of this.#informers.get(kind) ?? []) cached ??= informer.get(objectKey);
    const written = this.#written.get(key);
    if (!cached || !written) {
      if (!cached) this.#written.delete(key);
      return cached;
    }
    if (written.superseded.has(cached.metadata.resourceVersion ?? '')) return written.latest;
    this.#written.delete(key);
    return cached;
  }

  #wrote(key: string, before: AnyResource, after: AnyResource): AnyResource {
    const entry = this.#written.get(key) ?? { superseded: new Set<string>(), latest: after };
    entry.superseded.add(before.metadata.resourceVersion ?? '');
    entry.latest = after;
    this.#written.set(key, entry);
    return after;
  }

  /** Level-triggered: makes the rows and the status agree with the resource `<Kind>:<ns>/<name>`. */
  async reconcile(key: string): Promise<Result> {
    const colon = key.indexOf(':');
    const kind = key.slice(0, colon);
    const objectKey = key.slice(colon + 1);
    const handler = this.#handlers.get(kind);
    if (!handler) return {};
    const { namespace, name } = splitKey(objectKey);
    const managedBy = managedByOf(kind, namespace, name);
    const h = this.#helpers(managedBy);
    let resource = this.#current(key, kind, objectKey);
    if (!resource) {
      await handler.orphan?.(managedBy, h);
      return {};
    }
    try {
      if (resource.metadata.deletionTimestamp) {
        if (!resource.metadata.finalizers?.includes(handler.finalizer)) return {};
        try {
          const message = await handler.finalize(resource as never, h);
          if (message) await this.#event(handler, resource, 'Normal', 'Finalized', message);
        } catch (err) {
          const failure = asFailure(err, handler);
          this.#o.ctx.log.warn(`${managedBy} is being deleted but: ${failure.reason}: ${failure.message}`);
          return { requeue: true };
        }
        await this.#patchMeta(key, handler, resource, {
          finalizers: resource.metadata.finalizers.filter((f) => f !== handler.finalizer),
        });
        return {};
      }
      if (!resource.metadata.finalizers?.includes(handler.finalizer))
        resource = await this.#patchMeta(key, handler, resource, {
          finalizers: [...(resource.metadata.finalizers ?? []), handler.finalizer],
        });
      let synced: Synced;
      try {
        synced = await handler.sync(resource as never, h);
      } catch (err) {
        if (isConflict(err) && !(err instanceof ApiError)) throw err;
        return await this.#fail(key, handler, resource, asFailure(err, handler));
      }
      for (const e of synced.events ?? []) await this.#event(handler, resource, e.type, e.reason, e.message);
      await this.#writeStatus(key, handler, resource, synced.status ?? {}, {
        status: synced.notReady ? 'False' : 'True',
        reason: synced.reason,
        message: synced.message,
      });
      if (synced.notReady) return { requeue: true };
      return this.#o.resyncMs !== undefined ? { requeueAfterMs: this.#o.resyncMs } : {};
    } catch (err) {
      if (err instanceof TerminalError || statusOf(err) === undefined || isConflict(err)) throw err;
      return this.#fail(key, handler, resource, asFailure(err, handler));
    }
  }

  async #fail(
    key: string,
    handler: KindHandler<never>,
    resource: AnyResource,
    failure: Failure,
  ): Promise<Result> {
    const previous = resource.status?.conditions?.find((c) => c.type === 'Ready');
    const changed = previous?.reason !== failure.reason || previous?.message !== failure.message;
    const what = `${handler.kind} ${keyOf(resource)}`;
    this.#o.ctx.log.warn(`${what}: ${failure.reason}: ${failure.message}`);
    if (changed) await this.#event(handler, resource, 'Warning', failure.reason, failure.message);
    try {
      await this.#writeStatus(
        key,
        handler,
        resource,
        {},
        {
          status: 'False',
          reason: failure.reason,
          message: failure.message,
        },
      );
    } catch (err) {
      if (!isNotFound(err))
        this.#o.ctx.log.warn(`${what}: could not write status ${failure.reason}: ${kubeErrorMessage(err)}`);
    }
    if (!failure.retry) throw new TerminalError(`${failure.reason}: ${failure.message}`);
    return { requeue: true };
  }

  async #patchMeta(
    key: string,
    handler: KindHandler<never>,
    resource: AnyResource,
    metadata: Record<string, unknown>,
  ): Promise<AnyResource> {
    const { namespace = '', name } = resource.metadata;
    const patched = (await this.#o.kube.custom.patchNamespacedCustomObject(
      {
        group: GROUP,
        version: VERSION,
        namespace,
        plural: handler.plural,
        name,
        fieldManager: FIELD_MANAGER,
        body: { metadata: { ...metadata, resourceVersion: resource.metadata.resourceVersion } },
      },
      mergePatch,
    )) as AnyResource;
    return this.#wrote(key, resource, patched);
  }

  async #writeStatus(
    key: string,
    handler: KindHandler<never>,
    resource: AnyResource,
    fields: Record<string, unknown>,
    ready: Pick<Condition, 'status' | 'reason' | 'message'>,
  ): Promise<void> {
    const generation = resource.metadata.generation;
    const next: Record<string, unknown> = {
      ...fields,
      ...(generation !== undefined ? { observedGeneration: generation } : {}),
      conditions: setCondition(
        resource.status?.conditions,
        { type: 'Ready', ...ready, ...(generation !== undefined ? { observedGeneration: generation } : {}) },
        new Date(),
      ),
    };
    const current = (resource.status ?? {}) as Record<string, unknown>;
    const patch: Record<string, unknown> = {};
    for (const [field, value] of Object.entries(next))
      if (value !== undefined && JSON.stringify(current[field] ?? null) !== JSON.stringify(value))
        patch[field] = value;
    if (!Object.keys(patch).length) return;
    const { namespace = '', name } = resource.metadata;
    const patched = (await this.#o.kube.custom.patchNamespacedCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        namespace,
        plural: handler.plural,
        name,
        fieldManager: FIELD_MANAGER,
        body: { status: patch },
      },
      mergePatch,
    )) as AnyResource;
    this.#wrote(key, resource, patched);
  }

  async #event(
    handler: KindHandler<never>,
    resource: AnyResource,
    type: 'Normal' | 'Warning',
    reason: string,
    message: string,
  ): Promise<void> {
    const { namespace = 'default', name, uid, resourceVersion } = resource.metadata;
    const now = new Date();
    const body: CoreV1Event = {
      metadata: { generateName: `${name}.`, namespace },
      involvedObject: { apiVersion: API_VERSION, kind: handler.kind, name, namespace, uid, resourceVersion },
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
      this.#o.ctx.log.warn(
        `could not record event ${reason} on ${handler.kind} ${namespace}/${name}: ${kubeErrorMessage(err)}`,
      );
    }
  }
}
