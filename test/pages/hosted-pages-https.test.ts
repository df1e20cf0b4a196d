import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Every HTML page served over https carries Strict-Transport-Security, as the dashboard's do: the
 * hosted connect, top-up, done and portal pages too (https as the client reached it, behind the
 * trusted proxy that terminates TLS).
 */
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer({ TOLLGATE_TRUSTED_PROXIES: '1' });
});
afterAll(() => server.close());

const page = (path: string, proto: 'https' | 'http') =>
  fetch(`${server.url}${path}`, { headers: { 'x-forwarded-proto': proto } });

describe('HTML pages over https', () => {
  it('send HSTS: hosted pages (connect, top-up, done, portal), the home page and the dashboard', async () => {
    for (const path of [
      '/connect/x.y',
      '/topup/x.y',
      '/payments/done/x.y',
      '/portal/x.y',
      '/',
      '/dashboard/signin',
    ]) {
      const res = await page(path, 'https');
      expect(res.headers.get('content-type'), path).toMatch(/^text\/html/);
      expect(res.headers.get('strict-transport-security'), path).toMatch(/^max-age=31536000/);
      await res.arrayBuffer();
    }
  });

  it('a hosted page over plain http has none (a browser would ignore it)', async () => {
    const res = await page('/connect/x.y', 'http');
    expect(res.headers.get('strict-transport-security')).toBeNull();
    await res.arrayBuffer();
  });
});
