import { ApiError } from '../core/errors.ts';
import type { ModelRow } from '../db/schema.ts';
import type { Metrics } from '../metrics/registry.ts';
import { UpstreamError } from '../upstream/types.ts';
import type { Exchange, UsageAnomaly } from './api.ts';
import type { TokenUsage } from './cost.ts';
import type { Ending, MeteringObserver, Refusal } from './observer.ts';
import { RequestMetrics } from './request-metrics.ts';

/**
 * The metrics of metered requests (src/metrics/registry.ts): `tollgate_requests_total` by decision and
 * outcome, tokens, upstream latency, the time Tollgate added and the time to a stream's first token, and
 * provider failures. A served request's series are made once per model row (request-metrics.ts).
 * A request Tollgate itself refuses as invalid (a field a translation cannot carry: nothing reached the
 * provider) is `decision="invalid_request", outcome="refused"`, not a provider failure.
 */
export class MetricsObserver implements MeteringObserver {
  readonly #metrics: Metrics;
  /** Rows live in the project cache: a row's series go with it. */
  readonly #byRow = new WeakMap<ModelRow, RequestMetrics>();

  constructor(metrics: Metrics) {
    this.#metrics = metrics;
  }

  #of(x: Exchange): RequestMetrics {
    let found = this.#byRow.get(x.model);
    if (!found) {
      found = new RequestMetrics(this.#metrics, x.project.id, x.model.id);
      this.#byRow.set(x.model, found);
    }
    return found;
  }

  refused(x: Exchange, refusal: Refusal): void {
    this.#metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: refusal.decision,
      outcome: refusal.decision === 'rate_limited' ? 'refused' : 'link',
      stream: String(x.stream),
    });
  }

  responded(x: Exchange, upstreamMs: number): void {
    const metrics = this.#of(x);
    if (x.stream) metrics.firstToken((performance.now() - x.started) / 1000);
    metrics.latency(
      upstreamMs / 1000,
      Math.max(0, performance.now() - x.started - upstreamMs) / 1000,
      x.stream,
    );
  }

  failed(x: Exchange, err: unknown, _error: unknown, counted: boolean): void {
    if (refusedByTollgate(err)) {
      countInvalidRequest(this.#metrics, x.project.id, x.model.id, x.stream);
      return;
    }
    const upstream = err instanceof UpstreamError ? err : undefined;
    this.#metrics.upstreamErrors.inc({
      project: x.project.id,
      model: x.model.id,
      reason: upstream ? upstream.kind : 'internal',
    });
    if (!counted) return;
    this.#metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: 'allowed',
      outcome: upstream?.kind === 'timeout' ? 'upstream_timeout' : 'upstream_error',
      stream: String(x.stream),
    });
  }

  anomaly(x: Exchange, anomaly: UsageAnomaly): void {
    for (const [kind, excess] of [
      ['input', anomaly.excessInput],
      ['output', anomaly.excessOutput],
    ] as const) {
      if (!excess) continue;
      const labels = { project: x.project.id, model: x.model.id, kind };
      this.#metrics.usageAnomalies.inc(labels);
      this.#metrics.anomalousTokens.inc(labels, excess);
    }
  }

  ended(x: Exchange, end: Ending, usage: TokenUsage | undefined): void {
    const metrics = this.#of(x);
    metrics.allowed(end.outcome, x.stream);
    if (usage) metrics.tokens(usage.input, usage.output);
  }
}

/**
 * An error Tollgate raised itself, before anything was sent to the provider (a provider adapter's 400,
 * e.g. `untranslatable_field`): the request was invalid, the provider did not fail.
 */
export function refusedByTollgate(err: unknown): boolean {
  return err instanceof ApiError && err.status < 500;
}

/**
 * A metered request Tollgate refused as invalid — its own validation (the schema, an unknown model, a
 * field a translation cannot carry) — counted as such: `decision="invalid_request", outcome="refused"`.
 * `model`: the project's model id, or "" when the request named none the project has.
 */
export function countInvalidRequest(metrics: Metrics, project: string, model: string, stream: boolean): void {
  metrics.requests.inc({
    project,
    model,
    decision: 'invalid_request',
    outcome: 'refused',
    stream: String(stream),
  });
}
