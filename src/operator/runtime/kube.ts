import {
  ApiException,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  PatchStrategy,
  setHeaderOptions,
} from '@kubernetes/client-node';

/** Field manager reported to the API server on every write. */
export const FIELD_MANAGER = 'tollgate-operator';

export interface KubeClients {
  config: KubeConfig;
  core: CoreV1Api;
  custom: CustomObjectsApi;
  coordination: CoordinationV1Api;
}

/**
 * The cluster connection: `KUBECONFIG` (or ~/.kube/config) when present, else the pod's service account
 * (in-cluster config).
 */
export function loadKubeConfig(): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromDefault();
  const cluster = kc.getCurrentCluster();
  // With nothing to load, the client falls back to http://localhost:8080: say so instead.
  if (!cluster || (cluster.name === 'cluster' && cluster.server === 'http://localhost:8080'))
    throw new Error(
      'no Kubernetes cluster configured: set KUBECONFIG (or provide ~/.kube/config), or run in a pod with a service account',
    );
  return kc;
}

/** A KubeConfig that talks to one API server address (tests, or an explicit server). */
export function kubeConfigForServer(server: string, token?: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'cluster', server, skipTLSVerify: true }],
    users: [{ name: 'user', ...(token ? { token } : {}) }],
    contexts: [{ name: 'context', cluster: 'cluster', user: 'user' }],
    currentContext: 'context',
  });
  return kc;
}

export function makeClients(config: KubeConfig): KubeClients {
  return {
    config,
    core: config.makeApiClient(CoreV1Api),
    custom: config.makeApiClient(CustomObjectsApi),
    coordination: config.makeApiClient(CoordinationV1Api),
  };
}

/**
 * Options for a patch call sent as a JSON merge patch (RFC 7386). The generated client otherwise picks
 * `application/json-patch+json`; the header middleware runs after the request is built, so it wins.
 */
export const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

/** HTTP status of a failed API call, or undefined for a network error. */
export function statusOf(err: unknown): number | undefined {
  if (err instanceof ApiException) return err.code;
  const code = (err as { statusCode?: unknown; code?: unknown } | null)?.statusCode;
  return typeof code === 'number' ? code : undefined;
}

export const isNotFound = (err: unknown) => statusOf(err) === 404;
export const isConflict = (err: unknown) => statusOf(err) === 409;

/** The message of a Kubernetes Status body, else of the error. */
export function kubeErrorMessage(err: unknown): string {
  if (err instanceof ApiException) {
    const body = err.body as unknown;
    let parsed: unknown = body;
    if (typeof body === 'string') {
      try {
        parsed = JSON.parse(body);
      } catch {
        return `${err.code}: ${body.slice(0, 200)}`;
      }
    }
    const message = (parsed as { message?: unknown } | null)?.message;
    return `${err.code}: ${typeof message === 'string' ? message : err.message}`;
  }
  return (err as Error)?.message ?? String(err);
}

/** Minimal shape of any Kubernetes object this operator reads. */
export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  deletionTimestamp?: string;
  finalizers?: string[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: Array<{ apiVersion: string; kind: string; name: string; uid: string }>;
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

export const keyOf = (o: { metadata: { namespace?: string; name: string } }) =>
  `${o.metadata.namespace ?? ''}/${o.metadata.name}`;

export function splitKey(key: string): { namespace: string; name: string } {
  const i = key.indexOf('/');
  return { namespace: key.slice(0, i), name: key.slice(i + 1) };
}
