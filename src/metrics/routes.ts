import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CounterSeries, HistogramSeries } from './series.ts';

type HttpLabel = 'project' | 'route' | 'method' | 'status';
type DurationLabel = 'project' | 'route' | 'method';

/**
 * `GET /metrics` in Prometheus' text format (no API key: keep the port off the public ingress or let a
 * NetworkPolicy guard it), and the HTTP metrics of every route: one hook on the root instance records
 * `tollgate_http_requests_total` and `tollgate_http_request_duration_seconds` when a response ends
 * (for a stream, after its last byte).
 *
 * Registered on the root instance (the plugin skips fastify's encapsulation) so its hook sees `/v1` too.
 */
export async function metricsRoutes(app: FastifyInstance): Promise<void> {
  const metrics = app.ctx.metrics;

  // A callback hook (no promise per request), recording into series kept per label set
  // (./series.ts): as many as the metrics have label sets.
  const series = new Map<
    string,
    { requests: CounterSeries<HttpLabel>; duration: HistogramSeries<DurationLabel> }
  >();
  app.addHook('onResponse', (request: FastifyRequest, reply: FastifyReply, done: () => void) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const project = (request as { project?: { id: string } | null }).project?.id ?? '';
    const method = request.method;
    const status = reply.statusCode;
    const key = `${project}\u0000${route}\u0000${method}\u0000${status}`;
    let found = series.get(key);
    if (!found) {
      found = {
        requests: new CounterSeries(metrics.httpRequests, { project, route, method, status: String(status) }),
        duration: new HistogramSeries(metrics.httpRequestDuration, { project, route, method }),
      };
      series.set(key, found);
    }
    found.requests.inc();
    found.duration.observe(reply.elapsedTime / 1000);
    done();
  });

  app.get('/metrics', async (_request, reply) => {
    const body = await metrics.registry.metrics();
    reply.header('content-type', metrics.registry.contentType).header('cache-control', 'no-store');
    return body;
  });
}

// What fastify-plugin does: the hook above belongs to the instance that registers this plugin.
Object.assign(metricsRoutes, { [Symbol.for('skip-override')]: true });
