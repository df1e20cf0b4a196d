import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ECHO_UPSTREAM } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import {
  prometheusAvailable,
  type RunningPrometheus,
  startPrometheus,
  type VectorResult,
} from '../helpers/prometheus.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * A real Prometheus server (the Debian package's /usr/bin/prometheus) scrapes the proxy's /metrics on
 * loopback every second; the test reads a metric back through Prometheus' HTTP API.
 */
const available = prometheusAvailable('metrics-prometheus-scrape');

describe.skipIf(!available)('a real Prometheus scraping /metrics', () => {
  let server: TestServer;
  let project: SeededProject;
  let prometheus: RunningPrometheus | undefined;
  const query = (promql: string) => prometheus!.query(promql);

  /** Polls a PromQL query until `accept` holds for its result (bounded: 45 s). */
  async function until(promql: string, accept: (r: VectorResult[]) => boolean): Promise<VectorResult[]> {
    const deadline = Date.now() + 45_000;
    let last: VectorResult[] = [];
    while (Date.now() < deadline) {
      if (prometheus!.exited()) throw new Error(`prometheus exited early:\n${prometheus!.log()}`);
      last = await query(promql);
      if (accept(last)) return last;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(
      `no accepted result for ${promql} within 45 s; last: ${JSON.stringify(last)}\n${prometheus!.log()}`,
    );
  }

  beforeAll(async () => {
    server = await startTestServer();
    project = await seedProject(server.ctx, {
      upstreamUrl: ECHO_UPSTREAM,
      models: [{ id: 'm-req', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    const ref = (await server.ctx.projects.get(project.projectId))!;
    await connectUser(server.ctx.db, server.ctx.events, ref, 'prom-user', {
      source: 'test',
      actorType: 'admin',
      actorId: 'test',
    });
    prometheus = await startPrometheus(new URL(server.url).host);
  });

  afterAll(async () => {
    await prometheus?.stop();
    await server?.close();
  });

  it('scrapes the proxy and answers PromQL over metering counters that moved with chat traffic', async () => {
    const deposit = { user: 'prom-user', amount: '1.00' };
    expect((await api(server, project.apiKey, 'POST', '/v1/user/balance/deposit', deposit)).status).toBe(201);
    const chat = () =>
      api(server, project.apiKey, 'POST', '/v1/chat/completions', {
        model: 'm-req',
        user: 'prom-user',
        messages: [{ role: 'user', content: 'Hello' }],
      });
    for (let i = 0; i < 3; i++) expect((await chat()).status).toBe(200);

    const up = await until('up{job="tollgate"}', (r) => r.length === 1 && r[0]!.value[1] === '1');
    expect(up[0]!.metric.instance).toBe(new URL(server.url).host);

    const served = `tollgate_requests_total{project="${project.projectId}",decision="allowed",outcome="success"}`;
    const result = await until(served, (r) => r.length === 1 && r[0]!.value[1] === '3');
    expect(result[0]!.metric).toMatchObject({ job: 'tollgate', model: 'm-req', stream: 'false' });

    // More traffic shows up in a later scrape.
    expect((await chat()).status).toBe(200);
    await until(served, (r) => r[0]?.value[1] === '4');

    // The README's queries: revenue per model, tokens per project.
    const revenue = await until(
      'sum by (project, model, currency) (tollgate_charged_amount_total{source="chat"})',
      (r) => r.length === 1 && Number(r[0]!.value[1]) > 0.0399,
    );
    expect(revenue[0]!.metric).toEqual({ project: project.projectId, model: 'm-req', currency: 'usd' });
    expect(Number(revenue[0]!.value[1])).toBeCloseTo(0.04, 9);
    const deposited = await query(`tollgate_deposited_amount_total{project="${project.projectId}"}`);
    expect(Number(deposited[0]?.value[1])).toBe(1);
    const tokens = await query(
      'sum by (project) (tollgate_input_tokens_total + tollgate_output_tokens_total)',
    );
    expect(Number(tokens[0]?.value[1])).toBeGreaterThan(0);

    // Default process metrics come through with the prefix, and no series is labelled by end user.
    const cpu = await query('tollgate_process_cpu_seconds_total{job="tollgate"}');
    expect(cpu.length).toBe(1);
    const userLabelled = await query('{job="tollgate", user!=""}');
    expect(userLabelled).toEqual([]);
    const userValued = await query('{job="tollgate", project="prom-user"}');
    expect(userValued).toEqual([]);
  }, 120_000);
});
