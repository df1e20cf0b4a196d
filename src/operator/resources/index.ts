import type { KindHandler } from '../handler.ts';
import type { OperatorStores } from '../stores.ts';
import { apiKeyHandler } from './api-key.ts';
import { limitPolicyHandler } from './limit-policy.ts';
import { modelProviderHandler } from './model-provider.ts';
import { priceListHandler } from './price-list.ts';
import { projectHandler } from './project.ts';
import { webhookSubscriptionHandler } from './webhook-subscription.ts';

/**
 * The kinds of group tollgate.dev/v1alpha1 (crds/*.tollgate.dev.yaml), one handler each (handler.ts),
 * each reconciled into the rows the admin API, dashboard and CLI write, through its store (stores.ts).
 */
export function kindHandlers(stores: OperatorStores): KindHandler[] {
  return [
    projectHandler(stores.projects),
    apiKeyHandler(stores.apiKeys),
    modelProviderHandler(stores.providers),
    priceListHandler(stores.priceLists),
    limitPolicyHandler(stores.limitPolicies),
    webhookSubscriptionHandler(stores.subscriptions),
  ] as KindHandler[];
}
