import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';

export interface HealthServerOptions {
  port: number;
  host: string;
  registry: Registry;
  /** Ready: the process can do its job (database reachable); a follower is ready too. */
  ready(): Promise<{ ok: boolean; detail: Record<string, unknown> }>;
}

/** `/healthz` (the process is up), `/readyz` and `/metrics` on the operator's own port. */
export async function startHealthServer(
  options: HealthServerOptions,
): Promise<{ server: Server; port: number; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (status: number, type: string, body: string) => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'text/plain', 'method not allowed\n');
    if (path === '/healthz') return send(200, 'application/json', '{"status":"ok"}\n');
    if (path === '/readyz') {
      options.ready().then(
        ({ ok, detail }) =>
          send(
            ok ? 200 : 503,
            'application/json',
            `${JSON.stringify({ status: ok ? 'ready' : 'not ready', ...detail })}\n`,
          ),
        (err) =>
          send(
            503,
            'application/json',
            `${JSON.stringify({ status: 'not ready', error: (err as Error).message })}\n`,
          ),
      );
      return;
    }
    if (path === '/metrics') {
      options.registry.metrics().then(
        (text) => send(200, options.registry.contentType, text),
        (err) => send(500, 'text/plain', `${(err as Error).message}\n`),
      );
      return;
    }
    send(404, 'text/plain', 'not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  return {
    server,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
