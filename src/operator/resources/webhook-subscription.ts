import { randomBytes } from 'node:crypto';
import type { V1Secret } from '@kubernetes/client-node';
import { DESCRIPTION_MAX, MAX_CUSTOM_HEADERS, type SubscriptionView } from '../../webhooks/subscriptions.ts';
import { FINALIZER, KIND, PLURAL } from '../api.ts';
import { classifyServiceError, Failure } from '../failure.ts';
import {
  finalized,
  type HandlerContext,
  type KindHandler,
  managedByOf as managedByKind,
  normal,
  projectChanged,
  type RecordedEvent,
  secretRotated,
  secretWatch,
  synced,
} from '../handler.ts';
import { FIELD_MANAGER, statusOf } from '../runtime/kube.ts';
import { type Condition, type Resource, type ResourceStatus, readyCondition } from '../status.ts';
import { ownedSecret, type ProjectLookup, projectNotFound, projectWatch, secretValue } from './common.ts';

/**
 * The WebhookSubscription kind: a webhook subscription of a project (by id, or by its Project resource),
 * signed with a secret from a Secret (or one the operator generates and owns). Its row is written through
 * the subscription service the REST API uses; its status mirrors the row's delivery stats.
 */

/** `spec` of a WebhookSubscription as the API server stores it. */
export interface WebhookSubscriptionSpec {
  paywallId?: string;
  /** The Project resource (same namespace) instead of the id. */
  projectRef?: { name?: string };
  url?: string;
  events?: string[];
  description?: string;
  customHeaders?: Record<string, string>;
  secretRef?: { name?: string; key?: string };
  active?: boolean;
}

export interface WebhookSubscriptionStatus extends ResourceStatus {
  subscriptionId?: string;
  secretSuffix?: string;
  /** `<secret name>/<key>@<resourceVersion>` of the Secret whose value the row holds. */
  observedSecret?: string;
  observedGeneration?: number;
  conditions?: Condition[];
  consecutiveFailures?: number;
  lastDeliveredAt?: string | null;
}

export type WebhookSubscription = Resource<WebhookSubscriptionSpec, WebhookSubscriptionStatus>;

export type ReadyReason =
  | 'Synced'
  | 'InvalidSpec'
  | 'SecretNotFound'
  | 'DatabaseUnavailable'
  | 'PaywallNotFound'
  | 'ProjectNotFound'
  | 'ReconcileError'
  | 'EndpointDisabled';

// ---------------------------------------------------------------------------------------------------
// The subscription service, as the handler sees it (the same functions the REST API uses).

/** The fields of a subscription the handler compares and mirrors into status. */
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

export interface SubscriptionStore extends ProjectLookup {
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
  /** Deactivates the row and hands it back to the REST API (its resource is deleted, or moved). */
  release(projectId: string, id: string, managedBy: string): Promise<SubscriptionRow>;
  /** Refuses (with the service's 400) what create or update would refuse, writing nothing. */
  validate(input: DesiredInput): Promise<void>;
  /** Subscribes to "the subscriptions of this project changed" notices; resolves with the unsubscribe. */
  watchChanges(onProject: (projectId: string) => void): Promise<() => Promise<void>>;
}

// ---------------------------------------------------------------------------------------------------
// Pure decisions.

/** Key of the signing secret in a Secret the operator generates. */
export const GENERATED_SECRET_KEY = 'secret';

export const createdByOf = (namespace: string, name: string) => `k8s:${namespace}/${name}`;
export const managedByOf = (namespace: string, name: string) => managedByKind(KIND, namespace, name);
export const generatedSecretName = (name: string) => `${name}-webhook-secret`;

export function generateSigningSecret(): string {
  return `whsec_${randomBytes(32).toString('base64url')}`;
}

export type SpecCheck =
  | {
      ok: true;
      /** The project: by id (`spec.paywallId`), or by the name of its Project resource (`projectRef`). */
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

// ---------------------------------------------------------------------------------------------------
// The handler.

/** A call of the subscription service: what it refuses shows as the resource's reason. */
async function service<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    throw Failure.of(classifyServiceError(err));
  }
}

type ValidSpec = Extract<SpecCheck, { ok: true }>;

/** The project (its id, or its Project resource's) and the row the resource already has, if any. */
async function target(store: SubscriptionStore, r: WebhookSubscription, check: ValidSpec, managedBy: string) {
  const namespace = r.metadata.namespace ?? '';
  const ref = check.projectRef;
  const { projectId, row } = await service(async () => ({
    projectId:
      check.paywallId ??
      (ref !== undefined
        ? (await store.projectByManager(managedByKind('Project', namespace, ref)))?.id
        : undefined),
    row: await store.findByManager(managedBy),
  }));
  if (projectId === undefined) throw projectNotFound(namespace, ref ?? '');
  // Another project than the row's (its Project was re-created): the row is released, a new one made.
  if (row && row.paywallId !== projectId) return { projectId, row: undefined, moved: row };
  return { projectId, row };
}

/** The signing secret's value and `<name>/<key>@<resourceVersion>`; SecretNotFound when missing. */
async function signingSecret(
  r: WebhookSubscription,
  h: HandlerContext,
): Promise<{ value: string; observed: string }> {
  const namespace = r.metadata.namespace ?? '';
  const source = secretSourceOf(r);
  let secret = await h.secret(namespace, source.name);
  if (!secret && source.generated) secret = await createGeneratedSecret(r, source.name, h);
  if (!secret) throw new Failure('SecretNotFound', `Secret ${namespace}/${source.name} not found`, true);
  const value = secretValue(secret, source.key);
  if (value === undefined)
    throw new Failure(
      'SecretNotFound',
      `Secret ${namespace}/${source.name} has no key "${source.key}"`,
      true,
    );
  return { value, observed: `${source.name}/${source.key}@${secret.metadata?.resourceVersion ?? ''}` };
}

async function createGeneratedSecret(
  r: WebhookSubscription,
  name: string,
  h: HandlerContext,
): Promise<V1Secret> {
  const labels = { 'app.kubernetes.io/managed-by': FIELD_MANAGER };
  const body = ownedSecret(KIND, r, name, labels, { [GENERATED_SECRET_KEY]: generateSigningSecret() });
  const { namespace } = body.metadata;
  try {
    const created = await h.kube.core.createNamespacedSecret({
      namespace,
      fieldManager: FIELD_MANAGER,
      body,
    });
    h.log.info(`generated signing secret ${namespace}/${name} for ${KIND} ${namespace}/${r.metadata.name}`);
    return created;
  } catch (err) {
    // Made meanwhile (another reconcile of the same key cannot run at once; an earlier one may have).
    if (statusOf(err) === 409) return h.kube.core.readNamespacedSecret({ name, namespace });
    throw err;
  }
}

const rowStatus = (row: SubscriptionRow, observedSecret: string) => ({
  projectId: row.paywallId,
  subscriptionId: row.id,
  secretSuffix: row.secretSuffix,
  observedSecret,
  consecutiveFailures: row.consecutiveFailures,
  lastDeliveredAt: row.lastDeliveredAt,
});

export function webhookSubscriptionHandler(store: SubscriptionStore): KindHandler<WebhookSubscription> {
  /** Creates the row, or puts the spec (and the secret, when it changed) back into it. */
  async function write(
    r: WebhookSubscription,
    check: ValidSpec,
    found: { projectId: string; row?: SubscriptionRow | undefined },
    secret: { value: string; observed: string },
    managedBy: string,
  ) {
    const { namespace = '', name } = r.metadata;
    let row = found.row;
    const events: RecordedEvent[] = [];
    if (!row) {
      const input = { ...check.input, secret: secret.value };
      row = await store.create(found.projectId, input, {
        createdBy: createdByOf(namespace, name),
        managedBy,
      });
      events.push(normal('Created', `Created webhook subscription ${row.id} in ${row.paywallId}`));
      if (!check.active) row = await store.setActive(row.paywallId, row.id, false, { managedBy });
      return { row, events };
    }
    const drift = rowDrift(check.input, check.active, row);
    const pushSecret = secretNeedsPush(r.status, secret.observed, secret.value, row);
    if (!drift.length && !pushSecret) return { row, events };
    const specChanged = r.status?.observedGeneration !== r.metadata.generation;
    const input = { ...check.input, isActive: check.active, ...(pushSecret ? { secret: secret.value } : {}) };
    row = await store.update(row.paywallId, row.id, input, { managedBy });
    // A new Secret since the last write is a rotation; a secret that differs from an unchanged Secret
    // was changed in the row, as the rest of a drift.
    const rotated = pushSecret && r.status?.observedSecret !== secret.observed;
    const what = `webhook subscription ${row.id}`;
    if (specChanged) {
      const fields = [...drift, ...(pushSecret ? ['secret'] : [])].join(', ');
      events.push(normal('Updated', `Updated ${what} (${fields})`));
      return { row, events };
    }
    if (rotated)
      events.push(secretRotated(`the signing secret of ${what}`, `${namespace}/${secretSourceOf(r).name}`));
    const putBack = [...drift, ...(pushSecret && !rotated ? ['secret'] : [])];
    if (putBack.length)
      events.push(
        normal('DriftCorrected', `Put back ${what} changed outside the resource (${putBack.join(', ')})`),
      );
    return { row, events };
  }

  return {
    kind: KIND,
    plural: PLURAL,
    finalizer: FINALIZER,
    watches: [projectWatch((r) => r.spec?.projectRef?.name), secretWatch((r) => [secretSourceOf(r).name])],
    notices: {
      subscribe: (onProject) => store.watchChanges(onProject),
      affects: (projectId, r) => r.spec?.paywallId === projectId,
    },
    async sync(r, h) {
      // Validate everything before creating anything (the generated Secret included).
      const check = checkSpec(r.spec);
      if (!check.ok) throw new Failure('InvalidSpec', check.message, false);
      await service(() => store.validate(check.input));
      const found = await target(store, r, check, h.managedBy);
      const secret = await signingSecret(r, h);
      if (found.row && disabledByHealth(found.row, check.active, r)) {
        // Endpoint health disabled it and the spec has not changed since: leave it disabled, say so.
        const message = `Subscription ${found.row.id} was disabled: ${found.row.disabledReason}. Change the spec (or set spec.active to false and back) to enable it again`;
        const warn = readyCondition(r)?.reason !== 'EndpointDisabled';
        return {
          reason: 'EndpointDisabled',
          message,
          notReady: 'resync',
          status: rowStatus(found.row, secret.observed),
          events: warn ? [{ type: 'Warning', reason: 'EndpointDisabled', message }] : [],
        };
      }
      const released: RecordedEvent[] = [];
      if (found.moved) {
        const old = found.moved;
        await service(() => store.release(old.paywallId, old.id, h.managedBy));
        const what = `released webhook subscription ${old.id} of ${old.paywallId} (inactive)`;
        released.push(projectChanged(found.projectId, what));
      }
      const written = await service(() => write(r, check, found, secret, h.managedBy));
      const { row } = written;
      const events = [...released, ...written.events];
      const state = row.isActive
        ? `Subscription ${row.id} is active`
        : `Subscription ${row.id} is inactive (spec.active is false)`;
      return synced(state, { status: rowStatus(row, secret.observed), events });
    },
    async finalize(_r, h) {
      const row = await service(() => store.findByManager(h.managedBy));
      if (!row) return [];
      await service(() => store.release(row.paywallId, row.id, h.managedBy));
      h.log.info(`${h.managedBy} is being deleted; released subscription ${row.id}`);
      return finalized(`Released webhook subscription ${row.id}: inactive, editable through the API again`);
    },
    /** The resource is gone without passing the finalizer (removed by hand): its row must not stay active. */
    async orphan(managedBy, h) {
      const row = await store.findByManager(managedBy);
      if (!row) return;
      await store.release(row.paywallId, row.id, managedBy);
      h.log.info(`${managedBy} is gone; released subscription ${row.id}`);
    },
  };
}
