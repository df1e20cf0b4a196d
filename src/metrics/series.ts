import type { Counter, Histogram } from 'prom-client';

/**
 * One series (one set of label values) of a prom-client counter or histogram, for the metrics every
 * request moves. prom-client's `inc(labels, v)` / `observe(labels, v)` check the label object, build its
 * key string and (histograms) allocate a closure on every call; a series does that once, the first time,
 * through prom-client itself, and afterwards adds to the same entry prom-client keeps — what a scrape
 * reads is unchanged. Callers keep a series per label set (src/metering/flow.ts, ./routes.ts).
 *
 * This relies on prom-client 15's storage (`hashMap` by the key `hashObject` builds from
 * `sortedLabelNames`; a counter entry's `value`, a histogram entry's `sum`, `count` and `bucketValues`
 * by upper bound), checked when a series is made: when it does not look like that, every call goes
 * through prom-client's own method.
 */

interface Storage {
  hashMap: Record<
    string,
    { value: number; sum: number; count: number; bucketValues: Record<number, number> }
  >;
  sortedLabelNames: string[];
  upperBounds?: readonly number[];
}

function storageOf(metric: object, histogram: boolean): Storage | undefined {
  const m = metric as Partial<Storage>;
  if (typeof m.hashMap !== 'object' || m.hashMap === null || !Array.isArray(m.sortedLabelNames))
    return undefined;
  if (histogram && !Array.isArray(m.upperBounds)) return undefined;
  return m as Storage;
}

/** prom-client's key of a label set (util.js `hashObject` with the metric's sorted label names). */
function keyOf(storage: Storage, labels: Record<string, string>): string {
  let key = '';
  for (const name of storage.sortedLabelNames) {
    const value = labels[name];
    if (value !== undefined) key += `${name}:${value},`;
  }
  return key;
}

/** A metric's series: the label set, and prom-client's storage and key for it when they look as expected. */
abstract class Series<T extends string, M extends object> {
  protected readonly metric: M;
  protected readonly labels: Record<T, string>;
  protected readonly storage: Storage | undefined;
  protected readonly key: string;

  constructor(metric: M, labels: Record<T, string>, histogram: boolean) {
    this.metric = metric;
    this.labels = labels;
    this.storage = storageOf(metric, histogram);
    this.key = this.storage ? keyOf(this.storage, labels) : '';
  }
}

export class CounterSeries<T extends string> extends Series<T, Counter<T>> {
  constructor(counter: Counter<T>, labels: Record<T, string>) {
    super(counter, labels, false);
  }

  inc(value = 1): void {
    const entry = this.storage?.hashMap[this.key];
    // New (or reset) series, or a value prom-client refuses: prom-client's own path.
    if (entry === undefined || !(value >= 0) || !Number.isFinite(value)) {
      this.metric.inc(this.labels, value);
      return;
    }
    entry.value += value;
  }
}

export class HistogramSeries<T extends string> extends Series<T, Histogram<T>> {
  constructor(histogram: Histogram<T>, labels: Record<T, string>) {
    super(histogram, labels, true);
  }

  observe(value: number): void {
    const storage = this.storage;
    const entry = storage?.hashMap[this.key];
    if (entry === undefined || !Number.isFinite(value)) {
      this.metric.observe(this.labels, value);
      return;
    }
    // What prom-client's observe does with an entry it found.
    entry.sum += value;
    entry.count += 1;
    const bounds = storage!.upperBounds!;
    for (let i = 0; i < bounds.length; i++) {
      if (value <= bounds[i]!) {
        entry.bucketValues[bounds[i]!]! += 1;
        return;
      }
    }
  }
}
