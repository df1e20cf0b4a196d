import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { eventually } from '../helpers/eventually.ts';
import { api, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Dashboard forms over HTTP, with a session from the admin API (the same session tokens): the webhook
 * page (add a subscription, see a failed delivery, resend it), the pricing file, and key revocation.
 */
let server: TestServer;
let worker: DeliveryWorker;
let receiver: Server;
let receiverUrl: string;
let hits = 0;
/** The event types the receiver was sent. */
const received: string[] = [];

beforeAll(async () => {
  server = await startTestServer({ WEBHOOK_POLL_INTERVAL_MS: '100', WEBHOOK_BACKOFF_BASE_MS: '50' });
  receiver = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (chunk: Buffer) => parts.push(chunk));
    req.on('end', () => {
      hits++;
      try {
        received.push(String(JSON.parse(Buffer.concat(parts).toString('utf8')).event.type));
      } catch {}
      // The first delivery is refused for good (410: no retry); the resend is accepted.
      res.writeHead(hits === 1 ? 410 : 200).end('ok');
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  receiverUrl = `http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`;
  worker = startDeliveryWorker(server.ctx);
  await worker.ready;
});
afterAll(async () => {
  await worker?.stop(1000);
  await new Promise((resolve) => receiver?.close(resolve));
  await server?.close();
});

describe('dashboard pages', () => {
  it('adds a webhook subscription, shows the delivery log and resends a delivery', async () => {
    const credentials = { email: 'pages@example.com', password: 'a long enough password' };
    expect((await api(server, undefined, 'POST', '/admin/v1/developers', credentials)).status).toBe(202);
    const signin = await api(server, undefined, 'POST', '/admin/v1/sessions', credentials);
    const token = signin.body.session.token as string;
    const cookie = `tollgate_session=${token}`;
    const project = (await api(server, token, 'POST', '/admin/v1/projects', { name: 'Pages' })).body;
    const projectId = project.project.id as string;
    const path = `/dashboard/projects/${projectId}`;

    const get = async (p: string) => {
      const res = await fetch(server.url + p, { headers: { cookie }, redirect: 'manual' });
      return { status: res.status, text: await res.text() };
    };
    const post = async (p: string, form: Record<string, string>) => {
      const page = await get(path);
      const csrf = /name="csrf" value="([^"]+)"/.exec(page.text)![1]!;
      const res = await fetch(server.url + p, {
        method: 'POST',
        headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ csrf, ...form }).toString(),
        redirect: 'manual',
      });
      return { status: res.status, location: res.headers.get('location'), text: await res.text() };
    };

    const added = await post(`${path}/webhooks`, { url: receiverUrl, events: 'balance.*, user.*' });
    expect(added.status).toBe(200);
    expect(added.text).toMatch(/id="webhook-secret">whsec_|id="webhook-secret">[A-Za-z0-9_-]{24,}/);

    await api(server, token, 'POST', `/admin/v1/projects/${projectId}/users/u1/deposit`, { amount: '2' });
    const failed = await eventually(async () => {
      const logs = await api(server, token, 'GET', `/admin/v1/projects/${projectId}/webhooks/logs`);
      return logs.body.data.find((d: { status: string }) => d.status === 'error');
    });
    const page = await get(`${path}/webhooks`);
    expect(page.text).toContain(receiverUrl);
    expect(page.text).toContain('balance.deposit.created');
    expect(page.text).toContain(`aria-label="Resend delivery ${failed.id}"`);

    const resent = await post(`${path}/webhooks/deliveries/${failed.id}/resend`, {});
    expect(resent.status).toBe(303);
    expect(resent.location).toBe(`${path}/webhooks?done=delivery_queued`);
    expect((await get(resent.location!)).text).toContain('Delivery queued to be sent again.');
    await eventually(async () => {
      const logs = await api(server, token, 'GET', `/admin/v1/projects/${projectId}/webhooks/logs`);
      return logs.body.data.find(
        (d: { id: string; status: string }) => d.id === failed.id && d.status === 'success',
      );
    });
    expect(hits).toBe(2);

    // The pricing file applies as `models apply` does; a bad one comes back as a message.
    const applied = await post(`${path}/pricing/file`, {
      file: 'currency: usd\nmodels:\n  - id: quick\n    pricing: { mode: per_request, perRequest: "0.05" }\n',
    });
    expect(applied.location).toBe(`${path}/pricing?done=pricing_applied`);
    expect((await get(`${path}/pricing`)).text).toContain('<code>quick</code>');
    // A bad one is a 400 page that says why; nothing changes.
    const bad = await post(`${path}/pricing/file`, { file: 'currency: eur\nmodels: []\n' });
    expect(bad.status).toBe(400);
    expect(bad.text).toContain('role="alert"');

    // A per-token price with a hold margin, one with its family's default, and a bad margin (issue 21).
    const perToken = { mode: 'per_token', inputPerMillion: '3', outputPerMillion: '15' };
    const priced = await post(`${path}/pricing`, {
      model: 'sonnet',
      upstreamModel: 'claude-sonnet-4-5',
      ...perToken,
      cacheWritePerMillion: '3.75',
      cacheWrite1hPerMillion: '6',
    });
    expect(priced.location).toBe(`${path}/pricing?done=price_saved`);
    await post(`${path}/pricing`, { model: 'own', upstreamModel: 'gpt-4o', ...perToken, holdMargin: '1.25' });
    // A bad margin is a 400 page naming the field; nothing changes.
    const refused = await post(`${path}/pricing`, { model: 'own', ...perToken, holdMargin: '0.8' });
    expect(refused.status).toBe(400);
    expect(refused.text).toMatch(/holdMargin[\s\S]*at least 1/);
    const pricingPage = await get(`${path}/pricing`);
    expect(pricingPage.text).toContain(
      '3 in / 15 out per 1M tokens (3.75 cache write, 6 1 h cache write); prompt estimate held × 1.3',
    );
    expect(pricingPage.text).toContain('3 in / 15 out per 1M tokens; prompt estimate held × 1.25');

    // Settings: saved through the same checks as the API.
    const saved = await post(`${path}/settings`, {
      name: 'Pages renamed',
      checkoutUrl: 'https://shop.example.com/topup',
      connectMessage: 'Please connect: {link}',
    });
    expect(saved.location).toBe(`${path}?done=settings_saved`);
    const view = await api(server, token, 'GET', `/admin/v1/projects/${projectId}`);
    expect(view.body).toMatchObject({
      name: 'Pages renamed',
      settings: { checkoutUrl: 'https://shop.example.com/topup', connectMessage: 'Please connect: {link}' },
    });
    const badUrl = await post(`${path}/settings`, { name: 'x', returnUrl: 'javascript:alert(1)' });
    expect(badUrl.status).toBe(400);
    expect(badUrl.text).toMatch(/<p class="field-error" id="returnUrl-error">Return URL [^<]+<\/p>/);

    // Admin tokens for the CLI: created (shown once) and revoked from the projects page.
    const made = await post('/dashboard/admin-tokens', { name: 'laptop' });
    const adminToken = /id="admin-token">(tga_[^<]+)</.exec(made.text)![1]!;
    expect((await api(server, adminToken, 'GET', '/admin/v1/projects')).body.data[0].id).toBe(projectId);
    const tokenId = (await api(server, token, 'GET', '/admin/v1/admin-tokens')).body.data[0].id;
    expect((await get('/dashboard')).text).toContain('laptop');
    await post(`/dashboard/admin-tokens/${tokenId}/revoke`, {});
    expect((await api(server, adminToken, 'GET', '/admin/v1/projects')).status).toBe(401);

    // Revoking a key from the dashboard stops it at once.
    expect((await api(server, project.apiKey.key, 'GET', '/v1/models')).status).toBe(200);
    await post(`${path}/keys/${project.apiKey.id}/revoke`, {});
    expect((await api(server, project.apiKey.key, 'GET', '/v1/models')).status).toBe(401);

    // Credit granted from the user page: the API's rules, shown on the page, and its event delivered.
    const granted = await post(`${path}/users/credits`, {
      user: 'u1',
      amount: '1.50',
      reason: 'goodwill',
      priority: '2',
      expiresAt: '2099-01-31',
    });
    expect(granted.location).toBe(`${path}/users/u1?done=credit_granted`);
    const userPage = (await get(granted.location!)).text;
    expect(userPage).toContain('Credit granted.');
    expect(userPage).toMatch(
      /<td data-label="Reason"><div>goodwill<\/div><\/td><td class="num" data-label="Amount"><div>1.50<\/div><\/td><td class="num" data-label="Left"><div>1.50<\/div><\/td><td data-label="Priority"><div>2<\/div><\/td><td data-label="Expires \(UTC\)"><div>2099-01-31 23:59<\/div><\/td>/,
    );
    expect(userPage).toContain('credits 1.50');
    const badGrant = await post(`${path}/users/credits`, { user: 'u1', amount: '1', reason: 'Free Money' });
    expect(badGrant.status).toBe(400);
    // A pricing a Kubernetes PriceList declares is read-only here: a notice, no forms.
    await server.ctx.db
      .updateTable('projects')
      .set({ pricing_managed_by: 'PriceList tollgate/pages-prices' })
      .where('id', '=', projectId)
      .execute();
    const managedPage = (await get(`${path}/pricing`)).text;
    expect(managedPage).toContain(
      'declared by the Kubernetes resource <code>PriceList tollgate/pages-prices</code>',
    );
    expect(managedPage).not.toContain('Save the price');
    expect(managedPage).not.toContain('Apply the pricing file');
    expect(managedPage).not.toContain('aria-label="Delete model');
    const refusedEdit = await post(`${path}/pricing`, {
      model: 'x',
      mode: 'per_request',
      perRequest: '0.01',
    });
    expect(refusedEdit.status).toBe(409);
    await eventually(async () => received.includes('balance.credit.granted')).catch((err) => {
      throw new Error(`${err.message}: received ${JSON.stringify(received)}`);
    });
  }, 60_000);
});
