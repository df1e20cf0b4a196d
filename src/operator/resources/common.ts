import type { V1OwnerReference, V1Secret } from '@kubernetes/client-node';
import { API_VERSION, GROUP } from '../api.ts';
import type { RecordedEvent, Synced } from '../handler.ts';
import type { Resource } from '../status.ts';

/** What the kinds of src/operator/resources share: spec and status helpers, events, Secrets. */

export interface ProjectRef {
  projectRef?: { name?: string };
}

export const finalizerOf = (kind: string) => `${GROUP}/${kind.toLowerCase()}`;
export const projectRefOf = (r: Resource<ProjectRef>) => r.spec?.projectRef?.name;

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

const specChanged = (r: Resource) => r.status?.observedGeneration !== r.metadata.generation;
/** "Updated" after a spec change; "Put back" when the rows changed outside the resource (drift). */
export const updateEvent = (r: Resource, what: string) =>
  specChanged(r)
    ? normal('Updated', `Updated ${what}`)
    : normal('DriftCorrected', `Put back ${what} changed outside the resource`);

/** The status' project id, for finalizers: the Project resource may be gone already. */
export const statusProject = (r: Resource) =>
  typeof r.status?.projectId === 'string' ? r.status.projectId : undefined;

/** A key of a Secret (`data`, else `stringData`); undefined when missing or empty. */
export function secretValue(secret: V1Secret, key: string): string | undefined {
  const encoded = secret.data?.[key];
  const value =
    encoded !== undefined ? Buffer.from(encoded, 'base64').toString('utf8') : secret.stringData?.[key];
  return value === '' ? undefined : value;
}

/** A Secret the resource owns (garbage-collected with it), holding `values`. */
export function ownedSecret(
  kind: string,
  r: Resource,
  name: string,
  labels: Record<string, string>,
  values: Record<string, string>,
): V1Secret & { metadata: { namespace: string } } {
  const owner: V1OwnerReference = {
    apiVersion: API_VERSION,
    kind,
    name: r.metadata.name,
    uid: r.metadata.uid ?? '',
    controller: true,
    blockOwnerDeletion: true,
  };
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'Opaque',
    metadata: { name, namespace: r.metadata.namespace ?? '', labels, ownerReferences: [owner] },
    data: Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
  };
}

/** JSON with sorted keys, to compare settings and limits whatever their key order. */
export function canonical(value: unknown): string {
  return JSON.stringify(value ?? null, (_k, v) =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)))
      : v,
  );
}
