import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';

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

  // (A callback hook: no promise per request.)
  app.addHook('onResponse', (request: FastifyRequest, reply: FastifyReply, done: () => void) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const project = (request as { project?: { id: string } | null }).project?.id ?? '';
    metrics.httpRequests.inc({ project, route, method: request.method, status: String(reply.statusCode) });
    metrics.httpRequestDuration.observe({ project, route, method: request.method }, reply.elapsedTime / 1000);
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
