import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Pool } from 'undici';
import { writeResultsBlock } from './report.ts';

/**
 * `npm run bench:proxy`: the same load sent straight to the mock provider ("direct"), through a bare
 * fastify + undici passthrough, through Tollgate (per-token pricing, real Postgres, real Redis), and
 * through Tollgate with rate limits and spend caps on ("tollgate+limits", never refusing), at
 * concurrency 1, 16 and 64, non-streaming (whole response) and streaming (time to first byte). Then a
 * soak through Tollgate up to BENCH_SOAK total requests with its resident memory sampled along the way.
 * BENCH_TRACES=1 adds "tollgate+traces": a second Tollgate process with OpenTelemetry traces on (every
 * request sampled, exported over OTLP/HTTP protobuf to a receiver in this process that discards them),
 * the tracing on/off comparison.
 * Writes the table to docs/benchmarks.md (between the proxy markers) and prints it.
 *
 * Every process (load generator, provider, passthrough, Tollgate, Postgres, Redis) shares this machine.
 * Knobs: BENCH_REQUESTS (per cell, default 6000), BENCH_SOAK (default 100000), BENCH_USERS (1000),
 * DATABASE_URL, REDIS_URL, BENCH_WRITE=0 to print only.
 */
const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const PER_CELL = Number(process.env.BENCH_REQUESTS ?? 6000);
const SOAK = Number(process.env.BENCH_SOAK ?? 100_000);
const USERS = Number(process.env.BENCH_USERS ?? 1000);
const CONCURRENCY = [1, 16, 64];
const children: ChildProcess[] = [];

interface Started {
  child: ChildProcess;
  info: Record<string, string>;
  /** stdout lines after the first. */
  lines: string[];
}

/** Starts a bench server script and waits for its first stdout line (JSON). */
async function start(script: string, env: Record<string, string>, nodeArgs: string[] = []): Promise<Started> {
  const child = spawn(process.execPath, [...nodeArgs, join(here, script)], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  const reader = createInterface({ input: child.stdout! });
  const lines: string[] = [];
  const first = await new Promise<string>((resolve, reject) => {
    let ready = false;
    reader.on('line', (line) => {
      if (ready) lines.push(line);
      else {
        ready = true;
        resolve(line);
      }
    });
    child.once('exit', (code) => reject(new Error(`${script} exited with ${code} before it was ready`)));
  });
  return { child, info: JSON.parse(first), lines };
}

function stop(started: Started): Promise<string[]> {
  return new Promise((resolve) => {
    started.child.once('exit', () => setImmediate(() => resolve(started.lines)));
    started.child.kill('SIGTERM');
  });
}

const USER_HZ = 100;

function readStat(pid: string): { name: string; cpu: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const close = stat.lastIndexOf(')');
    const fields = stat.slice(close + 2).split(' ');
    return {
      name: stat.slice(stat.indexOf('(') + 1, close),
      cpu: (Number(fields[11]) + Number(fields[12])) / USER_HZ,
    };
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) used so far by a process. */
function cpuSeconds(pid: number): number {
  return pid ? (readStat(String(pid))?.cpu ?? 0) : 0;
}

/** CPU seconds so far of every process with that command name, by pid. */
function cpuByPid(name: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const stat = readStat(pid);
    if (stat?.name === name) out.set(pid, stat.cpu);
  }
  return out;
}

/** CPU seconds spent since `before` by processes of that name (new ones in full; ended ones are missed). */
function cpuSince(name: string, before: Map<string, number>): number {
  let total = 0;
  for (const [pid, cpu] of cpuByPid(name)) total += cpu - (before.get(pid) ?? 0);
  return total;
}

/** Asks the Tollgate process for a full GC and its memory afterwards (MB): resident set and V8 heap. */
async function memoryOf(started: Started): Promise<{ rss: number; heap: number }> {
  const seen = started.lines.length;
  started.child.kill('SIGUSR2');
  for (let i = 0; i < 100; i++) {
    const line = started.lines.slice(seen).find((l) => l.includes('"memory"'));
    if (line) {
      const { memory } = JSON.parse(line) as { memory: { rss: number; heapUsed: number } };
      return { rss: Math.round(memory.rss / 2 ** 20), heap: Math.round(memory.heapUsed / 2 ** 20) };
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error('the Tollgate process did not report its memory');
}

interface Target {
  name: 'direct' | 'passthrough' | 'tollgate' | 'tollgate+limits' | 'tollgate+traces';
  origin: string;
  path: string;
  headers: Record<string, string>;
  model: string;
  /** The process whose CPU is counted: the provider (direct), the passthrough or Tollgate. */
  pid: number;
}

interface Cell {
  target: Target['name'];
  concurrency: number;
  stream: boolean;
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  /** CPU milliseconds per request: the proxy process (or the provider, for direct) and Postgres. */
  cpuProxy: number;
  cpuPostgres: number;
  /** CPU milliseconds per request of the provider process and of this load generator. */
  cpuUpstream: number;
  cpuLoad: number;
}

function bodies(model: string, stream: boolean): string[] {
  return Array.from({ length: USERS }, (_, i) =>
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

function percentile(sorted: Float64Array, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))]!;
}

/** A closed loop: `concurrency` workers, each sending its next request when the last one finished. */
async function load(
  target: Target,
  concurrency: number,
  stream: boolean,
  total: number,
  warmup: number,
  pid = 0,
  upstreamPid = 0,
): Promise<Cell> {
  const pool = new Pool(target.origin, { connections: concurrency, pipelining: 1, keepAliveTimeout: 30_000 });
  const payloads = bodies(target.model, stream);
  const headers = { 'content-type': 'application/json', ...target.headers };
  const latencies = new Float64Array(total);
  let errors = 0;
  const one = async (i: number, record: boolean) => {
    const started = performance.now();
    const res = await pool.request({
      path: target.path,
      method: 'POST',
      headers,
      body: payloads[i % payloads.length],
    });
    let first = 0;
    for await (const _chunk of res.body) if (!first) first = performance.now();
    const ended = performance.now();
    if (res.statusCode !== 200) errors++;
    if (record) latencies[i] = (stream ? first || ended : ended) - started;
  };
  const run = async (count: number, record: boolean) => {
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let i = next++; i < count; i = next++) await one(i, record);
      }),
    );
  };
  await run(warmup, false);
  const cpuBefore = [cpuSeconds(pid), cpuSeconds(upstreamPid)];
  const postgresBefore = cpuByPid('postgres');
  const loadBefore = process.cpuUsage();
  const began = performance.now();
  await run(total, true);
  const seconds = (performance.now() - began) / 1000;
  const cpuProxy = ((cpuSeconds(pid) - cpuBefore[0]!) * 1000) / total;
  const cpuPostgres = (cpuSince('postgres', postgresBefore) * 1000) / total;
  const cpuUpstream = ((cpuSeconds(upstreamPid) - cpuBefore[1]!) * 1000) / total;
  const loadUsage = process.cpuUsage(loadBefore);
  const cpuLoad = (loadUsage.user + loadUsage.system) / 1000 / total;
  await pool.close();
  const sorted = latencies.slice().sort();
  return {
    target: target.name,
    concurrency,
    stream,
    requests: total,
    rps: Math.round(total / seconds),
    p50: percentile(sorted, 0.5),
    p99: percentile(sorted, 0.99),
    errors,
    cpuProxy,
    cpuPostgres,
    cpuUpstream,
    cpuLoad,
  };
}

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
  out.push(
    `- Load average when the run started: ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(', ')}`,
  );
  return out;
}

const ms = (v: number) => v.toFixed(2);

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
  const machineLines = machine();
  machineLines.push(await probeDatabase());
  console.log(machineLines.join('\n'));
  const upstream = await start('upstream.ts', {});
  const passthrough = await start('passthrough.ts', { UPSTREAM: upstream.info.baseUrl! });
  const tollgate = await start(
    'tollgate.ts',
    { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: String(USERS) },
    // The young generation the image's entry point sets (Dockerfile).
    ['--expose-gc', '--max-semi-space-size=16'],
  );
  const traced = process.env.BENCH_TRACES === '1' ? await startTraced(upstream.info.baseUrl!) : undefined;
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
  let tollgateRequests = 0;
  const memory: Array<[number, { rss: number; heap: number }]> = [];

  // Warm everything up once (JIT, connection pools, caches), then the matrix.
  for (const target of targets) await load(target, 16, false, 2000, 500);
  tollgateRequests += 5000;
  memory.push([tollgateRequests, await memoryOf(tollgate)]);

  const cells: Cell[] = [];
  const batchLines: string[] = [];
  for (const stream of [false, true]) {
    for (const concurrency of CONCURRENCY) {
      const total = concurrency === 1 ? Math.max(1000, Math.round(PER_CELL / 3)) : PER_CELL;
      const warmup = Math.min(500, Math.round(total / 5));
      for (const target of targets) {
        const before = target.name === 'tollgate' ? await batchStats(tollgate.info.url!) : undefined;
        const cell = await load(target, concurrency, stream, total, warmup, target.pid, upstream.child.pid!);
        if (before) {
          const after = await batchStats(tollgate.info.url!);
          const line = (statement: 'hold' | 'close') => {
            const n = after[statement].count - before[statement].count;
            const size = (after[statement].size - before[statement].size) / n;
            const took = (1000 * (after[statement].seconds - before[statement].seconds)) / n;
            return `${statement} ${size.toFixed(1)} requests in ${took.toFixed(2)} ms`;
          };
          batchLines.push(
            `- ${stream ? 'streaming' : 'non-streaming'}, concurrency ${concurrency}: ${line('hold')}, ${line('close')} per batch on average`,
          );
        }
        if (target.name.startsWith('tollgate')) tollgateRequests += total + warmup;
        cells.push(cell);
        console.log(
          `${stream ? 'stream ' : 'plain  '} c=${String(concurrency).padStart(2)} ${target.name.padEnd(11)} ` +
            `${String(cell.rps).padStart(6)} req/s  p50 ${ms(cell.p50)} ms  p99 ${ms(cell.p99)} ms  errors ${cell.errors}  ` +
            `cpu/req ${ms(cell.cpuProxy)} ms (+ postgres ${ms(cell.cpuPostgres)} ms)`,
        );
      }
    }
  }
  memory.push([tollgateRequests, await memoryOf(tollgate)]);

  // Soak: keep going through Tollgate until SOAK requests in total, sampling memory.
  const soakTarget = targets[2]!;
  const step = 20_000;
  while (tollgateRequests < SOAK) {
    const count = Math.min(step, SOAK - tollgateRequests);
    await load(soakTarget, 16, false, count, 0);
    tollgateRequests += count;
    memory.push([tollgateRequests, await memoryOf(tollgate)]);
    console.log(
      `soak: ${tollgateRequests} requests through Tollgate, RSS ${memory.at(-1)![1].rss} MB, heap ${memory.at(-1)![1].heap} MB`,
    );
  }

  if (traced) {
    await stop(traced.tollgate);
    traced.receiver.close();
    console.log(`tollgate+traces exported ${traced.spans()} bytes of spans`);
  }
  const ledgerLines = await stop(tollgate);
  await stop(passthrough);
  await stop(upstream);
  const ledger = ledgerLines.map((l) => JSON.parse(l)).find((l) => l.ledger)?.ledger;

  const report = render(cells, memory, machineLines, startedAt, ledger, batchLines);
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
  return { hold: of('hold'), close: of('close') };
}

function render(
  cells: Cell[],
  memory: Array<[number, { rss: number; heap: number }]>,
  machineLines: string[],
  startedAt: Date,
  ledger: Record<string, string> | undefined,
  batchLines: string[],
): string {
  const find = (target: string, c: number, stream: boolean) =>
    cells.find((x) => x.target === target && x.concurrency === c && x.stream === stream)!;
  const rows: string[] = [];
  const verdicts: string[] = [];
  for (const stream of [false, true]) {
    for (const c of CONCURRENCY) {
      const direct = find('direct', c, stream);
      const pass = find('passthrough', c, stream);
      const toll = find('tollgate', c, stream);
      const limits = find('tollgate+limits', c, stream);
      const traces = cells.find(
        (x) => x.target === 'tollgate+traces' && x.concurrency === c && x.stream === stream,
      );
      const share = Math.round((toll.rps / pass.rps) * 100);
      if (traces)
        verdicts.push(
          `- ${stream ? 'Streaming' : 'Non-streaming'}, concurrency ${c}: traces on add ${ms(traces.p50 - toll.p50)} ms at p50, ${ms(traces.p99 - toll.p99)} ms at p99 and ${ms(traces.cpuProxy - toll.cpuProxy)} ms of CPU per request, at ${Math.round((traces.rps / toll.rps) * 100)} % of the throughput without.`,
        );
      for (const cell of [direct, pass, toll, limits, ...(traces ? [traces] : [])]) {
        const cellShare = Math.round((cell.rps / pass.rps) * 100);
        const added =
          cell.target === 'direct' ? '—' : `+${ms(cell.p50 - direct.p50)} / +${ms(cell.p99 - direct.p99)}`;
        rows.push(
          `| ${stream ? 'stream (TTFB)' : 'non-streaming'} | ${c} | ${cell.target} | ${cell.rps} | ${ms(cell.p50)} | ${ms(cell.p99)} | ${added} | ${cell.target.startsWith('tollgate') ? `${cellShare} %` : ''} | ${ms(cell.cpuProxy)} | ${cell.target.startsWith('tollgate') ? ms(cell.cpuPostgres) : ''} | ${cell.errors} |`,
        );
      }
      if (c === 1) {
        const addedP50 = toll.p50 - direct.p50;
        const addedP99 = toll.p99 - direct.p99;
        verdicts.push(
          `- ${stream ? 'Streaming' : 'Non-streaming'}, concurrency 1: Tollgate adds ${ms(addedP50)} ms at p50 (target ≤ 1 ms: ${addedP50 <= 1 ? 'met' : 'missed'}) and ${ms(addedP99)} ms at p99 (target ≤ 3 ms: ${addedP99 <= 3 ? 'met' : 'missed'}).`,
        );
      } else {
        verdicts.push(
          `- ${stream ? 'Streaming' : 'Non-streaming'}, concurrency ${c}: Tollgate serves ${share} % of the passthrough's throughput (target ≥ 60 %: ${share >= 60 ? 'met' : 'missed'}).`,
        );
      }
    }
  }
  const first = memory[0]!;
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
  const toll16 = budget('tollgate');
  const cpuLine =
    `CPU per request at concurrency 16, non-streaming (all processes share ${os.cpus().length} cores): ` +
    `passthrough ${ms(pass16.proxy)} ms + provider ${ms(pass16.cell.cpuUpstream)} + load generator ${ms(pass16.cell.cpuLoad)} = ${ms(pass16.total)} ms ` +
    `(a ceiling of about ${pass16.ceiling} req/s); Tollgate ${ms(toll16.proxy)} ms + Postgres ${ms(toll16.postgres)} + provider ${ms(toll16.cell.cpuUpstream)} + load generator ${ms(toll16.cell.cpuLoad)} = ${ms(toll16.total)} ms ` +
    `(about ${toll16.ceiling} req/s). Postgres CPU counts every Postgres process, other sessions' included.`;
  return [
    `Run on ${startedAt.toISOString().slice(0, 16).replace('T', ' ')} UTC with \`npm run bench:proxy\` (${PER_CELL} requests per cell at concurrency 16 and 64, ${Math.max(1000, Math.round(PER_CELL / 3))} at concurrency 1, after a warm-up; requests spread over ${USERS} users).`,
    '',
    ...machineLines,
    '',
    '"tollgate+limits" is the same Tollgate process serving a second project with rate limits (project, key and user; requests and tokens per minute) and spend caps (day, month), all high enough never to refuse: each request also runs the Redis scripts of src/limits.',
    ...(cells.some((c) => c.target === 'tollgate+traces')
      ? [
          '',
          '"tollgate+traces" (`BENCH_TRACES=1`) is a second Tollgate process with OpenTelemetry traces on, every request sampled and exported over OTLP/HTTP (protobuf) to a receiver in the load generator that discards them.',
        ]
      : []),
    '',
    'Latency is milliseconds for the whole response (non-streaming) or to the first byte of the body (streaming). "Added" is the p50 / p99 over going direct; "share" is Tollgate\'s throughput as a part of the passthrough\'s in the same run. "CPU ms/req" is the CPU time (user + system) the measured process spent per request: the provider for direct, the proxy process otherwise; "Postgres CPU" is that of every Postgres process during Tollgate\'s cells.',
    '',
    '| mode | concurrency | target | req/s | p50 ms | p99 ms | added p50 / p99 ms | share | CPU ms/req | Postgres CPU ms/req | errors |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
    ...rows,
    '',
    ...verdicts,
    '',
    cpuLine,
    '',
    "Group commit in Tollgate's cells (from its `tollgate_billing_batch_*` metrics; a close is the settle):",
    '',
    ...batchLines,
    '',
    `Memory of the Tollgate process after a full GC (V8 heap used / resident set): ${memory.map(([n, m]) => `${m.heap} / ${m.rss} MB after ${n.toLocaleString('en-US')}`).join(', ')} requests — the heap ${growth <= 0 ? 'did not grow' : `grew by ${growth} MB`} from the first sample to the last.`,
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
  .finally(() => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGTERM');
  });
