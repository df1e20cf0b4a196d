import families from './route-families.json' with { type: 'json' };

/**
 * Every URL Tollgate serves belongs to one family of paths (route-families.json), the one list both the
 * server and the Helm chart read (charts/tollgate/files/route-families.json is a link to it):
 * - `public`: what end users, their apps and payment providers reach — the API, the hosted pages, the
 *   payment webhooks and done pages, the portal, the home page and the docs. The chart's ingress routes
 *   all of them;
 * - `dashboard` and `admin`: for developers and operators, routed by the ingress only when its values
 *   say so (`ingress.dashboard`, `ingress.admin`), optionally on their own host;
 * - `internal`: probes and metrics, never routed by the ingress.
 * The server refuses to register a route outside every family (`familyOf`), so a new public route
 * cannot be forgotten by the chart.
 */
export type RouteFamily = keyof typeof families;

export interface FamilyPath {
  path: string;
  /** Kubernetes' Ingress path types: `Prefix` matches whole segments, `Exact` the path alone. */
  pathType: 'Prefix' | 'Exact';
}

export const ROUTE_FAMILIES = families as Record<RouteFamily, FamilyPath[]>;

/** Whether an ingress path matches a URL path, as Kubernetes matches them (segment-wise prefixes). */
export function pathMatches(entry: FamilyPath, url: string): boolean {
  const path = url.split('?')[0]!;
  if (entry.pathType === 'Exact') return path === entry.path;
  if (entry.path === '/') return true;
  return path === entry.path || path.startsWith(`${entry.path}/`);
}

/** The family of a URL (a route's, its parameters as they are); undefined when none has it. */
export function familyOf(url: string): RouteFamily | undefined {
  for (const family of Object.keys(ROUTE_FAMILIES) as RouteFamily[]) {
    if (ROUTE_FAMILIES[family].some((entry) => pathMatches(entry, url))) return family;
  }
  return undefined;
}
