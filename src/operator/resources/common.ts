import type { V1OwnerReference, V1Secret } from '@kubernetes/client-node';
import { API_VERSION, GROUP } from '../api.ts';
import { Failure } from '../failure.ts';
import { type KindHandler, managedByOf, sameNamespace, type Watch } from '../handler.ts';
import type { Resource } from '../status.ts';

/** What the kinds of src/operator/resources share: the project a resource belongs to, Secrets, comparisons. */

export interface ProjectRef {
  projectRef?: { name?: string };
}

export const finalizerOf = (kind: string) => `${GROUP}/${kind.toLowerCase()}`;
export const projectRefOf = (r: Resource<ProjectRef>) => r.spec?.projectRef?.name;

/** The projects Project resources manage, as the kinds that refer to one read them. */
export interface ProjectLookup {
  projectByManager(managedBy: string): Promise<{ id: string; currency: string } | undefined>;
}

export const projectNotFound = (namespace: string, name: string) =>
  new Failure('ProjectNotFound', `Project ${namespace}/${name} does not exist or is not Ready yet`, true);

/** The project `spec.projectRef` names: the row its Project resource manages (ProjectNotFound otherwise). */
export async function projectOf(
  store: ProjectLookup,
  r: Resource<ProjectRef>,
): Promise<{ id: string; currency: string }> {
  const namespace = r.metadata.namespace ?? '';
  const name = projectRefOf(r);
  if (!name) throw new Failure('InvalidSpec', 'spec.projectRef.name is required', false);
  const project = await store.projectByManager(managedByOf('Project', namespace, name));
  if (!project) throw projectNotFound(namespace, name);
  return project;
}

/** Watches the Project resource (same namespace) a resource refers to: it may unblock it. */
export function projectWatch<R extends Resource>(refOf: (resource: R) => string | undefined): Watch<R> {
  return {
    kind: 'Project',
    affects: (project, r) => sameNamespace(project, r) && refOf(r) === project.metadata.name,
  };
}

/**
 * The frame of a kind whose resources belong to a project by `spec.projectRef`: its names, its finalizer,
 * and the watch of that Project (its change may unblock them) before the kind's own `watches`.
 */
export function projectScoped<R extends Resource<ProjectRef>>(
  kind: string,
  plural: string,
  ...watches: Watch<R>[]
): Pick<KindHandler<R>, 'kind' | 'plural' | 'finalizer' | 'watches'> {
  return { kind, plural, finalizer: finalizerOf(kind), watches: [projectWatch<R>(projectRefOf), ...watches] };
}

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
