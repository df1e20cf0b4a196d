import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';

/**
 * The benchmark's load generator: a closed loop of `concurrency` workers, each sending its next request
 * when its last one finished, over an undici keep-alive pool with one connection per worker. Bodies name
 * `users` users in turn (`user-0` …), as a proxy serving many users sees them.
 *
 * bench/proxy.ts runs it in a process of its own (`node bench/loadgen.ts`), so the client's event loop,
 * garbage collector and JIT are nobody else's: one JSON job per stdin line; it answers `{"warm": true}`
 * after the warm-up, waits for a `go` line (the driver reads CPU counters in between), then answers the
 * result. `runJob` is the same loop in-process (BENCH_LOADGEN=inprocess, for comparison).
 */
export interface LoadTarget {
  origin: string;
  path: string;
  headers: Record<string, string>;
  model: string;
}

export interface LoadJob {
  target: LoadTarget;
  concurrency: number;
  stream: boolean;
  /** Requests measured, after `warmup` requests that are not. */
  total: number;
  warmup: number;
  users: number;
  /**
   * At most this many seconds for the measured requests (and a fifth of it for the warm-up): the
   * workers stop taking new requests then, and the result counts those that completed.
   */
  maxSeconds?: number;
  /** Return every latency in order (ms), not only the summary. */
  series?: boolean;
}

export interface LoadResult {
  /** Requests of the warm-up that were sent (fewer than asked when its time ran out). */
  warmed: number;
  requests: number;
  seconds: number;
  rps: number;
  p50: number;
  p99: number;
  mean: number;
  errors: number;
  /** The first non-200 answer (status and the start of its body), if any. */
  firstError?: string;
  /** CPU milliseconds per measured request of the load generator's own process. */
  cpuLoad: number;
  latencies?: number[];
}

export function bodies(model: string, stream: boolean, users: number): string[] {
  return Array.from({ length: users }, (_, i) =>
    JSON.stringify({
      model,
      user: `user-${i}`,
      stream,
      max_tokens: 16,
      messages: [
        { role: 'system', content: 'You are a helpful assistant.' },
        { role: 'user', content: `Hello! This is request ${i}; how are you today?` },
      ],
    }),
  );
}

export function percentile(sorted: ArrayLike<number>, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))]!;
}

/** Runs one job: the warm-up, then `beforeMeasured` (awaited), then the measured requests. */
export async function runJob(job: LoadJob, beforeMeasured: () => Promise<void> = async () => {}) {
  const { target, concurrency, stream, total, warmup } = job;
  const pool = new Pool(target.origin, { connections: concurrency, pipelining: 1, keepAliveTimeout: 30_000 });
  const payloads = bodies(target.model, stream, job.users);
  const headers = { 'content-type': 'application/json', ...target.headers };
  const latencies = new Float64Array(total);
  let errors = 0;
  let firstError: string | undefined;
  // The rotation over users goes on from the warm-up into the measured requests.
  let sent = 0;
  const one = async (i: number, record: boolean) => {
    const started = performance.now();
    const res = await pool.request({
      path: target.path,
      method: 'POST',
      headers,
      body: payloads[sent++ % payloads.length],
    });
    let first = 0;
    let head = '';
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      if (!first) first = performance.now();
      if (res.statusCode !== 200 && head.length < 300) head += chunk.toString('utf8');
    }
    const ended = performance.now();
    if (res.statusCode !== 200) {
      errors++;
      firstError ??= `${res.statusCode} ${head.slice(0, 300)}`;
    }
    if (record) latencies[i] = (stream ? first || ended : ended) - started;
  };
  /** Sends `count` requests (fewer if `seconds` run out first); answers how many completed. */
  const run = async (count: number, record: boolean, seconds = Number.POSITIVE_INFINITY) => {
    const deadline = performance.now() + seconds * 1000;
    let next = 0;
    let done = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let i = next++; i < count && performance.now() < deadline; i = next++) {
          await one(i, record);
          done++;
        }
      }),
    );
    return done;
  };
  try {
    const warmed = await run(warmup, false, (job.maxSeconds ?? Number.POSITIVE_INFINITY) / 5);
    await beforeMeasured();
    const cpuBefore = process.cpuUsage();
    const began = performance.now();
    const completed = await run(total, true, job.maxSeconds);
    const seconds = (performance.now() - began) / 1000;
    const cpu = process.cpuUsage(cpuBefore);
    // Requests are numbered in the order they were taken, and every one taken completes.
    const measured = latencies.subarray(0, completed);
    const sorted = measured.slice().sort();
    let sum = 0;
    for (const v of measured) sum += v;
    const result: LoadResult = {
      warmed,
      requests: measured.length,
      seconds,
      rps: Math.round(measured.length / seconds),
      p50: percentile(sorted, 0.5),
      p99: percentile(sorted, 0.99),
      mean: sum / measured.length,
      errors,
      ...(firstError ? { firstError } : {}),
      cpuLoad: (cpu.user + cpu.system) / 1000 / measured.length,
      ...(job.series ? { latencies: Array.from(measured, (v) => Math.round(v * 1000) / 1000) } : {}),
    };
    return result;
  } finally {
    await pool.close();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const next = async () => {
    const { value, done } = await lines.next();
    return done ? undefined : (value as string);
  };
  const send = (value: unknown) => process.stdout.write(`${JSON.stringify(value)}\n`);
  send({ ready: true });
  for (let line = await next(); line !== undefined; line = await next()) {
    const job = JSON.parse(line) as LoadJob;
    const result = await runJob(job, async () => {
      send({ warm: true });
      if ((await next()) !== 'go') process.exit(0);
    });
    send(result);
  }
  process.exit(0);
}
