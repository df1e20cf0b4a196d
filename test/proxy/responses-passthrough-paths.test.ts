import { createServer, type Server } from 'node:http';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * `/v1/responses/*` passes through only the Responses API's own sub-resources (issue 22, item 2):
 * GET and DELETE `/responses/{id}`, POST `/responses/{id}/cancel`, GET `/responses/{id}/input_items`.
 * Dot segments (raw or percent-encoded), encoded slashes and backslashes never reach the provider — a
 * provider that resolves `..` would otherwise serve `/chat/completions` unmetered, or `/files` with the
 * project's key. Requests go over a raw socket so the path is sent exactly as written.
 */
let server: TestServer;
let provider: Server;
let project: SeededProject;
const seen: string[] = [];

beforeAll(async () => {
  provider = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'resp_1', object: 'response', path: req.url }));
  });
  await new Promise<void>((resolve) => provider.listen(0, '127.0.0.1', resolve));
  server = await startTestServer();
  project = await seedProject(server.ctx, {
    upstreamUrl: `http://127.0.0.1:${(provider.address() as { port: number }).port}/v1`,
  });
});
afterAll(async () => {
  await server?.close();
  provider?.closeAllConnections();
  await new Promise((resolve) => provider?.close(resolve));
});

/** One request with the path as written (no client normalises it); the status code. */
function raw(method: string, path: string, body?: string): Promise<number> {
  const { port } = new URL(server.url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1');
    let data = '';
    socket.setTimeout(10_000, () => socket.destroy(new Error(`no answer to ${method} ${path}`)));
    socket.on('data', (chunk) => {
      data += chunk.toString('latin1');
    });
    socket.on('error', reject);
    socket.on('close', () => {
      const status = /^HTTP\/1\.1 (\d{3})/.exec(data);
      if (status) resolve(Number(status[1]));
      else reject(new Error(`no status line for ${method} ${path}: ${JSON.stringify(data.slice(0, 200))}`));
    });
    const headers = [
      `${method} ${path} HTTP/1.1`,
      'Host: 127.0.0.1',
      `Authorization: Bearer ${project.apiKey}`,
      'Connection: close',
      ...(body !== undefined
        ? ['Content-Type: application/json', `Content-Length: ${Buffer.byteLength(body)}`]
        : []),
    ];
    socket.write(`${headers.join('\r\n')}\r\n\r\n${body ?? ''}`);
  });
}

describe('/v1/responses passthrough', () => {
  it('refuses dot segments, encoded slashes and backslashes, and reaches nothing', async () => {
    const chat = JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }] });
    const attempts: Array<[string, string, string?]> = [
      ['POST', '/v1/responses/../chat/completions', chat],
      ['POST', '/v1/responses/%2e%2e/chat/completions', chat],
      ['GET', '/v1/responses/../files'],
      ['GET', '/v1/responses/./x'],
      ['GET', '/v1/responses/..'],
      ['GET', '/v1/responses/.'],
      ['GET', '/v1/responses/%2e%2e'],
      ['GET', '/v1/responses/%2E%2E'],
      ['GET', '/v1/responses/%2E.'],
      ['GET', '/v1/responses/.%2e'],
      ['GET', '/v1/responses/%2e'],
      ['GET', '/v1/responses/%2e%2e/files'],
      ['GET', '/v1/responses/..%2ffiles'],
      ['GET', '/v1/responses/..%2Ffiles'],
      ['GET', '/v1/responses/a%2f..%2f..%2ffiles'],
      ['GET', '/v1/responses/%2e%2e%2f%2e%2e%2ffiles'],
      ['GET', '/v1/responses/..\\files'],
      ['GET', '/v1/responses/%5c..%5cfiles'],
      ['GET', '/v1/responses/..%5cfiles'],
      ['GET', '/v1/responses/%252e%252e/files'],
      ['GET', '/v1/responses/resp_1/../../files'],
      ['GET', '/v1/responses/resp_1/%2e%2e/%2e%2e/files'],
      ['GET', '/v1/responses/resp_1/input_items/../../../files'],
    ];
    for (const [method, path, body] of attempts) {
      const status = await raw(method, path, body);
      expect([400, 404], `${method} ${path} → ${status}`).toContain(status);
    }
    expect(seen).toEqual([]);
  });

  it('passes only the Responses API’s own methods and sub-resources', async () => {
    const refused: Array<[string, string]> = [
      ['PUT', '/v1/responses/resp_1'],
      ['PATCH', '/v1/responses/resp_1'],
      ['POST', '/v1/responses/resp_1'],
      ['GET', '/v1/responses/resp_1/cancel'],
      ['DELETE', '/v1/responses/resp_1/cancel'],
      ['POST', '/v1/responses/resp_1/input_items'],
      ['GET', '/v1/responses/resp_1/other'],
      ['GET', '/v1/responses/resp_1/input_items/x'],
    ];
    for (const [method, path] of refused) {
      const status = await raw(method, path, method === 'GET' || method === 'DELETE' ? undefined : '{}');
      expect([400, 404, 405], `${method} ${path} → ${status}`).toContain(status);
    }
    expect(seen).toEqual([]);

    expect(await raw('GET', '/v1/responses/resp_1')).toBe(200);
    expect(await raw('DELETE', '/v1/responses/resp_1')).toBe(200);
    expect(await raw('POST', '/v1/responses/resp_1/cancel', '{}')).toBe(200);
    expect(await raw('GET', '/v1/responses/resp_1/input_items?limit=2&order=asc')).toBe(200);
    expect(seen).toEqual([
      'GET /v1/responses/resp_1',
      'DELETE /v1/responses/resp_1',
      'POST /v1/responses/resp_1/cancel',
      'GET /v1/responses/resp_1/input_items?limit=2&order=asc',
    ]);
  });
});
