import { readFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ECHO_UPSTREAM } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import {
  prometheusAvailable,
  type RunningPrometheus,
  startPrometheus,
  type VectorResult,
} from '../helpers/prometheus.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * The Grafana dashboard the chart ships (charts/tollgate/dashboards/tollgate.json): every panel's PromQL,
 * with Grafana's variables filled in, returns data from a real Prometheus (the Debian package) scraping
 * a Tollgate under traffic: served, refused, streamed and failing chat requests, deposits, and webhook
 * deliveries sent by the delivery worker (one receiver answers 200, one 503 so a backlog stays).
 * No Kubernetes API is here, so the operator's leader gauge is set as the operator sets it on taking
 * the Lease.
 */
const available = prometheusAvailable('grafana-dashboard');

interface Target {
  expr: string;
  refId: string;
}
interface Panel {
  type: string;
  title: string;
  datasource?: { type: string; uid: string };
  targets?: Target[];
  panels?: Panel[];
}
interface Dashboard {
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; type: string }[] };
}
const dashboard = JSON.parse(
  readFileSync(join(import.meta.dirname, '../../charts/tollgate/dashboards/tollgate.json'), 'utf8'),
) as Dashboard;
const panels = dashboard.panels.flatMap((p) => (p.type === 'row' ? (p.panels ?? []) : [p]));

/** Grafana's variables as a dashboard user would have them: every project, a short rate window. */
function fill(expr: string): string {
  return expr
    .replaceAll('$__rate_interval', '30s')
    .replaceAll('$__range', '10m')
    .replaceAll('$__interval', '5s')
    .replaceAll('$project', '.*');
}

describe('the Grafana dashboard', () => {
  it('has the panels the issue asks for, each on the Prometheus data source variable', () => {
    const titles = panels.map((p) => p.title);
    for (const title of [
      'Chat requests by decision',
      'Tokens per second by model',
      'Revenue per hour by model',
      'Holds open',
      'Latency Tollgate adds (p50, p95, p99)',
      'Upstream errors by reason',
      'Webhook backlog',
      'Age of the oldest pending delivery',
      'Operator replicas leading',
    ]) {
      expect(titles).toContain(title);
    }
    expect(dashboard.templating.list.map((v) => v.name)).toEqual(['datasource', 'project']);
    for (const p of panels) {
      // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable, not a template string
      expect(p.datasource, p.title).toEqual({ type: 'prometheus', uid: '${datasource}' });
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
      for (const t of p.targets ?? []) expect(t.expr, p.title).toMatch(/tollgate_/);
    }
  });
});

describe.skipIf(!available)('every dashboard query against a real Prometheus', () => {
  let server: TestServer;
  let paying: SeededProject;
  let failing: SeededProject;
  let worker: DeliveryWorker | undefined;
  let receiver: http.Server | undefined;
  let prometheus: RunningPrometheus | undefined;
  let traffic: NodeJS.Timeout | undefined;
  const trigger = { source: 'test', actorType: 'admin', actorId: 'test' };

  const query = (promql: string) => prometheus!.query(promql);

  beforeAll(async () => {
    server = await startTestServer();
    paying = await seedProject(server.ctx, {
      upstreamUrl: ECHO_UPSTREAM,
      models: [
        { id: 'dash-tok', pricing: { mode: 'per_token', inputPerMillion: '100', outputPerMillion: '200' } },
        { id: 'dash-req', pricing: { mode: 'per_request', perRequest: '0.01' } },
      ],
    });
    // Nothing listens on port 9: every call to this provider fails with a connection error.
    failing = await seedProject(server.ctx, {
      upstreamUrl: 'http://127.0.0.1:9/v1',
      models: [{ id: 'dash-down', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    for (const [project, user] of [
      [paying, 'payer'],
      [paying, 'poor'],
      [failing, 'payer'],
    ] as const) {
      const ref = (await server.ctx.projects.get(project.projectId))!;
      await connectUser(server.ctx.db, server.ctx.events, ref, user, trigger);
    }
    for (const project of [paying, failing]) {
      const deposit = { user: 'payer', amount: '1000.00' };
      expect((await api(server, project.apiKey, 'POST', '/v1/user/balance/deposit', deposit)).status).toBe(
        201,
      );
    }

    // Webhooks: /ok answers 200, /busy 503 (retried later, so deliveries stay pending).
    receiver = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.statusCode = req.url === '/ok' ? 200 : 503;
        res.end();
      });
    });
    await new Promise<void>((resolve) => receiver!.listen(0, '127.0.0.1', resolve));
    const receiverUrl = `http://127.0.0.1:${(receiver.address() as net.AddressInfo).port}`;
    for (const path of ['/ok', '/busy']) {
      const sub = { url: receiverUrl + path, events: ['balance.*'] };
      expect((await api(server, paying.apiKey, 'POST', '/v1/webhooks/subscriptions', sub)).status).toBe(201);
    }
    worker = startDeliveryWorker(server.ctx, { pollIntervalMs: 100, statsIntervalMs: 200 });
    await worker.ready;
    server.ctx.metrics.leader.set(1);

    // Traffic until the end of the test: every kind of request the panels count.
    const chat = (project: SeededProject, model: string, user: string, stream = false) =>
      api(server, project.apiKey, 'POST', '/v1/chat/completions', {
        model,
        user,
        stream,
        ...(stream ? { stream_options: { include_usage: true } } : {}),
        messages: [{ role: 'user', content: 'How many tokens is this?' }],
      });
    let busy = false;
    traffic = setInterval(() => {
      if (busy) return;
      busy = true;
      void Promise.all([
        chat(paying, 'dash-tok', 'payer'),
        chat(paying, 'dash-tok', 'payer', true),
        chat(paying, 'dash-req', 'payer'),
        chat(paying, 'dash-req', 'poor'),
        chat(paying, 'dash-req', 'stranger'),
        chat(failing, 'dash-down', 'payer'),
        api(server, paying.apiKey, 'POST', '/v1/user/balance/deposit', { user: 'payer', amount: '0.01' }),
      ]).finally(() => {
        busy = false;
      });
    }, 250);

    prometheus = await startPrometheus(new URL(server.url).host);
  }, 60_000);

  afterAll(async () => {
    if (traffic) clearInterval(traffic);
    await prometheus?.stop();
    await worker?.stop(1000);
    receiver?.closeAllConnections();
    await new Promise((resolve) => receiver?.close(resolve));
    await server?.close();
  }, 60_000);

  it('returns data, with a number, for every query of every panel', async () => {
    const targets = panels.flatMap((p) =>
      (p.targets ?? []).map((t) => ({ panel: p.title, expr: fill(t.expr) })),
    );
    const pending = new Map(targets.map((t) => [`${t.panel} / ${t.expr}`, t.expr]));
    const last = new Map<string, VectorResult[]>();
    const deadline = Date.now() + 90_000;
    while (pending.size > 0 && Date.now() < deadline) {
      if (prometheus!.exited()) throw new Error(`prometheus exited early:\n${prometheus!.log()}`);
      for (const [key, expr] of pending) {
        const result = await query(expr);
        last.set(key, result);
        if (result.some((r) => Number.isFinite(Number(r.value[1])))) pending.delete(key);
      }
      if (pending.size > 0) await new Promise((r) => setTimeout(r, 1000));
    }
    const missing = [...pending.keys()].map((k) => `${k}\n    last: ${JSON.stringify(last.get(k) ?? [])}`);
    expect(missing, `queries without data after 90 s:\n${missing.join('\n')}`).toEqual([]);

    // A few values that must be what the traffic made them.
    const leaders = await query(fill('sum(tollgate_operator_leader)'));
    expect(leaders[0]?.value[1]).toBe('1');
    const decisions = await query(
      fill(panels.find((p) => p.title === 'Chat requests by decision')!.targets![0]!.expr),
    );
    expect(decisions.map((r) => r.metric.decision).sort()).toEqual([
      'allowed',
      'connect_required',
      'topup_required',
    ]);
    const reasons = await query(
      fill(panels.find((p) => p.title === 'Upstream errors by reason')!.targets![0]!.expr),
    );
    expect(reasons.map((r) => r.metric)).toContainEqual({ model: 'dash-down', reason: 'connection' });
    const backlog = await query('max(tollgate_webhook_deliveries_pending)');
    expect(Number(backlog[0]?.value[1])).toBeGreaterThan(0);
  }, 150_000);
});
