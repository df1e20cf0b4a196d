import { execFileSync } from 'node:child_process';
import { createServer } from 'node:http';
import os from 'node:os';
import pg from 'pg';
import {
  checkTarget,
  cpuByPid,
  cpuSeconds,
  cpuSince,
  LoadGenerator,
  memoryOf,
  portkeyHeaders,
  sampleRss,
  start,
  startPortkey,
  stop,
  stopAll,
} from './harness.ts';
import { type LoadResult, type LoadTarget, percentile } from './loadgen.ts';
import { writeResultsBlock } from './report.ts';

/**
 * `npm run bench:proxy`: the same load sent straight to the mock provider ("direct"), through a bare
 * fastify + undici passthrough, through the Portkey AI gateway (`@portkey-ai/gateway`, no billing;
 * installed by the bench into bench/portkey/ and started by it), through Tollgate (per-token pricing,
 * real Postgres, real Redis), and through Tollgate with rate limits and spend caps on
 * ("tollgate+limits", never refusing), at concurrency 1, 16 and 64, non-streaming (whole response) and
 * streaming (time to first byte). Then a soak through Tollgate up to BENCH_SOAK total requests with its
 * memory sampled along the way. Prints issue 39's targets, each met or missed with its numbers.
 * BENCH_TRACES=1 adds "tollgate+traces": a second Tollgate process with OpenTelemetry traces on (every
 * request sampled, exported over OTLP/HTTP protobuf to a receiver in this process that discards them),
 * the tracing on/off comparison.
 * Writes the table to docs/benchmarks.md (between the proxy markers) and prints it.
 *
 * The load generator (bench/loadgen.ts) is a process of its own, as a client is; it, the provider, the
 * proxies, Postgres and Redis all share this machine.
 * Knobs: BENCH_REQUESTS (per cell at concurrency 16 and 64, default 6000), BENCH_SOAK (default 100000),
 * BENCH_USERS (users named in turn, default 200), BENCH_LOADGEN (process | inprocess), DATABASE_URL,
 * REDIS_URL, BENCH_WRITE=0 to print only.
 */
const PER_CELL = Number(process.env.BENCH_REQUESTS ?? 6000);
const SOAK = Number(process.env.BENCH_SOAK ?? 100_000);
const USERS = Number(process.env.BENCH_USERS ?? 200);
const CONCURRENCY = [1, 16, 64];
/**
 * Concurrency 1 is what one sequential client sees, and on a shared two-core machine it moves with
 * whatever else runs: its cells are measured in C1_ROUNDS rounds, each round going through every target
 * in turn (after C1_ROUND_WARMUP requests each), so that the added latency compares stretches of the
 * same minutes. PER_C1 requests per target in all.
 */
const PER_C1 = Math.max(1000, Math.round(PER_CELL / 2));
const C1_ROUNDS = 5;
const C1_ROUND_WARMUP = 100;
/** Each cell's own warm-up at concurrency 16 and 64. */
const cellWarmup = Math.min(500, Math.round(PER_CELL / 5));
/** The longest a cell's measured requests may take (a slow target answers fewer). */
const CELL_SECONDS = 10;
/** Requests per target and mode (non-streaming, streaming) of the warm-up before the first cell. */
const WARMUP = Number(process.env.BENCH_WARMUP ?? 3000);
/** Requests a fresh Tollgate serves first, measured at concurrency 1 before any warm-up. */
const COLD = 1000;

type TargetName = 'direct' | 'passthrough' | 'portkey' | 'tollgate' | 'tollgate+limits' | 'tollgate+traces';

interface Target extends LoadTarget {
  name: TargetName;
  /** The process whose CPU is counted: the provider (direct), the passthrough, Portkey or Tollgate. */
  pid: number;
}

interface Cell {
  target: TargetName;
  concurrency: number;
  stream: boolean;
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  mean: number;
  errors: number;
  /** CPU milliseconds per request: the proxy process (or the provider, for direct) and Postgres. */
  cpuProxy: number;
  cpuPostgres: number;
  /** CPU milliseconds per request of the provider process and of the load generator. */
  cpuUpstream: number;
  cpuLoad: number;
}

/** One stretch of load on one target: its latencies and what each process spent on it. */
interface Part {
  /** Requests of the warm-up sent before the measured ones. */
  warmed: number;
  latencies: number[];
  seconds: number;
  errors: number;
  /** CPU seconds of the proxy process (the provider for direct), the provider, Postgres, the load generator. */
  cpuProxy: number;
  cpuUpstream: number;
  cpuPostgres: number;
  cpuLoad: number;
}

/** `warmup` requests, then up to `total` measured (at most `maxSeconds`), with the CPU each process spent. */
async function measure(
  gen: LoadGenerator,
  target: Target,
  concurrency: number,
  stream: boolean,
  total: number,
  warmup: number,
  maxSeconds: number,
  upstreamPid: number,
): Promise<Part> {
  let cpuBefore = [0, 0];
  let postgresBefore = new Map<string, number>();
  const result = await gen.run(
    {
      target: { origin: target.origin, path: target.path, headers: target.headers, model: target.model },
      concurrency,
      stream,
      total,
      warmup,
      users: USERS,
      maxSeconds,
      series: true,
    },
    () => {
      cpuBefore = [cpuSeconds(target.pid), cpuSeconds(upstreamPid)];
      postgresBefore = cpuByPid('postgres');
    },
  );
  if (result.firstError) console.error(`${target.name}: first error: ${result.firstError}`);
  return {
    warmed: result.warmed,
    latencies: result.latencies!,
    seconds: result.seconds,
    errors: result.errors,
    cpuProxy: cpuSeconds(target.pid) - cpuBefore[0]!,
    cpuUpstream: cpuSeconds(upstreamPid) - cpuBefore[1]!,
    cpuPostgres: cpuSince('postgres', postgresBefore),
    cpuLoad: (result.cpuLoad * result.requests) / 1000,
  };
}

/** A cell of the table from the parts measured for it. */
function cellOf(target: TargetName, concurrency: number, stream: boolean, parts: Part[]): Cell {
  const latencies = parts.flatMap((p) => p.latencies);
  const n = latencies.length;
  const sorted = Float64Array.from(latencies).sort();
  const sum = (f: (p: Part) => number) => parts.reduce((a, p) => a + f(p), 0);
  const perRequest = (f: (p: Part) => number) => (sum(f) * 1000) / n;
  return {
    target,
    concurrency,
    stream,
    requests: n,
    rps: Math.round(n / sum((p) => p.seconds)),
    p50: percentile(sorted, 0.5),
    p99: percentile(sorted, 0.99),
    mean: latencies.reduce((a, v) => a + v, 0) / n,
    errors: sum((p) => p.errors),
    cpuProxy: perRequest((p) => p.cpuProxy),
    cpuPostgres: perRequest((p) => p.cpuPostgres),
    cpuUpstream: perRequest((p) => p.cpuUpstream),
    cpuLoad: perRequest((p) => p.cpuLoad),
  };
}

const loadAverage = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(', ');

function machine(): string[] {
  const cpu = os.cpus();
  const out = [
    `- CPU: ${cpu.length} × ${cpu[0]?.model ?? 'unknown'}; memory ${Math.round(os.totalmem() / 2 ** 30)} GiB; ${os.type()} ${os.release()}`,
    `- Node ${process.version}`,
  ];
  const probe = (cmd: string, args: string[]) => {
    try {
      return execFileSync(cmd, args, { encoding: 'utf8', timeout: 5000 }).trim().split('\n')[0]!;
    } catch {
      return undefined;
    }
  };
  const pg = probe('psql', [
    process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    '-Atc',
    'show server_version',
  ]);
  const redis = probe('redis-server', ['--version']);
  if (pg) out.push(`- Postgres ${pg} (local, default settings: synchronous_commit on, fsync on)`);
  if (redis) out.push(`- ${redis.replace(/ sha=.*$/, '')} (local)`);
  out.push(`- Load average when the run started: ${loadAverage()}`);
  return out;
}

const ms = (v: number) => v.toFixed(2);
/** A difference with its sign: +0.42, -0.10. */
const signed = (v: number) => (v < 0 ? ms(v) : `+${ms(v)}`);

/**
 * What one database round trip and one durable commit cost on this machine right now: the floor under
 * Tollgate's hold (one statement and commit on the request's path).
 */
async function probeDatabase(): Promise<string> {
  const client = new pg.Client({
    connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  });
  await client.connect();
  const table = `bench_probe_${process.pid}`;
  try {
    await client.query(`CREATE TABLE ${table} (id serial PRIMARY KEY, v int)`);
    const time = async (sqlText: string, values: unknown[]) => {
      const samples = new Float64Array(400);
      for (let i = 0; i < samples.length + 50; i++) {
        const started = performance.now();
        await client.query(sqlText, values);
        if (i >= 50) samples[i - 50] = performance.now() - started;
      }
      const sorted = samples.sort();
      return `p50 ${ms(percentile(sorted, 0.5))} ms, p99 ${ms(percentile(sorted, 0.99))} ms`;
    };
    const select = await time('SELECT $1::int', [1]);
    const commit = await time(`INSERT INTO ${table} (v) VALUES ($1)`, [1]);
    return `- Postgres from Node at that time: a \`SELECT 1\` round trip ${select}; a one-row \`INSERT\` with its durable commit ${commit}`;
  } finally {
    await client.query(`DROP TABLE IF EXISTS ${table}`).catch(() => {});
    await client.end();
  }
}

async function main() {
  const startedAt = new Date();
  const loadAtStart = os.loadavg()[0]!;
  const machineLines = machine();
  machineLines.push(await probeDatabase());
  console.log(machineLines.join('\n'));
  const upstream = await start('upstream.ts', {});
  const passthrough = await start('passthrough.ts', { UPSTREAM: upstream.info.baseUrl! });
  const portkey = await startPortkey();
  const tollgate = await start(
    'tollgate.ts',
    { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: String(USERS) },
    // The young generation the image's entry point sets (Dockerfile).
    ['--expose-gc', '--max-semi-space-size=16'],
  );
  const traced = process.env.BENCH_TRACES === '1' ? await startTraced(upstream.info.baseUrl!) : undefined;
  // Tollgate idle: started, its users connected and funded, a full GC, no request served yet.
  const idle = await memoryOf(tollgate);
  console.log(`Tollgate idle after a full GC: RSS ${idle.rss} MB, heap ${idle.heap} MB`);
  const upstreamUrl = new URL(upstream.info.baseUrl!);
  const targets: Target[] = [
    {
      name: 'direct',
      origin: upstreamUrl.origin,
      path: `${upstreamUrl.pathname}/chat/completions`,
      headers: {},
      model: 'mock-model',
      pid: upstream.child.pid!,
    },
    {
      name: 'passthrough',
      origin: passthrough.info.url!,
      path: '/v1/chat/completions',
      headers: {},
      model: 'mock-model',
      pid: passthrough.child.pid!,
    },
    {
      name: 'portkey',
      origin: portkey.info.url!,
      path: '/v1/chat/completions',
      headers: portkeyHeaders(upstream.info.baseUrl!),
      model: 'mock-model',
      pid: portkey.child.pid!,
    },
    {
      name: 'tollgate',
      origin: tollgate.info.url!,
      path: '/v1/chat/completions',
      headers: { authorization: `Bearer ${tollgate.info.apiKey}` },
      model: 'bench-model',
      pid: tollgate.child.pid!,
    },
    {
      name: 'tollgate+limits',
      origin: tollgate.info.url!,
      path: '/v1/chat/completions',
      headers: { authorization: `Bearer ${tollgate.info.limitsApiKey}` },
      model: 'bench-model',
      pid: tollgate.child.pid!,
    },
    ...(traced
      ? [
          {
            name: 'tollgate+traces' as const,
            origin: traced.tollgate.info.url!,
            path: '/v1/chat/completions',
            headers: { authorization: `Bearer ${traced.tollgate.info.apiKey}` },
            model: 'bench-model',
            pid: traced.tollgate.child.pid!,
          },
        ]
      : []),
  ];
  // Every target answers a non-streaming and a streaming request whole and right before any load.
  for (const target of targets) await checkTarget(target.name, target);
  let tollgateRequests = targets.filter((t) => t.name.startsWith('tollgate')).length * 2;
  const memory: Array<[number, { rss: number; heap: number }]> = [[0, idle]];
  const gen = await LoadGenerator.open();

  // What a client that starts using a fresh Tollgate right away sees: its first COLD requests, one at a
  // time, before any warm-up (against the provider direct at the same time, after a warm-up of its own).
  const tollgateTarget = targets.find((t) => t.name === 'tollgate')!;
  const one = { concurrency: 1, stream: false, users: USERS };
  const coldDirect = await gen.run({ ...one, target: targets[0]!, total: 500, warmup: 500 });
  const coldTollgate = await gen.run({ ...one, target: tollgateTarget, total: COLD, warmup: 0 });
  tollgateRequests += COLD;
  const cold = { tollgate: coldTollgate, direct: coldDirect };
  console.log(
    `cold: a fresh Tollgate's first ${COLD} requests at concurrency 1: p50 ${ms(coldTollgate.p50)} ms, mean ${ms(coldTollgate.mean)} ms (direct p50 ${ms(coldDirect.p50)} ms)`,
  );

  const rss = sampleRss({
    tollgate: tollgate.child.pid!,
    portkey: portkey.child.pid!,
    passthrough: passthrough.child.pid!,
  });

  // Warm everything up (JIT, connection pools, caches, every user's wallet), streaming and not, so
  // that the first cells measure a process in its steady state, not its first minutes.
  const warmBegan = performance.now();
  for (const stream of [false, true])
    for (const target of targets) {
      await gen.run({
        target,
        concurrency: 16,
        stream,
        total: 1,
        warmup: WARMUP,
        users: USERS,
      });
      if (target.name.startsWith('tollgate')) tollgateRequests += WARMUP + 1;
    }
  console.log(
    `warm-up: ${WARMUP} requests per target, streaming and not, in ${((performance.now() - warmBegan) / 1000).toFixed(0)} s`,
  );
  memory.push([tollgateRequests, await memoryOf(tollgate)]);

  const cells: Cell[] = [];
  const batchLines: string[] = [];
  for (const stream of [false, true]) {
    for (const concurrency of CONCURRENCY) {
      const rounds = concurrency === 1 ? C1_ROUNDS : 1;
      const total = concurrency === 1 ? Math.round(PER_C1 / rounds) : PER_CELL;
      const warmup = concurrency === 1 ? C1_ROUND_WARMUP : cellWarmup;
      const parts = new Map<TargetName, Part[]>(targets.map((t) => [t.name, []]));
      const batches = {
        take: { count: 0, size: 0, seconds: 0 },
        apply: { count: 0, size: 0, seconds: 0 },
        admitted: { memory: 0, database: 0 },
      };
      for (let round = 0; round < rounds; round++) {
        for (const target of targets) {
          const before = target.name === 'tollgate' ? await batchStats(tollgate.info.url!) : undefined;
          const part = await measure(
            gen,
            target,
            concurrency,
            stream,
            total,
            warmup,
            CELL_SECONDS / rounds,
            upstream.child.pid!,
          );
          parts.get(target.name)!.push(part);
          if (target.name.startsWith('tollgate')) tollgateRequests += part.warmed + part.latencies.length;
          if (before) {
            const after = await batchStats(tollgate.info.url!);
            for (const statement of ['take', 'apply'] as const)
              for (const key of ['count', 'size', 'seconds'] as const)
                batches[statement][key] += after[statement][key] - before[statement][key];
            for (const from of ['memory', 'database'] as const)
              batches.admitted[from] += after.admitted[from] - before.admitted[from];
          }
        }
      }
      const line = (statement: 'take' | 'apply') => {
        const { count, size, seconds } = batches[statement];
        if (!count) return `no ${statement}`;
        return `${count} × ${statement} of ${(size / count).toFixed(1)} in ${((1000 * seconds) / count).toFixed(2)} ms`;
      };
      const { memory, database } = batches.admitted;
      const fromMemory = memory + database ? Math.round((100 * memory) / (memory + database)) : 0;
      batchLines.push(
        `- ${stream ? 'streaming' : 'non-streaming'}, concurrency ${concurrency}: ${fromMemory} % of ${memory + database} requests admitted from memory; ${line('take')}, ${line('apply')} (batches, requests per batch, time per batch)`,
      );
      for (const target of targets) {
        const cell = cellOf(target.name, concurrency, stream, parts.get(target.name)!);
        cells.push(cell);
        console.log(
          `${stream ? 'stream ' : 'plain  '} c=${String(concurrency).padStart(2)} ${target.name.padEnd(15)} ` +
            `${String(cell.rps).padStart(6)} req/s  p50 ${ms(cell.p50)} ms  p99 ${ms(cell.p99)} ms  errors ${cell.errors}  ` +
            `cpu/req ${ms(cell.cpuProxy)} ms (+ postgres ${ms(cell.cpuPostgres)} ms)`,
        );
      }
    }
  }
  memory.push([tollgateRequests, await memoryOf(tollgate)]);

  // Soak: keep going through Tollgate until SOAK requests in total, sampling memory.
  const step = 20_000;
  while (tollgateRequests < SOAK) {
    const count = Math.min(step, SOAK - tollgateRequests);
    await gen.run({
      target: tollgateTarget,
      concurrency: 16,
      stream: false,
      total: count,
      warmup: 0,
      users: USERS,
    });
    tollgateRequests += count;
    memory.push([tollgateRequests, await memoryOf(tollgate)]);
    console.log(
      `soak: ${tollgateRequests} requests through Tollgate, RSS ${memory.at(-1)![1].rss} MB, heap ${memory.at(-1)![1].heap} MB`,
    );
  }
  const peak = rss.stop();
  const loadAtEnd = loadAverage();
  console.log(`Load average when the run ended: ${loadAtEnd}`);
  await gen.close();

  if (traced) {
    await stop(traced.tollgate);
    traced.receiver.close();
    console.log(`tollgate+traces exported ${traced.spans()} bytes of spans`);
  }
  const ledgerLines = await stop(tollgate);
  await stop(portkey);
  await stop(passthrough);
  await stop(upstream);
  const ledger = ledgerLines.map((l) => JSON.parse(l)).find((l) => l.ledger)?.ledger;

  const report = render({
    cells,
    cold,
    memory,
    peak,
    machineLines,
    startedAt,
    loadAtStart,
    loadAtEnd,
    ledger,
    batchLines,
  });
  console.log(`\n${report}`);
  if (process.env.BENCH_WRITE !== '0') writeResultsBlock('proxy-benchmark', 'Proxy', report);
}

/** A Tollgate process with traces on, exporting to a receiver here that counts and discards them. */
async function startTraced(upstream: string) {
  let bytes = 0;
  const receiver = createServer((req, res) => {
    req.on('data', (c: Buffer) => {
      bytes += c.length;
    });
    req.on('end', () => res.writeHead(200).end());
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const port = (receiver.address() as { port: number }).port;
  const tollgate = await start(
    'tollgate.ts',
    {
      UPSTREAM: upstream,
      BENCH_USERS: String(USERS),
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
      OTEL_TRACES_SAMPLER: 'always_on',
    },
    ['--expose-gc', '--max-semi-space-size=16'],
  );
  return { tollgate, receiver, spans: () => bytes };
}

/** Sums of the billing batch histograms of a Tollgate process, by statement. */
async function batchStats(url: string) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const value = (name: string, statement: string) =>
    Number(text.match(new RegExp(`^${name}\\{statement="${statement}"\\} (\\S+)`, 'm'))?.[1] ?? 0);
  const of = (statement: string) => ({
    count: value('tollgate_billing_batch_size_count', statement),
    size: value('tollgate_billing_batch_size_sum', statement),
    seconds: value('tollgate_billing_batch_duration_seconds_sum', statement),
  });
  const admitted = (from: string) => {
    let sum = 0;
    const line = new RegExp(`^tollgate_escrow_admissions_total\\{[^}]*from="${from}"[^}]*\\} (\\S+)`, 'gm');
    for (const m of text.matchAll(line)) sum += Number(m[1]);
    return sum;
  };
  return {
    take: of('take'),
    apply: of('apply'),
    admitted: { memory: admitted('memory'), database: admitted('database') },
  };
}

interface Report {
  cells: Cell[];
  /** A fresh Tollgate's first requests at concurrency 1, and direct at the same time. */
  cold: { tollgate: LoadResult; direct: LoadResult };
  memory: Array<[number, { rss: number; heap: number }]>;
  /** Peak resident set (MB) sampled every 100 ms from the warm-up to the end of the soak. */
  peak: Record<string, number>;
  machineLines: string[];
  startedAt: Date;
  /** The one-minute load average when the run started; all three when it ended. */
  loadAtStart: number;
  loadAtEnd: string;
  ledger: Record<string, string> | undefined;
  batchLines: string[];
}

/** Issue 39's targets (docs/benchmarks.md), each met or missed with the numbers of this run. */
function targetLines(find: (target: string, c: number, stream: boolean) => Cell, r: Report): string[] {
  const verdict = (ok: boolean) => (ok ? 'met' : 'missed');
  const out: string[] = [];
  const toll1 = find('tollgate', 1, false);
  const portkey1 = find('portkey', 1, false);
  const added = toll1.p50 - find('direct', 1, false).p50;
  out.push(
    `- Non-streaming, concurrency 1: ${toll1.rps} req/s against Portkey's ${portkey1.rps}, ${(toll1.rps / portkey1.rps).toFixed(2)}× (target ≥ 1.1×: ${verdict(toll1.rps >= 1.1 * portkey1.rps)}); p50 added over direct ${signed(added)} ms (target ≤ 1.0 ms: ${verdict(added <= 1)}), the settle durable before the last byte.`,
  );
  const vsPortkey: string[] = [];
  let fasterEverywhere = true;
  for (const stream of [false, true])
    for (const c of CONCURRENCY) {
      const toll = find('tollgate', c, stream);
      const portkey = find('portkey', c, stream);
      fasterEverywhere &&= toll.rps > portkey.rps;
      vsPortkey.push(
        `${stream ? 'stream' : 'non-stream'} c=${c} ${toll.rps} vs ${portkey.rps} (${(toll.rps / portkey.rps).toFixed(2)}×)`,
      );
    }
  out.push(
    `- Ahead of Portkey in every cell (Tollgate vs Portkey req/s): ${vsPortkey.join('; ')} (target: ${verdict(fasterEverywhere)}).`,
  );
  for (const [c, floor] of [
    [16, 40],
    [64, 60],
  ] as const) {
    const shares = [false, true].map((stream) =>
      Math.round((find('tollgate', c, stream).rps / find('passthrough', c, stream).rps) * 100),
    );
    out.push(
      `- Concurrency ${c}, share of the bare passthrough's throughput: non-streaming ${shares[0]} %, streaming ${shares[1]} % (target ≥ ${floor} %: ${verdict(shares.every((s) => s >= floor))}).`,
    );
  }
  const c16 = [false, true].map((stream) => find('tollgate', 16, stream).cpuProxy);
  out.push(
    `- Node CPU per charged request at concurrency 16 (the Tollgate process): non-streaming ${ms(c16[0]!)} ms, streaming ${ms(c16[1]!)} ms (target ≤ 0.15 ms: ${verdict(Math.max(...c16) <= 0.15)}).`,
  );
  const idle = r.memory[0]![1].rss;
  const after = r.memory.at(-1)![1].rss;
  const peak = Math.round(r.peak.tollgate!);
  out.push(
    `- Tollgate resident set: ${idle} MB idle, after start and a full GC before any request (target ≤ 120 MB: ${verdict(idle <= 120)}); ${after} MB after the whole run and ${peak} MB at its peak under load, sampled every 100 ms (target ≤ 250 MB: ${verdict(Math.max(after, peak) <= 250)}).`,
  );
  return out;
}

function render(r: Report): string {
  const { cells, memory, machineLines, startedAt, ledger, batchLines } = r;
  const find = (target: string, c: number, stream: boolean) =>
    cells.find((x) => x.target === target && x.concurrency === c && x.stream === stream)!;
  const rows: string[] = [];
  const notes: string[] = [];
  for (const stream of [false, true]) {
    for (const c of CONCURRENCY) {
      const direct = find('direct', c, stream);
      const pass = find('passthrough', c, stream);
      const toll = find('tollgate', c, stream);
      const traces = cells.find(
        (x) => x.target === 'tollgate+traces' && x.concurrency === c && x.stream === stream,
      );
      if (traces)
        notes.push(
          `- ${stream ? 'Streaming' : 'Non-streaming'}, concurrency ${c}: traces on add ${ms(traces.p50 - toll.p50)} ms at p50, ${ms(traces.p99 - toll.p99)} ms at p99 and ${ms(traces.cpuProxy - toll.cpuProxy)} ms of CPU per request, at ${Math.round((traces.rps / toll.rps) * 100)} % of the throughput without.`,
        );
      for (const cell of cells.filter((x) => x.concurrency === c && x.stream === stream)) {
        const charged = cell.target.startsWith('tollgate');
        const added =
          cell.target === 'direct'
            ? '—'
            : `${signed(cell.p50 - direct.p50)} / ${signed(cell.p99 - direct.p99)}`;
        const share =
          cell.target === 'direct' || cell.target === 'passthrough'
            ? ''
            : `${Math.round((cell.rps / pass.rps) * 100)} %`;
        rows.push(
          `| ${stream ? 'stream (TTFB)' : 'non-streaming'} | ${c} | ${cell.target === 'portkey' ? 'portkey (no billing)' : cell.target} | ${cell.rps} | ${ms(cell.p50)} | ${ms(cell.p99)} | ${ms(cell.mean)} | ${added} | ${share} | ${ms(cell.cpuProxy)} | ${charged ? ms(cell.cpuPostgres) : ''} | ${cell.errors} |`,
        );
      }
    }
  }
  const first = memory[1] ?? memory[0]!;
  const last = memory.at(-1)!;
  const growth = last[1].heap - first[1].heap;
  // The CPU budget of one request, all processes together (the machine has os.cpus().length cores).
  const budget = (target: string) => {
    const cell = find(target, 16, false);
    const proxy = target === 'direct' ? 0 : cell.cpuProxy;
    const postgres = target === 'tollgate' ? Math.max(0, cell.cpuPostgres) : 0;
    const total = proxy + postgres + cell.cpuUpstream + cell.cpuLoad;
    return { cell, proxy, postgres, total, ceiling: Math.round((os.cpus().length * 1000) / total) };
  };
  const pass16 = budget('passthrough');
  const portkey16 = budget('portkey');
  const toll16 = budget('tollgate');
  const cpuLine =
    `CPU per request at concurrency 16, non-streaming (all processes share ${os.cpus().length} cores): ` +
    `passthrough ${ms(pass16.proxy)} ms + provider ${ms(pass16.cell.cpuUpstream)} + load generator ${ms(pass16.cell.cpuLoad)} = ${ms(pass16.total)} ms ` +
    `(a ceiling of about ${pass16.ceiling} req/s); Portkey ${ms(portkey16.proxy)} ms + provider ${ms(portkey16.cell.cpuUpstream)} + load generator ${ms(portkey16.cell.cpuLoad)} = ${ms(portkey16.total)} ms (about ${portkey16.ceiling} req/s); ` +
    `Tollgate ${ms(toll16.proxy)} ms + Postgres ${ms(toll16.postgres)} + provider ${ms(toll16.cell.cpuUpstream)} + load generator ${ms(toll16.cell.cpuLoad)} = ${ms(toll16.total)} ms ` +
    `(about ${toll16.ceiling} req/s). Postgres CPU counts every Postgres process, other sessions' included.`;
  return [
    `Run on ${startedAt.toISOString().slice(0, 16).replace('T', ' ')} UTC with \`npm run bench:proxy\`: ${PER_CELL} requests per cell at concurrency 16 and 64 (at most ${CELL_SECONDS} s, after ${cellWarmup} not counted); at concurrency 1, ${PER_C1} per target in ${C1_ROUNDS} rounds that go through every target in turn (at most ${CELL_SECONDS} s in all, ${C1_ROUND_WARMUP} not counted before each); the whole matrix after a warm-up of ${WARMUP} requests per target, streaming and not. Bodies name ${USERS} users in turn; the load generator is a process of its own.`,
    '',
    ...machineLines,
    `- Load average when the run ended: ${r.loadAtEnd}`,
    '',
    '"portkey" is the Portkey AI gateway (`@portkey-ai/gateway` 1.15.2 from npm, `@hono/node-server` 1.13.5; bench/portkey/) routing to the same provider as an OpenAI-compatible custom host: no authentication of its own, no billing, no limits. "tollgate+limits" is the same Tollgate process serving a second project with rate limits (project, key and user; requests and tokens per minute) and spend caps (day, month), all high enough never to refuse: each request also runs the Redis scripts of src/limits.',
    ...(cells.some((c) => c.target === 'tollgate+traces')
      ? [
          '',
          '"tollgate+traces" (`BENCH_TRACES=1`) is a second Tollgate process with OpenTelemetry traces on, every request sampled and exported over OTLP/HTTP (protobuf) to a receiver in the load generator that discards them.',
        ]
      : []),
    '',
    'Latency is milliseconds for the whole response (non-streaming) or to the first byte of the body (streaming), as the client saw it. "Added" is the p50 / p99 over going direct; "share" is the throughput as a part of the passthrough\'s in the same run. "CPU ms/req" is the CPU time (user + system) the measured process spent per request: the provider for direct, the proxy process otherwise; "Postgres CPU" is that of every Postgres process during Tollgate\'s cells. Errors count the cell\'s warm-up too.',
    '',
    '| mode | concurrency | target | req/s | p50 ms | p99 ms | mean ms | added p50 / p99 ms | share | CPU ms/req | Postgres CPU ms/req | errors |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...rows,
    '',
    "Issue 39's targets:",
    '',
    ...(Math.max(r.loadAtStart, Number.parseFloat(r.loadAtEnd)) > 1
      ? [
          `- **Not a quiet machine** (load average ${r.loadAtStart.toFixed(2)} at the start, ${r.loadAtEnd.split(',')[0]} at the end): other processes shared the two cores, and the concurrency-1 figures through Tollgate move most with that (see "Concurrency 1: what a sequential client sees" below the table).`,
        ]
      : []),
    ...targetLines(find, r),
    '',
    `A fresh Tollgate, before any warm-up: its first ${r.cold.tollgate.requests} requests at concurrency 1 (non-streaming) took p50 ${ms(r.cold.tollgate.p50)} ms, p99 ${ms(r.cold.tollgate.p99)} ms, mean ${ms(r.cold.tollgate.mean)} ms — ${signed(r.cold.tollgate.p50 - r.cold.direct.p50)} ms at p50 over direct then (${ms(r.cold.direct.p50)} ms), against ${signed(find('tollgate', 1, false).p50 - find('direct', 1, false).p50)} ms once warm (the table): what a client sees in the first seconds after a start.`,
    ...(notes.length ? ['', ...notes] : []),
    '',
    cpuLine,
    '',
    "Escrow and group commit in Tollgate's cells (from its `tollgate_escrow_admissions_total` and `tollgate_billing_batch_*` metrics; `take` takes a slice, `apply` settles on one):",
    '',
    ...batchLines,
    '',
    `Memory of the Tollgate process after a full GC (V8 heap used / resident set): ${memory.map(([n, m]) => `${m.heap} / ${m.rss} MB after ${n.toLocaleString('en-US')}`).join(', ')} requests — the heap ${growth <= 0 ? 'did not grow' : `grew by ${growth} MB`} from the end of the warm-up to the last sample. Peak resident set sampled under load: Tollgate ${Math.round(r.peak.tollgate!)} MB, Portkey ${Math.round(r.peak.portkey!)} MB, passthrough ${Math.round(r.peak.passthrough!)} MB.`,
    ...(ledger
      ? [
          '',
          `Ledger after the run: ${ledger.users} wallets, ${ledger.charges} charges totalling ${ledger.charged} usd, ${ledger.bad} wallets whose balance differs from the sum of their entries or whose held amount differs from their open holds, ${Number(ledger.held)} held.`,
        ]
      : []),
  ].join('\n');
}

main()
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(stopAll);
