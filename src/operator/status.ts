import type { KubeObject } from './runtime/kube.ts';

/**
 * The status every kind of the operator writes, the Kubernetes way: `observedGeneration`, the `Ready`
 * condition (with its own observedGeneration), and the kind's own fields beside them; written as a merge
 * patch of what changed.
 */

export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  observedGeneration?: number;
  lastTransitionTime: string;
}

export interface ResourceStatus {
  observedGeneration?: number;
  conditions?: Condition[];
  projectId?: string;
  [field: string]: unknown;
}

/** A custom resource of group tollgate.dev as the operator reads it. */
export interface Resource<S = unknown, T extends ResourceStatus = ResourceStatus> extends KubeObject {
  spec?: S;
  status?: T;
}

/**
 * Sets a condition the Kubernetes way: lastTransitionTime moves only when the status flips; reason,
 * message and observedGeneration follow the latest reconcile.
 */
export function setCondition(
  conditions: Condition[] | undefined,
  next: Omit<Condition, 'lastTransitionTime'>,
  now: Date,
): Condition[] {
  const list = [...(conditions ?? [])];
  const i = list.findIndex((c) => c.type === next.type);
  const previous = i >= 0 ? list[i] : undefined;
  const condition: Condition = {
    ...next,
    lastTransitionTime:
      previous && previous.status === next.status
        ? previous.lastTransitionTime
        : now.toISOString().replace(/\.\d+Z$/, 'Z'),
  };
  if (i >= 0) list[i] = condition;
  else list.push(condition);
  return list;
}

/** The status' project id, for finalizers: the Project resource may be gone already. */
export const statusProject = (r: { status?: ResourceStatus }) =>
  typeof r.status?.projectId === 'string' ? r.status.projectId : undefined;

export function readyCondition(resource: { status?: ResourceStatus }): Condition | undefined {
  return resource.status?.conditions?.find((c) => c.type === 'Ready');
}

/** The fields of `next` that differ from `current` (a merge patch of the status), or undefined. */
export function statusPatch(current: object | undefined, next: object): Record<string, unknown> | undefined {
  const patch: Record<string, unknown> = {};
  const cur = (current ?? {}) as Record<string, unknown>;
  for (const [field, value] of Object.entries(next)) {
    if (value === undefined) continue;
    if (JSON.stringify(cur[field] ?? null) !== JSON.stringify(value)) patch[field] = value;
  }
  return Object.keys(patch).length ? patch : undefined;
}
