/**
 * The WebhookSubscription resource (its API types are in status.ts), apart from the generic runtime in
 * runtime/. The deployment's other kinds of the same group and version are in resources/kinds.ts.
 */
export const GROUP = 'tollgate.dev';
export const VERSION = 'v1alpha1';
export const KIND = 'WebhookSubscription';
export const PLURAL = 'webhooksubscriptions';
export const API_VERSION = `${GROUP}/${VERSION}`;
export const FINALIZER = 'tollgate.dev/subscription';
