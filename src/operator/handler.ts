import type { V1Secret } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { KubeClients, KubeObject } from './runtime/kube.ts';
import type { Resource } from './status.ts';

/**
 * The contract of a kind the operator reconciles (src/operator/resources/ holds one handler per kind):
 * `sync` makes the kind's rows agree with the spec, level-triggered and idempotent; `finalize` undoes
 * them when the resource is deleted; `watches` say which changes to other objects (Secrets, other kinds)
 * concern a resource of this kind, and `notices` which database change notices do. The reconciler
 * (reconciler.ts) does what is the same for every kind — the finalizer, status with observedGeneration
 * and the Ready condition, Events, failures as reasons — and the manager (manager.ts) feeds it.
 * A handler reaches the database only through the store it is built with, declared beside it.
 */

export interface RecordedEvent {
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
}

/** What a sync achieved. */
export interface Synced {
  /** Ready=True's reason and message, or Ready=False's when `notReady`. */
  reason: string;
  message: string;
  /** Ready=False: retried with backoff (`retry`), or looked at again at the next resync (`resync`). */
  notReady?: 'retry' | 'resync';
  /** Status fields besides observedGeneration and conditions. */
  status?: Record<string, unknown>;
  /** Recorded on the resource before its status is written. */
  events?: RecordedEvent[];
}

/** What a handler may use besides its store. */
export interface HandlerContext {
  kube: KubeClients;
  log: Logger;
  /** `<Kind> <namespace>/<name>`: stored on the rows the resource manages. */
  managedBy: string;
  /** A Secret (informer cache first, then the API; `fresh`: the API only); undefined when missing. */
  secret(namespace: string, name: string, opts?: { fresh?: boolean }): Promise<V1Secret | undefined>;
}

/** A dependency: a change to an object of `kind` (`Secret`, or another handler's kind) reconciles the
 * resources of this kind it `affects`. */
export interface Watch<R extends Resource = Resource> {
  kind: string;
  affects(changed: KubeObject, resource: R): boolean;
}

/** Change notices from the database naming a project (other processes' writes to the rows). */
export interface Notices<R extends Resource = Resource> {
  /** Subscribes; resolves with the unsubscribe function. */
  subscribe(onProject: (projectId: string) => void): Promise<() => Promise<void>>;
  affects(projectId: string, resource: R): boolean;
}

export interface KindHandler<R extends Resource = Resource> {
  kind: string;
  plural: string;
  finalizer: string;
  /** Reason of a spec the service refuses (400): `InvalidSpec`, or `InvalidPrice` for prices. */
  invalidReason?: string;
  watches?: Array<Watch<R>>;
  notices?: Notices<R>;
  sync(resource: R, h: HandlerContext): Promise<Synced>;
  /** Undoes the rows (the resource is being deleted); the events returned are recorded. */
  finalize(resource: R, h: HandlerContext): Promise<RecordedEvent[]>;
  /** The resource vanished without its finalizer running. */
  orphan?(managedBy: string, h: HandlerContext): Promise<void>;
}

export const managedByOf = (kind: string, namespace: string, name: string) => `${kind} ${namespace}/${name}`;

export const sameNamespace = (a: KubeObject, b: KubeObject) => a.metadata.namespace === b.metadata.namespace;

/** Watches the Secrets (same namespace) a resource reads or writes. */
export function secretWatch<R extends Resource>(namesOf: (resource: R) => string[]): Watch<R> {
  return {
    kind: 'Secret',
    affects: (secret, r) => sameNamespace(secret, r) && namesOf(r).includes(secret.metadata.name),
  };
}

/** Watches every object of a kind in the resource's namespace. */
export function namespaceWatch<R extends Resource>(kind: string): Watch<R> {
  return { kind, affects: sameNamespace };
}

export const synced = (message: string, rest: Omit<Synced, 'reason' | 'message'> = {}): Synced => ({
  reason: 'Synced',
  message,
  ...rest,
});
export const normal = (reason: string, message: string): RecordedEvent => ({
  type: 'Normal',
  reason,
  message,
});
/** The events of a finalize that undid something (`message`), or none. */
export const finalized = (message: string | undefined): RecordedEvent[] =>
  message ? [normal('Finalized', message)] : [];

/** "Updated" after a spec change; "Put back" when the rows changed outside the resource (drift). */
export const updateEvent = (r: Resource, what: string) =>
  r.status?.observedGeneration !== r.metadata.generation
    ? normal('Updated', `Updated ${what}`)
    : normal('DriftCorrected', `Put back ${what} changed outside the resource`);

/** A Secret the resource reads changed (rotated): its new value was written to `what`. */
export const secretRotated = (what: string, secret: string): RecordedEvent =>
  normal('SecretRotated', `Wrote the new value of Secret ${secret} to ${what}`);

/**
 * The project the resource's Project names is another one now (the Project was deleted and applied
 * again): the resource's rows were written there, and those of the old project released as deleting the
 * resource would (`released`: what was done there).
 */
export const projectChanged = (to: string, released: string): RecordedEvent =>
  normal('ProjectChanged', `Moved to project ${to}, the one its Project manages now; ${released}`);
