import Fastify from 'fastify';
import { Pool } from 'undici';

/**
 * The floor any Node proxy pays on this machine: fastify parses the JSON body, undici forwards it over a
 * keep-alive pool, and the answer goes back (read whole when not streaming, piped when streaming).
 * No auth, no billing, no validation. `UPSTREAM` is the provider's base URL (…/v1).
 */
const upstream = new URL(process.env.UPSTREAM ?? 'http://127.0.0.1:8090/v1');
const pool = new Pool(upstream.origin, { connections: 256, pipelining: 1, keepAliveTimeout: 30_000 });
const path = `${upstream.pathname.replace(/\/+$/, '')}/chat/completions`;

const app = Fastify({ logger: false });
app.post('/v1/chat/completions', async (request, reply) => {
  const body = request.body as Record<string, unknown>;
  const res = await pool.request({
    path,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  reply
    .code(res.statusCode)
    .header('content-type', String(res.headers['content-type'] ?? 'application/json'));
  if (body.stream) return reply.send(res.body);
  return reply.send(await res.body.text());
});
await app.listen({ port: Number(process.env.PORT ?? 0), host: '127.0.0.1' });
const { port } = app.server.address() as { port: number };
process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}` })}\n`);
process.on('SIGTERM', () => {
  app.close().finally(() => process.exit(0));
});
