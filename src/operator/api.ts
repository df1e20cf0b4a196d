/**
 * The API group and version of the operator's kinds (crds/*.tollgate.dev.yaml), and the names of the
 * first of them, WebhookSubscription (its finalizer predates the `tollgate.dev/<kind>` pattern of the
 * others, resources/common.ts `finalizerOf`).
 */
export const GROUP = 'tollgate.dev';
export const VERSION = 'v1alpha1';
export const API_VERSION = `${GROUP}/${VERSION}`;
export const KIND = 'WebhookSubscription';
export const PLURAL = 'webhooksubscriptions';
export const FINALIZER = 'tollgate.dev/subscription';
