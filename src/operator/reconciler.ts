import { randomBytes } from 'node:crypto';
import { ApiException, type CoreV1Event, type V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { ApiError } from '../core/errors.ts';
import { DESCRIPTION_MAX, MAX_CUSTOM_HEADERS, type SubscriptionView } from '../webhooks/subscriptions.ts';
import { API_VERSION, FINALIZER, GROUP, KIND, PLURAL, VERSION } from './api.ts';
import {
  FIELD_MANAGER,
  isConflict,
  isNotFound,
  type KubeClients,
  kubeErrorMessage,
  mergePatch,
  splitKey,
  statusOf,
} from './runtime/kube.ts';
import { type Result, TerminalError } from './runtime/reconcile.ts';
import {
  type Condition,
  type ReadyReason,
  readyCondition,
  setCondition,
  statusPatch,
  type WebhookSubscription,
  type WebhookSubscriptionSpec,
  type WebhookSubscriptionStatus,
} from './status.ts';

// ---------------------------------------------------------------------------------------------------
// The subscription service, as the reconciler sees it (the same functions the REST API uses).

/** The fields of a subscription the reconciler compares and mirrors into status. */
export type SubscriptionRow = Pick<
  SubscriptionView,
  | 'id'
  | 'paywallId'
  | 'url'
  | 'events'
  | 'isActive'
  | 'description'
  | 'customHeaders'
  | 'secretSuffix'
  | 'consecutiveFailures'
  | 'lastDeliveredAt'
  | 'managedBy'
  | 'disabledReason'
>;

export interface DesiredInput {
  url: string;
  events: string[];
  description: string | null;
  customHeaders: Record<string, string>;
}

export interface SubscriptionStore {
  findByManager(managedBy: string): Promise<SubscriptionRow | undefined>;
  create(
    projectId: string,
    input: DesiredInput & { secret: string },
    opts: { createdBy: string; managedBy: string },
  ): Promise<SubscriptionRow>;
  update(
    projectId: string,
    id: string,
    input: DesiredInput & { secret?: string; isActive: boolean },
    opts: { managedBy: string },
  ): Promise<SubscriptionRow>;
  setActive(
    projectId: string,
    id: string,
    active: boolean,
    opts: { managedBy: string },
  ): Promise<SubscriptionRow>;
  /** Refuses (with the service's 400) what create or update would refuse, writing nothing. */
  validate(input: DesiredInput): Promise<void>;
  /** The id of the project a Project resource (`spec.projectRef`) manages, if it has one yet. */
  resolveProject?(namespace: string, name: string): Promise<string | undefined>;
}

// ---------------------------------------------------------------------------------------------------
// Pure decisions.

/** Key of the signing secret in a Secret the operator generates. */
export const GENERATED_SECRET_KEY = 'secret';

export const createdByOf = (namespace: string, name: string) => `k8s:${namespace}/${name}`;
export const managedByOf = (namespace: string, name: string) => `${KIND} ${namespace}/${name}`;
export const generatedSecretName = (name: string) => `${name}-webhook-secret`;

export function generateSigningSecret(): string {
  return `whsec_${randomBytes(32).toString('base64url')}`;
}

export type SpecCheck =
  | {
      ok: true;
      /** The project: by id (`paywallId`), or by the name of its Project resource (`projectRef`). */
      paywallId: string | undefined;
      projectRef?: string;
      input: DesiredInput;
      active: boolean;
    }
  | { ok: false; message: string };

/**
 * What the API server's schema would refuse, checked again here (an older CRD, or a server that does not
 * validate): a readable message for the Ready condition. The service validates the rest.
 */
export function checkSpec(spec: WebhookSubscriptionSpec | undefined): SpecCheck {
  if (!spec || typeof spec !== 'object') return { ok: false, message: 'spec is required' };
  const projectRef = spec.projectRef?.name;
  if (projectRef !== undefined && spec.paywallId !== undefined)
    return { ok: false, message: 'spec.paywallId and spec.projectRef: give one of them, not both' };
  if (projectRef !== undefined && (typeof projectRef !== 'string' || projectRef.trim() === ''))
    return { ok: false, message: 'spec.projectRef.name must name a Project resource' };
  if (projectRef === undefined && (typeof spec.paywallId !== 'string' || spec.paywallId.trim() === ''))
    return { ok: false, message: 'spec.paywallId (or spec.projectRef) is required' };
  if (typeof spec.url !== 'string' || spec.url.trim() === '')
    return { ok: false, message: 'spec.url is required' };
  if (!Array.isArray(spec.events) || spec.events.length === 0)
    return { ok: false, message: 'spec.events must list at least one event name or pattern' };
  if (spec.events.some((e) => typeof e !== 'string' || e.trim() === ''))
    return { ok: false, message: 'spec.events must hold non-empty strings' };
  if (spec.events.includes('*') && spec.events.length > 1)
    return { ok: false, message: 'spec.events: "*" cannot be combined with other events' };
  if (spec.description !== undefined && spec.description !== null && typeof spec.description !== 'string')
    return { ok: false, message: 'spec.description must be a string' };
  const headers = spec.customHeaders ?? {};
  if (typeof headers !== 'object' || Array.isArray(headers))
    return { ok: false, message: 'spec.customHeaders must map header names to strings' };
  if (Object.keys(headers).length > MAX_CUSTOM_HEADERS)
    return { ok: false, message: `spec.customHeaders must have at most ${MAX_CUSTOM_HEADERS} entries` };
  if (Object.values(headers).some((v) => typeof v !== 'string'))
    return { ok: false, message: 'spec.customHeaders values must be strings' };
  if (spec.secretRef && (typeof spec.secretRef.name !== 'string' || spec.secretRef.name === ''))
    return { ok: false, message: 'spec.secretRef.name is required when secretRef is given' };
  if (spec.active !== undefined && typeof spec.active !== 'boolean')
    return { ok: false, message: 'spec.active must be true or false' };
  const description = (spec.description ?? '').trim().slice(0, DESCRIPTION_MAX);
  return {
    ok: true,
    paywallId: spec.paywallId?.trim(),
    ...(projectRef !== undefined ? { projectRef: projectRef.trim() } : {}),
    active: spec.active ?? true,
    input: {
      url: spec.url.trim(),
      events: [...spec.events],
      description: description === '' ? null : description,
      customHeaders: { ...headers },
    },
  };
}

/** Where the signing secret comes from: the referenced Secret, or one the operator generates and owns. */
export function secretSourceOf(resource: WebhookSubscription): {
  name: string;
  key: string;
  generated: boolean;
} {
  const ref = resource.spec?.secretRef;
  if (ref?.name) return { name: ref.name, key: ref.key || GENERATED_SECRET_KEY, generated: false };
  return { name: generatedSecretName(resource.metadata.name), key: GENERATED_SECRET_KEY, generated: true };
}

/**
 * Whether the row stays disabled by endpoint health: it was, the spec wants it active, and the spec has
 * not changed since the operator last looked (a spec change re-enables it, as an API update does).
 */
export function disabledByHealth(
  row: SubscriptionRow,
  active: boolean,
  resource: WebhookSubscription,
): boolean {
  return (
    !row.isActive &&
    active &&
    row.disabledReason !== null &&
    row.disabledReason !== undefined &&
    resource.status?.observedGeneration === resource.metadata.generation
  );
}

/** The fields of the row that differ from the spec (empty: nothing to write). */
export function rowDrift(desired: DesiredInput, active: boolean, row: SubscriptionRow): string[] {
  const drift: string[] = [];
  if (row.url !== desired.url) drift.push('url');
  if (JSON.stringify(row.events) !== JSON.stringify(desired.events)) drift.push('events');
  if ((row.description ?? null) !== desired.description) drift.push('description');
  if (!sameRecord(row.customHeaders ?? {}, desired.customHeaders)) drift.push('customHeaders');
  if (row.isActive !== active) drift.push('active');
  return drift;
}

function sameRecord(a: Record<string, string>, b: Record<string, string>): boolean {
  const ka = Object.keys(a).sort();
  const kb = Object.keys(b).sort();
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && a[k] === b[k]);
}

/**
 * Whether the row must receive the secret again: the Secret changed since the row got it (its
 * resourceVersion, recorded in status), or the row's suffix does not match the value.
 */
export function secretNeedsPush(
  status: WebhookSubscriptionStatus | undefined,
  observedSecret: string,
  secret: string,
  row: SubscriptionRow,
): boolean {
  return status?.observedSecret !== observedSecret || !secret.endsWith(row.secretSuffix);
}

const isKubeError = (err: unknown) => statusOf(err) !== undefined || err instanceof ApiException;

export type Failure = { reason: ReadyReason; message: string; retry: boolean };

/** A Kubernetes API call failed during the reconcile (a 403, a 500, a conflict): retried with backoff. */
export function kubeFailure(err: unknown): Failure {
  return { reason: 'ReconcileError', message: `Kubernetes API: ${kubeErrorMessage(err)}`, retry: true };
}

const DB_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
]);

/** How a failed service call shows in the resource: a spec the service refuses, or a transient fault. */
export function classifyServiceError(err: unknown): Failure {
  if (err instanceof ApiError) {
    if (err.status === 400 || err.status === 422) {
      const param = err.param ? ` (${err.param.startsWith('spec.') ? err.param : `spec.${err.param}`})` : '';
      return { reason: 'InvalidSpec', message: `${err.message}${param}`, retry: false };
    }
    if (err.status === 404) return { reason: 'PaywallNotFound', message: err.message, retry: true };
    return { reason: 'ReconcileError', message: err.message, retry: true };
  }
  const code = String((err as { code?: unknown } | null)?.code ?? '');
  // Foreign key violation: the project does not exist.
  if (code === '23503')
    return { reason: 'PaywallNotFound', message: 'spec.paywallId names no paywall', retry: true };
  const message = (err as Error)?.message ?? String(err);
  if (
    DB_ERROR_CODES.has(code) ||
    code.startsWith('08') ||
    code.startsWith('57P') ||
    code.startsWith('53') ||
    /connect|terminat|timeout|pool/i.test(message)
  )
    return { reason: 'DatabaseUnavailable', message: `database unavailable: ${message}`, retry: true };
  return { reason: 'ReconcileError', message, retry: true };
}

// ---------------------------------------------------------------------------------------------------
// The effectful reconcile.

export interface ReconcileResult extends Result {
  /** What happened, for logs and metrics. */
  outcome: 'synced' | 'finalized' | 'gone' | 'failed' | 'error';
}

export interface ReconcilerDeps {
  kube: KubeClients;
  store: SubscriptionStore;
  log: Logger;
  /** The reconciler's view of the resource (the informer's cache). */
  getResource(key: string): WebhookSubscription | undefined;
  /** A Secret from the informer's cache, when there is one (else the reconciler reads it). */
  getSecret?(namespace: string, name: string): V1Secret | undefined;
  /** Reporting instance in Events (the pod name). */
  identity: string;
  /**
   * A synced resource is reconciled again after this long, so that its status mirrors the row's delivery
   * stats and drift of the row is put back (undefined: only on changes).
   */
  statusSyncMs?: number;
  now?: () => Date;
}

export class Reconciler {
  readonly #d: ReconcilerDeps;

  /**
   * What this reconciler last wrote per key, until the informer's cache has caught up with it: a cached
   * object whose resourceVersion we have already superseded is older than what we know.
   */
  readonly #written = new Map<string, { superseded: Set<string>; latest: WebhookSubscription }>();

  constructor(deps: ReconcilerDeps) {
    this.#d = deps;
  }

  #current(key: string): WebhookSubscription | undefined {
    const cached = this.#d.getResource(key);
    const written = this.#written.get(key);
    if (!cached || !written) {
      if (!cached) this.#written.delete(key);
      return cached;
    }
    if (written.superseded.has(cached.metadata.resourceVersion ?? '')) return written.latest;
    this.#written.delete(key);
    return cached;
  }

  #wrote(before: WebhookSubscription, after: WebhookSubscription): WebhookSubscription {
    const key = `${before.metadata.namespace ?? ''}/${before.metadata.name}`;
    const entry = this.#written.get(key) ?? { superseded: new Set<string>(), latest: after };
    entry.superseded.add(before.metadata.resourceVersion ?? '');
    entry.latest = after;
    this.#written.set(key, entry);
    return after;
  }

  #now(): Date {
    return this.#d.now?.() ?? new Date();
  }

  /**
   * Level-triggered and idempotent: makes the row, the Secret and the status agree with the resource.
   * Resolves with what to do next (see Result); throws a TerminalError for a spec that no retry can fix
   * (its status says why). A failed Kubernetes API call shows as Ready=False/ReconcileError with a
   * Warning Event, and is retried.
   */
  async reconcile(key: string): Promise<ReconcileResult> {
    const { namespace, name } = splitKey(key);
    const managedBy = managedByOf(namespace, name);
    let resource = this.#current(key);
    if (!resource) return this.#orphan(managedBy);
    try {
      if (resource.metadata.deletionTimestamp) return await this.#finalize(resource, managedBy);
      return await this.#sync(resource, namespace, name, managedBy, (next) => {
        resource = next;
      });
    } catch (err) {
      // A 409 is optimistic concurrency at work (our cached copy was stale): retried, not reported.
      if (err instanceof TerminalError || !isKubeError(err) || isConflict(err)) throw err;
      return this.#fail(resource, kubeFailure(err));
    }
  }

  async #sync(
    resource: WebhookSubscription,
    namespace: string,
    name: string,
    managedBy: string,
    seen: (resource: WebhookSubscription) => void,
  ): Promise<ReconcileResult> {
    if (!resource.metadata.finalizers?.includes(FINALIZER)) {
      resource = await this.#addFinalizer(resource);
      seen(resource);
    }

    // Validate everything before creating anything (the generated Secret included).
    const check = checkSpec(resource.spec);
    if (!check.ok)
      return this.#fail(resource, { reason: 'InvalidSpec', message: check.message, retry: false });
    try {
      await this.#d.store.validate(check.input);
    } catch (err) {
      return this.#fail(resource, classifyServiceError(err));
    }

    let row: SubscriptionRow | undefined;
    let paywallId = check.paywallId;
    try {
      if (paywallId === undefined && check.projectRef !== undefined)
        paywallId = await this.#d.store.resolveProject?.(namespace, check.projectRef);
      row = await this.#d.store.findByManager(managedBy);
    } catch (err) {
      return this.#fail(resource, classifyServiceError(err));
    }
    if (paywallId === undefined)
      return this.#fail(resource, {
        reason: 'ProjectNotFound',
        message: `Project ${namespace}/${check.projectRef} does not exist or is not Ready yet`,
        retry: true,
      });
    if (row && row.paywallId !== paywallId)
      return this.#fail(resource, {
        reason: 'InvalidSpec',
        message: `spec.${check.projectRef !== undefined ? 'projectRef' : 'paywallId'} cannot change (the subscription ${row.id} belongs to ${row.paywallId}); delete and re-create the resource to move it`,
        retry: false,
      });

    const secret = await this.#resolveSecret(resource);
    if ('missing' in secret)
      return this.#fail(resource, { reason: 'SecretNotFound', message: secret.missing, retry: true });

    const events: Array<[string, string]> = [];
    try {
      if (!row) {
        row = await this.#d.store.create(
          paywallId,
          { ...check.input, secret: secret.value },
          { createdBy: createdByOf(namespace, name), managedBy },
        );
        events.push(['Created', `Created webhook subscription ${row.id} in ${row.paywallId}`]);
        if (!check.active) row = await this.#d.store.setActive(row.paywallId, row.id, false, { managedBy });
      } else if (disabledByHealth(row, check.active, resource)) {
        // Endpoint health disabled it and the spec has not changed since: leave it disabled, say so.
        return this.#endpointDisabled(resource, row, secret.observed);
      } else {
        const drift = rowDrift(check.input, check.active, row);
        const pushSecret = secretNeedsPush(resource.status, secret.observed, secret.value, row);
        if (drift.length || pushSecret) {
          const specChanged = resource.status?.observedGeneration !== resource.metadata.generation;
          row = await this.#d.store.update(
            row.paywallId,
            row.id,
            { ...check.input, isActive: check.active, ...(pushSecret ? { secret: secret.value } : {}) },
            { managedBy },
          );
          const what = [...drift, ...(pushSecret ? ['secret'] : [])].join(', ');
          events.push([
            'Updated',
            specChanged || pushSecret
              ? `Updated webhook subscription ${row.id} (${what})`
              : `Put back webhook subscription ${row.id} changed outside the resource (${what})`,
          ]);
        }
      }
    } catch (err) {
      return this.#fail(resource, classifyServiceError(err));
    }

    for (const [reason, message] of events) await this.#event(resource, 'Normal', reason, message);
    await this.#writeStatus(resource, {
      subscriptionId: row.id,
      secretSuffix: row.secretSuffix,
      observedSecret: secret.observed,
      consecutiveFailures: row.consecutiveFailures,
      lastDeliveredAt: row.lastDeliveredAt,
      ready: {
        status: 'True',
        reason: 'Synced',
        message: row.isActive
          ? `Subscription ${row.id} is active`
          : `Subscription ${row.id} is inactive (spec.active is false)`,
      },
    });
    return {
      outcome: 'synced',
      ...(this.#d.statusSyncMs !== undefined ? { requeueAfterMs: this.#d.statusSyncMs } : {}),
    };
  }

  async #endpointDisabled(
    resource: WebhookSubscription,
    row: SubscriptionRow,
    observedSecret: string,
  ): Promise<ReconcileResult> {
    const message = `Subscription ${row.id} was disabled: ${row.disabledReason}. Change the spec (or set spec.active to false and back) to enable it again`;
    const previous = readyCondition(resource);
    if (previous?.reason !== 'EndpointDisabled')
      await this.#event(resource, 'Warning', 'EndpointDisabled', message);
    await this.#writeStatus(resource, {
      subscriptionId: row.id,
      secretSuffix: row.secretSuffix,
      observedSecret,
      consecutiveFailures: row.consecutiveFailures,
      lastDeliveredAt: row.lastDeliveredAt,
      ready: { status: 'False', reason: 'EndpointDisabled', message },
    });
    return {
      outcome: 'synced',
      ...(this.#d.statusSyncMs !== undefined ? { requeueAfterMs: this.#d.statusSyncMs } : {}),
    };
  }

  /** The resource is gone without passing the finalizer (removed by hand): its row must not stay active. */
  async #orphan(managedBy: string): Promise<ReconcileResult> {
    const row = await this.#d.store.findByManager(managedBy);
    if (row?.isActive) {
      await this.#d.store.setActive(row.paywallId, row.id, false, { managedBy });
      this.#d.log.info(`${managedBy} is gone; deactivated subscription ${row.id}`);
    }
    return { outcome: 'gone' };
  }

  async #finalize(resource: WebhookSubscription, managedBy: string): Promise<ReconcileResult> {
    if (!resource.metadata.finalizers?.includes(FINALIZER)) return { outcome: 'finalized' };
    try {
      const row = await this.#d.store.findByManager(managedBy);
      if (row?.isActive) {
        await this.#d.store.setActive(row.paywallId, row.id, false, { managedBy });
        await this.#event(resource, 'Normal', 'Deactivated', `Deactivated webhook subscription ${row.id}`);
        this.#d.log.info(`${managedBy} is being deleted; deactivated subscription ${row.id}`);
      }
    } catch (err) {
      const failure = classifyServiceError(err);
      this.#d.log.warn(
        `${managedBy} is being deleted but its row could not be deactivated: ${failure.message}`,
      );
      return { outcome: 'failed', requeue: true };
    }
    const finalizers = resource.metadata.finalizers.filter((f) => f !== FINALIZER);
    await this.#patchMeta(resource, { finalizers });
    return { outcome: 'finalized' };
  }

  async #addFinalizer(resource: WebhookSubscription): Promise<WebhookSubscription> {
    const finalizers = [...(resource.metadata.finalizers ?? []), FINALIZER];
    return this.#patchMeta(resource, { finalizers });
  }

  /** Merge patch of metadata, conditional on the resourceVersion read (409 on a stale read). */
  async #patchMeta(
    resource: WebhookSubscription,
    metadata: Record<string, unknown>,
  ): Promise<WebhookSubscription> {
    const { namespace = '', name } = resource.metadata;
    const patched = (await this.#d.kube.custom.patchNamespacedCustomObject(
      {
        group: GROUP,
        version: VERSION,
        namespace,
        plural: PLURAL,
        name,
        fieldManager: FIELD_MANAGER,
        body: { metadata: { ...metadata, resourceVersion: resource.metadata.resourceVersion } },
      },
      mergePatch,
    )) as WebhookSubscription;
    return this.#wrote(resource, patched);
  }

  async #resolveSecret(
    resource: WebhookSubscription,
  ): Promise<{ value: string; observed: string } | { missing: string }> {
    const namespace = resource.metadata.namespace ?? '';
    const source = secretSourceOf(resource);
    let secret = this.#d.getSecret?.(namespace, source.name);
    if (!secret) {
      try {
        secret = await this.#d.kube.core.readNamespacedSecret({ name: source.name, namespace });
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    }
    if (!secret && source.generated) secret = await this.#createGeneratedSecret(resource, source.name);
    if (!secret) return { missing: `Secret ${namespace}/${source.name} not found` };
    const encoded = secret.data?.[source.key];
    const value =
      encoded !== undefined
        ? Buffer.from(encoded, 'base64').toString('utf8')
        : secret.stringData?.[source.key];
    if (value === undefined || value === '')
      return { missing: `Secret ${namespace}/${source.name} has no key "${source.key}"` };
    return { value, observed: `${source.name}/${source.key}@${secret.metadata?.resourceVersion ?? ''}` };
  }

  async #createGeneratedSecret(resource: WebhookSubscription, name: string): Promise<V1Secret> {
    const namespace = resource.metadata.namespace ?? '';
    try {
      const created = await this.#d.kube.core.createNamespacedSecret({
        namespace,
        fieldManager: FIELD_MANAGER,
        body: {
          apiVersion: 'v1',
          kind: 'Secret',
          type: 'Opaque',
          metadata: {
            name,
            namespace,
            labels: { 'app.kubernetes.io/managed-by': 'tollgate-operator' },
            ownerReferences: [
              {
                apiVersion: API_VERSION,
                kind: KIND,
                name: resource.metadata.name,
                uid: resource.metadata.uid ?? '',
                controller: true,
                blockOwnerDeletion: true,
              },
            ],
          },
          data: { [GENERATED_SECRET_KEY]: Buffer.from(generateSigningSecret()).toString('base64') },
        },
      });
      this.#d.log.info(
        `generated signing secret ${namespace}/${name} for ${KIND} ${namespace}/${resource.metadata.name}`,
      );
      return created;
    } catch (err) {
      // Made meanwhile (another reconcile of the same key cannot run at once; an earlier one may have).
      if (statusOf(err) === 409) return this.#d.kube.core.readNamespacedSecret({ name, namespace });
      throw err;
    }
  }

  /**
   * Reports a failure on the resource: Ready=False with the reason, and a Warning Event when the reason or
   * message is new. A status write that fails in turn (the API server refusing it too) is logged; the
   * retry comes from the result. A failure that no retry fixes ends in a TerminalError.
   */
  async #fail(resource: WebhookSubscription, failure: Failure): Promise<ReconcileResult> {
    const previous = readyCondition(resource);
    const changed = previous?.reason !== failure.reason || previous?.message !== failure.message;
    const what = `${KIND} ${resource.metadata.namespace}/${resource.metadata.name}`;
    this.#d.log.warn(`${what}: ${failure.reason}: ${failure.message}`);
    if (changed) await this.#event(resource, 'Warning', failure.reason, failure.message);
    try {
      await this.#writeStatus(resource, {
        ready: { status: 'False', reason: failure.reason, message: failure.message },
      });
    } catch (err) {
      if (!isNotFound(err))
        this.#d.log.warn(`${what}: could not write status ${failure.reason}: ${kubeErrorMessage(err)}`);
    }
    if (!failure.retry) throw new TerminalError(`${failure.reason}: ${failure.message}`);
    return { outcome: failure.reason === 'ReconcileError' ? 'error' : 'failed', requeue: true };
  }

  async #writeStatus(
    resource: WebhookSubscription,
    fields: Omit<WebhookSubscriptionStatus, 'conditions' | 'observedGeneration'> & {
      ready: Pick<Condition, 'status' | 'reason' | 'message'>;
    },
  ): Promise<void> {
    const { ready, ...rest } = fields;
    const generation = resource.metadata.generation;
    const next: WebhookSubscriptionStatus = {
      ...rest,
      ...(generation !== undefined ? { observedGeneration: generation } : {}),
      conditions: setCondition(
        resource.status?.conditions,
        { type: 'Ready', ...ready, ...(generation !== undefined ? { observedGeneration: generation } : {}) },
        this.#now(),
      ),
    };
    const patch = statusPatch(resource.status, next);
    if (!patch) return;
    const { namespace = '', name } = resource.metadata;
    const patched = (await this.#d.kube.custom.patchNamespacedCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        namespace,
        plural: PLURAL,
        name,
        fieldManager: FIELD_MANAGER,
        body: { status: patch },
      },
      mergePatch,
    )) as WebhookSubscription;
    this.#wrote(resource, patched);
  }

  /** Records a Kubernetes Event on the resource; a failure to record one is logged, never fatal. */
  async #event(
    resource: WebhookSubscription,
    type: 'Normal' | 'Warning',
    reason: string,
    message: string,
  ): Promise<void> {
    const { namespace = 'default', name, uid, resourceVersion } = resource.metadata;
    const now = this.#now();
    const body: CoreV1Event = {
      metadata: { generateName: `${name}.`, namespace },
      involvedObject: { apiVersion: API_VERSION, kind: KIND, name, namespace, uid, resourceVersion },
      type,
      reason,
      message: message.slice(0, 1024),
      source: { component: FIELD_MANAGER },
      reportingComponent: `${GROUP}/operator`,
      reportingInstance: this.#d.identity,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
    try {
      await this.#d.kube.core.createNamespacedEvent({ namespace, body });
    } catch (err) {
      this.#d.log.warn(
        `could not record event ${reason} on ${KIND} ${namespace}/${name}: ${kubeErrorMessage(err)}`,
      );
    }
  }
}
