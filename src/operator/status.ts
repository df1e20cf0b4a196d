import type { KubeObject } from './runtime/kube.ts';

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

export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  observedGeneration?: number;
  lastTransitionTime: string;
}

export interface WebhookSubscriptionStatus {
  subscriptionId?: string;
  secretSuffix?: string;
  /** `<secret name>/<key>@<resourceVersion>` of the Secret whose value the row holds. */
  observedSecret?: string;
  observedGeneration?: number;
  conditions?: Condition[];
  consecutiveFailures?: number;
  lastDeliveredAt?: string | null;
}

export interface WebhookSubscription extends KubeObject {
  spec?: WebhookSubscriptionSpec;
  status?: WebhookSubscriptionStatus;
}

export type ReadyReason =
  | 'Synced'
  | 'InvalidSpec'
  | 'SecretNotFound'
  | 'DatabaseUnavailable'
  | 'PaywallNotFound'
  | 'ProjectNotFound'
  | 'ReconcileError'
  | 'EndpointDisabled';

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

export function readyCondition(resource: WebhookSubscription): Condition | undefined {
  return resource.status?.conditions?.find((c) => c.type === 'Ready');
}

/** The fields of `next` that differ from `current` (a merge patch of the status), or undefined. */
export function statusPatch(
  current: WebhookSubscriptionStatus | undefined,
  next: WebhookSubscriptionStatus,
): WebhookSubscriptionStatus | undefined {
  const patch: Record<string, unknown> = {};
  const cur = (current ?? {}) as Record<string, unknown>;
  for (const [field, value] of Object.entries(next)) {
    if (value === undefined) continue;
    if (JSON.stringify(cur[field] ?? null) !== JSON.stringify(value)) patch[field] = value;
  }
  return Object.keys(patch).length ? (patch as WebhookSubscriptionStatus) : undefined;
}
