import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, signUpAndIn, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Editing one model keeps what the edit does not name (issue 22, item 4): the project's limits (rate
 * limits and spend caps) and every model's routes survive the admin API's `PUT …/models/{id}` and
 * `DELETE …/models/{id}`, the dashboard's price form and delete button, and the dashboard's pricing
 * text box, which shows the whole document so that applying it as shown changes nothing. (The CLI has
 * no partial model edit: `tollgate models apply` takes the whole file.)
 */
let server: TestServer;
let token: string;

const LIMITS = { user: { rpm: 2 }, spend: { daily: '0.01' } };
const ROUTES_A = [
  { provider: 'default', model: 'up-a', priority: 0 },
  { provider: 'backup', model: 'up-a2', priority: 1, weight: 2 },
];
const ROUTES_B = [{ provider: 'backup', model: 'up-b' }];

beforeAll(async () => {
  server = await startTestServer();
  token = await signUpAndIn(server, {
    email: 'pricing-edits@example.com',
    password: 'a long enough password',
  });
});
afterAll(async () => {
  await server?.close();
});

/** A project whose pricing has limits, two models with routes and a third model without. */
async function pricedProject(name: string): Promise<string> {
  const created = await api(server, token, 'POST', '/admin/v1/projects', { name });
  const projectId = created.body.project.id as string;
  const applied = await api(server, token, 'PUT', `/admin/v1/projects/${projectId}/models`, {
    currency: 'usd',
    limits: LIMITS,
    models: [
      { id: 'a', routes: ROUTES_A, pricing: { mode: 'per_request', perRequest: '0.01' } },
      { id: 'b', routes: ROUTES_B, pricing: { mode: 'per_request', perRequest: '0.02' } },
      { id: 'c', upstreamModel: 'up-c', pricing: { mode: 'per_request', perRequest: '0.03' } },
    ],
  });
  expect(applied.status, JSON.stringify(applied.body)).toBe(200);
  return projectId;
}

async function pricing(projectId: string) {
  const res = await api(server, token, 'GET', `/admin/v1/projects/${projectId}/models`);
  expect(res.status).toBe(200);
  return res.body as { limits?: unknown; models: Array<{ id: string; routes?: unknown; pricing: any }> };
}

/** Limits and the routes of every model still there are as first applied. */
async function expectKept(projectId: string) {
  const p = await pricing(projectId);
  expect(p.limits).toEqual(LIMITS);
  const row = await server.ctx.db
    .selectFrom('projects')
    .select('limits')
    .where('id', '=', projectId)
    .executeTakeFirstOrThrow();
  expect(row.limits).toEqual(LIMITS);
  const routes = Object.fromEntries(p.models.map((m) => [m.id, m.routes]));
  if ('a' in routes) expect(routes.a).toEqual(ROUTES_A);
  if ('b' in routes) expect(routes.b).toEqual(ROUTES_B);
  if ('c' in routes) expect(routes.c).toBeUndefined();
  return p;
}

/** A dashboard session on the admin API's session token, with the CSRF token of its pages. */
function dashboard(projectId: string) {
  const cookie = `tollgate_session=${token}`;
  const path = `/dashboard/projects/${projectId}/pricing`;
  const get = async () => {
    const res = await fetch(server.url + path, { headers: { cookie }, redirect: 'manual' });
    expect(res.status).toBe(200);
    return res.text();
  };
  const post = async (to: string, form: Record<string, string>) => {
    const page = await get();
    const csrf = /name="csrf" value="([^"]+)"/.exec(page)![1]!;
    const res = await fetch(server.url + to, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf, ...form }).toString(),
      redirect: 'manual',
    });
    const location = res.headers.get('location') ?? '';
    await res.text();
    return { status: res.status, location: decodeURIComponent(location) };
  };
  return { path, get, post };
}

describe('editing one model keeps limits and routes', () => {
  it('the listing is the whole document: routes and limits included', async () => {
    const projectId = await pricedProject('Listing');
    await expectKept(projectId);
  });

  it('admin API: PUT …/models/{id} of another model, of a routed model, and of a new model', async () => {
    const projectId = await pricedProject('Put');
    const put = (id: string, body: unknown) =>
      api(server, token, 'PUT', `/admin/v1/projects/${projectId}/models/${id}`, body);
    expect((await put('c', { pricing: { mode: 'per_request', perRequest: '0.05' } })).status).toBe(200);
    // The edited model keeps its own routes when the edit does not name them.
    expect((await put('a', { pricing: { mode: 'per_request', perRequest: '0.04' } })).status).toBe(200);
    expect((await put('d', { pricing: { mode: 'per_request', perRequest: '0.06' } })).status).toBe(200);
    const p = await expectKept(projectId);
    expect(p.models.map((m) => [m.id, m.pricing.perRequest])).toEqual([
      ['a', '0.04'],
      ['b', '0.02'],
      ['c', '0.05'],
      ['d', '0.06'],
    ]);
    // Routes named by the edit replace the model's routes.
    const newRoutes = [{ provider: 'default', model: 'up-b-new' }];
    expect(
      (await put('b', { routes: newRoutes, pricing: { mode: 'per_request', perRequest: '0.02' } })).status,
    ).toBe(200);
    const after = await pricing(projectId);
    expect(after.models.find((m) => m.id === 'b')!.routes).toEqual(newRoutes);
    expect(after.models.find((m) => m.id === 'a')!.routes).toEqual(ROUTES_A);
    expect(after.limits).toEqual(LIMITS);
  });

  it('admin API: DELETE …/models/{id}, down to the last model', async () => {
    const projectId = await pricedProject('Delete');
    const del = (id: string) => api(server, token, 'DELETE', `/admin/v1/projects/${projectId}/models/${id}`);
    expect((await del('c')).status).toBe(200);
    expect((await pricing(projectId)).models.map((m) => m.id)).toEqual(['a', 'b']);
    await expectKept(projectId);
    expect((await del('b')).status).toBe(200);
    await expectKept(projectId);
    expect((await del('a')).status).toBe(200);
    const p = await expectKept(projectId);
    expect(p.models).toEqual([]);
  });

  it('admin API: concurrent edits of different models all stay (one transaction per edit)', async () => {
    const projectId = await pricedProject('Concurrent');
    const ids = Array.from({ length: 8 }, (_, i) => `n${i}`);
    const results = await Promise.all([
      ...ids.map((id, i) =>
        api(server, token, 'PUT', `/admin/v1/projects/${projectId}/models/${id}`, {
          pricing: { mode: 'per_request', perRequest: `0.0${i + 1}` },
        }),
      ),
      api(server, token, 'DELETE', `/admin/v1/projects/${projectId}/models/c`),
    ]);
    for (const r of results) expect(r.status, JSON.stringify(r.body)).toBe(200);
    const p = await expectKept(projectId);
    expect(p.models.map((m) => m.id)).toEqual(['a', 'b', ...ids]);
  });

  it('dashboard: the price form and the delete button', async () => {
    const projectId = await pricedProject('Dashboard form');
    const d = dashboard(projectId);
    const saved = await d.post(d.path, { model: 'a', mode: 'per_request', perRequest: '0.07' });
    expect(saved.status).toBe(303);
    expect(saved.location).toContain('done=price_saved');
    const added = await d.post(d.path, { model: 'e', mode: 'per_token', inputPerMillion: '1' });
    expect(added.location).toContain('done=price_saved');
    let p = await expectKept(projectId);
    expect(p.models.find((m) => m.id === 'a')!.pricing).toEqual({ mode: 'per_request', perRequest: '0.07' });
    const deleted = await d.post(`${d.path}/c/delete`, {});
    expect(deleted.location).toContain('done=model_deleted');
    p = await expectKept(projectId);
    expect(p.models.map((m) => m.id)).toEqual(['a', 'b', 'e']);
  });

  it('dashboard: the pricing text box shows routes and limits, and applying it as shown keeps them', async () => {
    const projectId = await pricedProject('Dashboard file');
    const d = dashboard(projectId);
    const page = await d.get();
    const file = /<textarea id="file" name="file"[^>]*>([\s\S]*?)<\/textarea>/.exec(page)![1]!;
    const text = file
      .replace(/&quot;/g, '"')
      .replace(/&#39;/g, "'")
      .replace(/&lt;/g, '<')
      .replace(/&gt;/g, '>')
      .replace(/&amp;/g, '&');
    expect(text).toContain('limits:');
    expect(text).toContain('daily: "0.01"');
    expect(text).toContain('routes:');
    expect(text).toContain('up-a2');
    const applied = await d.post(`${d.path}/file`, { file: text });
    expect(applied.location).toContain('done=pricing_applied');
    const p = await expectKept(projectId);
    expect(p.models.map((m) => m.id)).toEqual(['a', 'b', 'c']);
  });
});
