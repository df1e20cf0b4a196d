import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Metrics } from '../../src/metrics/registry.ts';
import { CounterSeries, HistogramSeries } from '../../src/metrics/series.ts';

/**
 * Series (src/metrics/series.ts) add to the entries prom-client keeps: a scrape reads exactly what the
 * same observations made through prom-client's own `inc` and `observe` would give.
 */

const labels = fc.record({
  project: fc.constantFrom('pw_1', 'pw_2', ''),
  model: fc.constantFrom('m', 'gpt-4o-mini', 'a"b\\c'),
});
const op = fc.oneof(
  fc.record({ kind: fc.constant('inc' as const), labels, value: fc.oneof(fc.nat(1000), fc.constant(0)) }),
  fc.record({
    kind: fc.constant('observe' as const),
    labels,
    value: fc.oneof(fc.double({ min: 0, max: 300, noNaN: true }), fc.constantFrom(0, 0.0005, 0.25, 120, 1e9)),
  }),
  fc.record({ kind: fc.constant('reset' as const) }),
);

describe('metric series', () => {
  it('scrape to the same text as prom-client’s own inc and observe', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { maxLength: 60 }), async (ops) => {
        const direct = new Metrics({ defaultMetrics: false });
        const viaSeries = new Metrics({ defaultMetrics: false });
        const counters = new Map<string, CounterSeries<'project' | 'model'>>();
        const histograms = new Map<string, HistogramSeries<'project' | 'model'>>();
        for (const o of ops) {
          if (o.kind === 'reset') {
            direct.registry.resetMetrics();
            viaSeries.registry.resetMetrics();
            continue;
          }
          const key = JSON.stringify(o.labels);
          if (o.kind === 'inc') {
            direct.inputTokens.inc(o.labels, o.value);
            const s = counters.get(key) ?? new CounterSeries(viaSeries.inputTokens, o.labels);
            counters.set(key, s);
            s.inc(o.value);
          } else {
            direct.overhead.observe(o.labels, o.value);
            const s = histograms.get(key) ?? new HistogramSeries(viaSeries.overhead, o.labels);
            histograms.set(key, s);
            s.observe(o.value);
          }
        }
        expect(await viaSeries.registry.metrics()).toBe(await direct.registry.metrics());
      }),
      { numRuns: 300 },
    );
  });

  it('refuse what prom-client refuses', () => {
    const metrics = new Metrics({ defaultMetrics: false });
    const counter = new CounterSeries(metrics.inputTokens, { project: 'p', model: 'm' });
    counter.inc(1);
    expect(() => counter.inc(-1)).toThrow();
    expect(() => counter.inc(Number.POSITIVE_INFINITY)).toThrow();
    const histogram = new HistogramSeries(metrics.overhead, { project: 'p', model: 'm' });
    histogram.observe(1);
    expect(() => histogram.observe(Number.NaN)).toThrow();
  });
});
