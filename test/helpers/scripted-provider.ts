import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * A loopback provider whose every answer a test writes: a handler per upstream model name (the `model`
 * of the request body), or per `METHOD path` (e.g. `GET /v1/responses/resp_1`), which wins. Unknown
 * requests get a 404.
 */
export type Handler = (body: any, res: http.ServerResponse, req: http.IncomingMessage) => void;

export interface ScriptedProvider {
  url: string;
  /** By upstream model name, or by `METHOD path`. */
  handlers: Map<string, Handler>;
  close(): Promise<void>;
}

export async function startScripted(): Promise<ScriptedProvider> {
  const handlers = new Map<string, Handler>();
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => {
      raw += c;
    });
    req.on('end', () => {
      const body = raw ? JSON.parse(raw) : {};
      const handler =
        handlers.get(`${req.method} ${(req.url ?? '').split('?')[0]}`) ?? handlers.get(String(body.model));
      if (!handler) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: `no script for ${req.method} ${req.url}` } }));
        return;
      }
      handler(body, res, req);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    handlers,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Answers JSON. */
export function json(res: http.ServerResponse, body: unknown, status = 200): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** Writes SSE events (`[name, data]`, name undefined for chat chunks), then ends, stalls or resets. */
export function sse(
  res: http.ServerResponse,
  events: Array<[string | undefined, unknown]>,
  then: 'end' | 'stall' | 'reset',
): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  for (const [name, data] of events) {
    res.write(
      `${name ? `event: ${name}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`,
    );
  }
  if (then === 'end') res.end();
  // (stall: the response stays open until the client goes; reset: the connection is cut mid-stream)
  else if (then === 'reset') setTimeout(() => res.socket?.destroy(), 50);
}
