import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * A client that trickles its request (a byte every 250 ms, never finishing the body) is answered 408
 * and cut within 1.5× REQUEST_TIMEOUT_MS, on every route — Stripe's webhook, `/v1/user/alerts`, a model
 * API — while a request that arrives whole within the time is served.
 */
let server: TestServer;
let apiKey: string;
const TIMEOUT_MS = 1500;

beforeAll(async () => {
  server = await startTestServer({ REQUEST_TIMEOUT_MS: String(TIMEOUT_MS) });
  ({ apiKey } = await seedProject(server.ctx));
});
afterAll(() => server.close());

/** Sends the head of a POST whose body never completes; resolves with what came back and when. */
function trickle(path: string): Promise<{ ms: number; answer: string }> {
  const { port } = new URL(server.url);
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket = connect(Number(port), '127.0.0.1');
    let answer = '';
    let drip: NodeJS.Timeout | undefined;
    const guard = setTimeout(() => {
      socket.destroy();
      reject(new Error(`${path}: still open after 10 s`));
    }, 10_000);
    socket.on('connect', () => {
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`,
      );
      drip = setInterval(() => socket.write(' '), 250);
    });
    socket.on('data', (chunk) => {
      answer += chunk.toString('utf8');
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearInterval(drip);
      clearTimeout(guard);
      resolve({ ms: performance.now() - started, answer });
    });
  });
}

describe('a request that trickles', () => {
  it('is answered 408 and closed within 1.5× REQUEST_TIMEOUT_MS, on every route', async () => {
    const results = await Promise.all(
      ['/payments/stripe/proj_x/webhook', '/v1/user/alerts', '/v1/chat/completions'].map(trickle),
    );
    for (const { ms, answer } of results) {
      expect(answer).toMatch(/^HTTP\/1\.1 408/);
      expect(ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
      expect(ms).toBeLessThan(TIMEOUT_MS * 1.5 + 3000); // (slack for a loaded machine)
    }
  });

  it('a whole request within the time is served', async () => {
    const res = await fetch(`${server.url}/healthz`);
    expect(res.status).toBe(200);
  });
});
