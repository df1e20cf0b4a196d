import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, signUpAndIn, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Every end user id `/v1` accepts (up to 256 characters) is reachable as a path parameter of the admin
 * API and the dashboard (issue 22, item 8): fastify's default `maxParamLength` of 100 answered 414 to
 * ids of 101–256 characters, and percent-encoding makes a non-ASCII id up to nine times longer.
 */
let server: TestServer;
let token: string;
let projectId: string;
let apiKey: string;

beforeAll(async () => {
  server = await startTestServer();
  token = await signUpAndIn(server, {
    email: 'long-ids@example.com',
    password: 'a long enough password',
  });
  const created = await api(server, token, 'POST', '/admin/v1/projects', { name: 'Long ids' });
  projectId = created.body.project.id as string;
  apiKey = created.body.apiKey.key as string;
});
afterAll(async () => {
  await server?.close();
});

const IDS = {
  'ascii 101': 'u'.repeat(101),
  'ascii 256': 'x'.repeat(256),
  'three-byte UTF-8 256': '€'.repeat(256),
  'mixed 256 with reserved characters': 'a/b?c#d%e é€ '.repeat(19).slice(0, 256),
};

describe('long end user ids', () => {
  for (const [name, user] of Object.entries(IDS)) {
    it(`${name}: /v1, the admin API and the dashboard reach the same user`, async () => {
      expect(user.length).toBeGreaterThan(100);
      const deposited = await api(server, apiKey, 'POST', '/v1/user/balance/deposit', {
        user,
        amount: '1.50',
      });
      expect(deposited.status, JSON.stringify(deposited.body)).toBeLessThan(300);

      const enc = encodeURIComponent(user);
      const base = `/admin/v1/projects/${projectId}/users/${enc}`;
      const read = await api(server, token, 'GET', base);
      expect(read.status, JSON.stringify(read.body)).toBe(200);
      expect(read.body.balance).toBe('1.50');
      expect((await api(server, token, 'GET', `${base}/activity`)).status).toBe(200);
      expect((await api(server, token, 'POST', `${base}/deposit`, { amount: '0.50' })).status).toBe(201);
      expect((await api(server, token, 'POST', `${base}/connect`)).status).toBe(200);

      const cookie = `tollgate_session=${token}`;
      const page = await fetch(`${server.url}/dashboard/projects/${projectId}/users/${enc}`, {
        headers: { cookie },
        redirect: 'manual',
      });
      const text = await page.text();
      expect(page.status).toBe(200);
      expect(text).toContain('<strong id="balance">2.00</strong>');
      const csrf = /name="csrf" value="([^"]+)"/.exec(text)![1]!;
      const disconnect = await fetch(
        `${server.url}/dashboard/projects/${projectId}/users/${enc}/disconnect`,
        {
          method: 'POST',
          headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
          body: new URLSearchParams({ csrf }).toString(),
          redirect: 'manual',
        },
      );
      expect(disconnect.status).toBe(303);
      expect((await api(server, token, 'GET', base)).body.connected).toBe(false);
    });
  }

  it('an id longer than /v1 accepts is a 400 on the admin API, not a 414', async () => {
    const res = await api(server, token, 'GET', `/admin/v1/projects/${projectId}/users/${'€'.repeat(257)}`);
    expect(res.status).toBe(400);
    expect(res.body.error.param).toBe('user');
  });
});
