import type { Metrics } from '../metrics/registry.ts';
import { CounterSeries, HistogramSeries } from '../metrics/series.ts';

/**
 * The metrics every served request of one model moves, as series made once per model (row) and kept
 * (src/metrics/series.ts): no label object, check or key per request. Labels as before: project and
 * model, and the request's outcome and streaming flag.
 */
export class RequestMetrics {
  readonly #metrics: Metrics;
  readonly #project: string;
  readonly #model: string;
  readonly #requests = new Map<
    string,
    CounterSeries<'project' | 'model' | 'decision' | 'outcome' | 'stream'>
  >();
  readonly #upstream: Array<HistogramSeries<'project' | 'model' | 'stream'> | undefined> = [];
  #input: CounterSeries<'project' | 'model'> | undefined;
  #output: CounterSeries<'project' | 'model'> | undefined;
  #overhead: HistogramSeries<'project' | 'model'> | undefined;
  #firstToken: HistogramSeries<'project' | 'model'> | undefined;

  constructor(metrics: Metrics, project: string, model: string) {
    this.#metrics = metrics;
    this.#project = project;
    this.#model = model;
  }

  /** `tollgate_requests_total` of an allowed request. */
  allowed(outcome: string, stream: boolean): void {
    const key = `${outcome}:${stream}`;
    let series = this.#requests.get(key);
    if (!series) {
      series = new CounterSeries(this.#metrics.requests, {
        project: this.#project,
        model: this.#model,
        decision: 'allowed',
        outcome,
        stream: String(stream),
      });
      this.#requests.set(key, series);
    }
    series.inc();
  }

  tokens(input: number, output: number): void {
    const labels = { project: this.#project, model: this.#model };
    this.#input ??= new CounterSeries(this.#metrics.inputTokens, labels);
    this.#output ??= new CounterSeries(this.#metrics.outputTokens, labels);
    this.#input.inc(input);
    this.#output.inc(output);
  }

  /** Upstream time and the time Tollgate added, in seconds. */
  latency(upstreamSeconds: number, overheadSeconds: number, stream: boolean): void {
    const labels = { project: this.#project, model: this.#model };
    const i = stream ? 1 : 0;
    this.#upstream[i] ??= new HistogramSeries(this.#metrics.upstreamLatency, {
      ...labels,
      stream: String(stream),
    });
    this.#overhead ??= new HistogramSeries(this.#metrics.overhead, labels);
    this.#upstream[i].observe(upstreamSeconds);
    this.#overhead.observe(overheadSeconds);
  }

  firstToken(seconds: number): void {
    this.#firstToken ??= new HistogramSeries(this.#metrics.timeToFirstToken, {
      project: this.#project,
      model: this.#model,
    });
    this.#firstToken.observe(seconds);
  }
}
