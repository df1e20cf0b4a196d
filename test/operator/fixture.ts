import type { AppContext } from '../../src/app/context.ts';
import { type OperatorOptions, startOperator } from '../../src/cli/operator.ts';
import { GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import type { RunningOperator } from '../../src/operator/replica.ts';
import type { WebhookSubscription } from '../../src/operator/resources/webhook-subscription.ts';
import type { KubeClients } from '../../src/operator/runtime/kube.ts';
import { makeClients } from '../../src/operator/runtime/kube.ts';
import type { Resource } from '../../src/operator/status.ts';
import { createTestContext } from '../helpers/context.ts';
import { ALL_CRD_FILES, type KubeTarget, kubeTarget } from '../helpers/fake-kube-apiserver.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The operator tests' set-up: the configuration of an operator under test, the operator started in a
 * test's namespace, and WebhookSubscription resources.
 */

/** Status synced every second; a short Lease in `namespace`, so a lost leader is replaced within seconds. */
export function operatorEnv(namespace: string): Record<string, string> {
  return {
    OPERATOR_STATUS_SYNC_SECONDS: '1',
    OPERATOR_LEASE_NAMESPACE: namespace,
    OPERATOR_LEASE_DURATION_SECONDS: '3',
    OPERATOR_RENEW_DEADLINE_SECONDS: '2',
    OPERATOR_RETRY_PERIOD_SECONDS: '1',
  };
}

/** The plural of each tollgate.dev kind. */
export const PLURALS: Record<string, string> = {
  Project: 'projects',
  ApiKey: 'apikeys',
  ModelProvider: 'modelproviders',
  PriceList: 'pricelists',
  LimitPolicy: 'limitpolicies',
  WebhookSubscription: 'webhooksubscriptions',
};

/** A delivery worker that delivers nothing (the operator tests look at resources, not deliveries). */
const idleWorker = () => ({ ready: Promise.resolve(), wake: () => {}, stop: async () => {} });

/** Starts the operator on `ctx` watching the target's namespace; resolves once it leads. */
export async function startLeadingOperator(
  ctx: AppContext,
  target: KubeTarget,
  kube: KubeClients,
  identity: string,
  startWorker: OperatorOptions['startWorker'] = idleWorker,
): Promise<RunningOperator> {
  const operator = startOperator(ctx, { kube, namespaces: [target.namespace], identity, startWorker });
  await target.until(() => operator.isLeader(), 'the operator to lead');
  return operator;
}

/** Creates the WebhookSubscription `name` in `namespace`; the object the API server answered. */
export async function createWebhookSubscription(
  kube: KubeClients,
  namespace: string,
  name: string,
  spec: Record<string, unknown>,
): Promise<WebhookSubscription> {
  return (await kube.custom.createNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace,
    plural: PLURAL,
    body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'WebhookSubscription', metadata: { name }, spec },
  })) as WebhookSubscription;
}

/** A test file's operator and what it runs against (`startOperatorSuite`). */
export interface OperatorSuite {
  target: KubeTarget;
  ctx: AppContext;
  kube: KubeClients;
  operator: RunningOperator;
  upstream: MockUpstream;
  ns: string;
}

/**
 * The fake API server with every CRD (schemas and CEL rules) in a namespace of its own, a context on
 * Postgres, a loopback provider, and the operator `identity` leading there.
 */
export async function startOperatorSuite(namespace: string, identity: string): Promise<OperatorSuite> {
  const started: Partial<OperatorSuite> = {};
  try {
    const target = await kubeTarget(namespace, { crdFiles: ALL_CRD_FILES, cel: true });
    started.target = target;
    const upstream = await startMockUpstream();
    started.upstream = upstream;
    const ctx = await createTestContext(operatorEnv(target.namespace));
    started.ctx = ctx;
    const kube = makeClients(target.kubeConfig);
    const operator = await startLeadingOperator(ctx, target, kube, identity);
    return { target, ctx, kube, operator, upstream, ns: target.namespace };
  } catch (err) {
    await stopOperatorSuite(started);
    throw err;
  }
}

/** Stops what `startOperatorSuite` started (what of it did start). */
export async function stopOperatorSuite(suite: Partial<OperatorSuite>): Promise<void> {
  await suite.operator?.shutdown(0);
  await suite.ctx?.close();
  await suite.upstream?.close();
  await suite.target?.close();
}

/** A tollgate.dev resource's address, for the custom objects API. */
export function resourceRef(namespace: string, kind: string, name: string) {
  return { group: GROUP, version: VERSION, namespace, plural: PLURALS[kind]!, name };
}

/** The resource as the API server has it; undefined when there is none. */
export async function readResource(
  kube: KubeClients,
  namespace: string,
  kind: string,
  name: string,
): Promise<Resource | undefined> {
  try {
    return (await kube.custom.getNamespacedCustomObject(resourceRef(namespace, kind, name))) as Resource;
  } catch {
    return undefined;
  }
}
