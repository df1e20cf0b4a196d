import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Metrics } from '../../src/metrics/registry.ts';
import { parseMetrics } from '../helpers/metrics-text.ts';

/** The metric set docs/operations.md documents: name → [type, label names]. */
const EXPECTED: Record<string, [string, string[]]> = {
  tollgate_build_info: ['gauge', ['version', 'node_version']],
  tollgate_http_requests_total: ['counter', ['project', 'route', 'method', 'status']],
  tollgate_http_request_duration_seconds: ['histogram', ['project', 'route', 'method']],
  tollgate_requests_total: ['counter', ['project', 'model', 'decision', 'outcome', 'stream']],
  tollgate_input_tokens_total: ['counter', ['project', 'model']],
  tollgate_output_tokens_total: ['counter', ['project', 'model']],
  tollgate_charged_amount_total: ['counter', ['project', 'model', 'currency', 'source']],
  tollgate_charge_overage_amount_total: ['counter', ['project', 'model', 'currency']],
  tollgate_debt_created_amount_total: ['counter', ['project', 'model', 'currency']],
  tollgate_deposited_amount_total: ['counter', ['project', 'currency']],
  tollgate_granted_amount_total: ['counter', ['project', 'currency', 'reason']],
  tollgate_holds_open: ['gauge', ['project']],
  tollgate_escrow_admissions_total: ['counter', ['project', 'from']],
  tollgate_billing_batch_size: ['histogram', ['statement']],
  tollgate_billing_batch_duration_seconds: ['histogram', ['statement']],
  tollgate_upstream_latency_seconds: ['histogram', ['project', 'model', 'stream']],
  tollgate_time_to_first_token_seconds: ['histogram', ['project', 'model']],
  tollgate_overhead_latency_seconds: ['histogram', ['project', 'model']],
  tollgate_upstream_errors_total: ['counter', ['project', 'model', 'reason']],
  tollgate_usage_anomalies_total: ['counter', ['project', 'model', 'kind']],
  tollgate_usage_anomalous_tokens_total: ['counter', ['project', 'model', 'kind']],
  tollgate_rate_limited_total: ['counter', ['project', 'scope', 'limit']],
  tollgate_spend_capped_total: ['counter', ['project', 'period']],
  tollgate_limits_backend_errors_total: ['counter', ['project', 'outcome']],
  tollgate_webhook_deliveries_total: ['counter', ['project', 'outcome']],
  tollgate_webhook_delivery_attempts: ['histogram', ['outcome']],
  tollgate_webhook_delivery_duration_seconds: ['histogram', ['outcome']],
  tollgate_webhook_deliveries_pending: ['gauge', []],
  tollgate_webhook_oldest_pending_age_seconds: ['gauge', []],
  tollgate_webhook_subscriptions_disabled_total: ['counter', ['project']],
  tollgate_events_fanned_out_total: ['counter', []],
  tollgate_retention_pruned_rows_total: ['counter', ['kind']],
  tollgate_operator_reconcile_total: ['counter', ['result']],
  tollgate_operator_reconcile_duration_seconds: ['histogram', []],
  tollgate_operator_leader: ['gauge', []],
};

/** A few of prom-client's default process and event-loop metrics, with Tollgate's prefix. */
const DEFAULTS = [
  'tollgate_process_cpu_seconds_total',
  'tollgate_process_resident_memory_bytes',
  'tollgate_process_start_time_seconds',
  'tollgate_nodejs_eventloop_lag_seconds',
  'tollgate_nodejs_eventloop_lag_p99_seconds',
  'tollgate_nodejs_heap_size_used_bytes',
  'tollgate_nodejs_active_handles_total',
  'tollgate_nodejs_gc_duration_seconds',
];

describe('metric names and labels', () => {
  const metrics = new Metrics();

  it('registers exactly the documented tollgate_* metrics with their types and labels', async () => {
    const json = await metrics.registry.getMetricsAsJSON();
    const own = json.filter((m) => !DEFAULTS.includes(m.name) && !isDefault(m.name));
    expect(own.map((m) => m.name).sort()).toEqual(Object.keys(EXPECTED).sort());
    for (const m of own) {
      const [type, labels] = EXPECTED[m.name]!;
      expect(m.type, m.name).toBe(type);
      const metric = metrics.registry.getSingleMetric(m.name) as unknown as { labelNames: string[] };
      expect([...metric.labelNames].sort(), m.name).toEqual([...labels].sort());
    }
  });

  it('never labels a metric by end user or API key', async () => {
    for (const m of await metrics.registry.getMetricsAsJSON()) {
      const metric = metrics.registry.getSingleMetric(m.name) as unknown as { labelNames?: string[] };
      for (const label of metric.labelNames ?? []) expect(label, m.name).not.toMatch(/user|key|customer/i);
    }
  });

  it('exports the default process and event-loop metrics prefixed tollgate_', async () => {
    const registered = (await metrics.registry.getMetricsAsJSON()).map((m) => m.name);
    for (const name of DEFAULTS) expect(registered, name).toContain(name);
    const exposed = new Set(parseMetrics(await metrics.registry.metrics()).map((s) => baseName(s.name)));
    expect(exposed).toContain('tollgate_process_cpu_seconds_total');
    expect(exposed).toContain('tollgate_nodejs_eventloop_lag_seconds');
    for (const name of exposed) expect(name).toMatch(/^tollgate_/);
  });

  it('gives histograms buckets fit for what they measure', () => {
    const buckets = (name: string) =>
      (metrics.registry.getSingleMetric(name) as unknown as { upperBounds: number[] }).upperBounds;
    // Overhead is sub-millisecond to tens of milliseconds; model calls run to minutes.
    expect(buckets('tollgate_overhead_latency_seconds')[0]).toBeLessThanOrEqual(0.001);
    expect(buckets('tollgate_upstream_latency_seconds').at(-1)).toBeGreaterThanOrEqual(60);
    expect(buckets('tollgate_time_to_first_token_seconds')[0]).toBeLessThanOrEqual(0.1);
  });

  it('keeps two contexts apart (each Metrics has its own registry)', async () => {
    const other = new Metrics({ defaultMetrics: false });
    other.requests.inc({
      project: 'p',
      model: 'm',
      decision: 'allowed',
      outcome: 'success',
      stream: 'false',
    });
    const mine = parseMetrics(await metrics.registry.metrics());
    expect(mine.some((s) => s.name === 'tollgate_requests_total')).toBe(false);
    const theirs = parseMetrics(await other.registry.metrics());
    expect(theirs.find((s) => s.name === 'tollgate_requests_total')?.value).toBe(1);
  });

  it('reports the package version in tollgate_build_info', async () => {
    const info = parseMetrics(await metrics.registry.metrics()).find((s) => s.name === 'tollgate_build_info');
    expect(info?.value).toBe(1);
    expect(info?.labels.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(info?.labels.node_version).toBe(process.versions.node);
  });
});

describe('the metrics table of docs/operations.md', () => {
  it('lists every metric with its type and labels', () => {
    const readme = readFileSync(join(import.meta.dirname, '..', '..', 'docs', 'operations.md'), 'utf8');
    const section = readme.slice(readme.indexOf('\n## Metrics'));
    const rows = new Map<string, [string, string[]]>();
    for (const line of section.split('\n')) {
      const m = /^\| `(tollgate_[a-z_]+)` \| (\w+) \| ([^|]*) \|/.exec(line);
      if (!m) continue;
      const labels = m[3]!.trim() === '—' ? [] : m[3]!.split(',').map((l) => l.trim());
      rows.set(m[1]!, [m[2]!, labels]);
    }
    expect([...rows.keys()].sort()).toEqual(Object.keys(EXPECTED).sort());
    for (const [name, [type, labels]] of rows) {
      expect(type, name).toBe(EXPECTED[name]![0]);
      expect(labels.sort(), name).toEqual([...EXPECTED[name]![1]].sort());
    }
  });
});

function isDefault(name: string): boolean {
  return /^tollgate_(process|nodejs)_/.test(name);
}

function baseName(name: string): string {
  return name.replace(/_(bucket|sum|count)$/, '');
}
