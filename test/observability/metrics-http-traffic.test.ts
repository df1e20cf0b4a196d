import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMetrics, scrape, sumOf } from '../helpers/metrics-text.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

describe('GET /metrics on the proxy', () => {
  let server: TestServer;
  let project: SeededProject;

  beforeAll(async () => {
    server = await startTestServer();
    project = await seedProject(server.ctx, {
      models: [{ id: 'm-req', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
  });
  afterAll(async () => {
    await server?.close();
  });

  it('serves the text format without an API key', async () => {
    const res = await fetch(`${server.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const samples = parseMetrics(await res.text());
    expect(sumOf(samples, 'tollgate_build_info')).toBe(1);
    expect(samples.some((s) => s.name === 'tollgate_process_cpu_seconds_total')).toBe(true);
    expect(samples.some((s) => s.name === 'tollgate_nodejs_eventloop_lag_seconds')).toBe(true);
  });

  it('is served outside /v1 only', async () => {
    const res = await api(server, project.apiKey, 'GET', '/v1/metrics');
    expect(res.status).toBe(404);
  });

  it('counts authenticated requests by project, route template, method and status', async () => {
    const where = { project: project.projectId, route: '/v1/models/*', method: 'GET' };
    const before = await scrape(server.url);
    const ok = await api(server, project.apiKey, 'GET', '/v1/models/m-req');
    expect(ok.status).toBe(200);
    const missing = await api(server, project.apiKey, 'GET', '/v1/models/nope');
    expect(missing.status).toBe(404);
    const after = await scrape(server.url);

    const delta = (labels: Record<string, string>) =>
      sumOf(after, 'tollgate_http_requests_total', labels) -
      sumOf(before, 'tollgate_http_requests_total', labels);
    expect(delta({ ...where, status: '200' })).toBe(1);
    expect(delta({ ...where, status: '404' })).toBe(1);
    // The model id stays out of the label: the route template is used.
    expect(after.some((s) => s.labels.route === '/v1/models/m-req')).toBe(false);

    const count = (samples: typeof before) =>
      sumOf(samples, 'tollgate_http_request_duration_seconds_count', where);
    expect(count(after) - count(before)).toBe(2);
    const sum = sumOf(after, 'tollgate_http_request_duration_seconds_sum', where);
    expect(sum).toBeGreaterThan(0);
    expect(sum).toBeLessThan(30);
  });

  it('counts unauthenticated and unknown requests without a project', async () => {
    const before = await scrape(server.url);
    expect((await api(server, 'tg_wrong', 'GET', '/v1/models')).status).toBe(401);
    expect((await api(server, undefined, 'GET', '/no/such/path')).status).toBe(404);
    const after = await scrape(server.url);
    const delta = (labels: Record<string, string>) =>
      sumOf(after, 'tollgate_http_requests_total', labels) -
      sumOf(before, 'tollgate_http_requests_total', labels);
    expect(delta({ project: '', route: '/v1/models', status: '401' })).toBe(1);
    expect(delta({ project: '', route: 'unmatched', status: '404' })).toBe(1);
    expect(after.some((s) => s.labels.route === '/no/such/path')).toBe(false);
  });
});
