import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import os from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { type AppContext, createContext } from '../src/app/context.ts';
import { loadConfig } from '../src/config/index.ts';
import { newId } from '../src/core/ids.ts';
import { createProject } from '../src/projects/service.ts';
import { createSubscription } from '../src/webhooks/subscriptions.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../src/webhooks/worker/index.ts';
import { writeResultsBlock } from './report.ts';

/**
 * `npm run bench:webhooks`: with 1, 100 and 1 000 subscriptions on one project,
 * 1. throughput: a backlog of events (BENCH_DELIVERIES deliveries in all, default 6 000) is written while
 *    no worker runs; one worker then fans it out and delivers it to a local receiver (a separate
 *    process) — events fanned out per second and deliveries per second;
 * 2. latency: events are committed at a steady rate of BENCH_RATE deliveries per second (default 1 000)
 *    for BENCH_SECONDS (default 5) while the worker runs — p50/p99 from the event's commit to its
 *    receipt, and the delivery rate achieved.
 * Real Postgres and Redis (DATABASE_URL, REDIS_URL; the local defaults otherwise), one worker with the
 * configured concurrency. Writes docs/benchmarks.md between the webhook markers (BENCH_WRITE=0: print only).
 */

// ---- the receiver (this file run with --receiver) ----
function runReceiver(): void {
  let received: Array<[string, number]> = [];
  const server = createServer((req, res) => {
    if (req.method === 'GET') {
      if (req.url === '/count') {
        res.end(String(received.length));
      } else {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify(received));
        received = [];
      }
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const at = performance.timeOrigin + performance.now();
      // The event id without parsing the whole body: the receiver should cost as little as possible.
      const text = Buffer.concat(chunks).toString('latin1');
      const from = text.indexOf('"event":{"id":"') + 15;
      received.push([text.slice(from, text.indexOf('"', from)), at]);
      res.writeHead(200);
      res.end('ok');
    });
  });
  server.keepAliveTimeout = 30_000;
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${(server.address() as { port: number }).port}\n`);
  });
}

// ---- the driver ----
const DELIVERIES = Number(process.env.BENCH_DELIVERIES ?? 6000);
const RATE = Number(process.env.BENCH_RATE ?? 1000);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const SUBSCRIPTIONS = (process.env.BENCH_SUBSCRIPTIONS ?? '1,100,1000').split(',').map(Number);
const children: ChildProcess[] = [];

async function startReceiver(): Promise<number> {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--receiver'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  const line = await new Promise<string>((resolve) => {
    createInterface({ input: child.stdout! }).once('line', resolve);
  });
  return Number(line);
}

async function receiverGet(port: number, path: string): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  return res.text();
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function envelope(projectId: string, owner: string, id: string) {
  return {
    id,
    paywallId: projectId,
    ownerUserId: owner,
    type: 'balance.deposit.created',
    version: '1.0',
    status: 'pending',
    createdAt: new Date().toISOString(),
    trigger: { source: 'bench', actorType: 'bench', actorId: 'bench' },
    subject: { type: 'user', id: 'usr_bench', externalId: 'bench' },
    data: { amount: '1.00', currency: 'usd' },
    metadata: {},
  };
}

/** Commits `count` events in one statement; returns their ids. */
async function writeEvents(
  ctx: AppContext,
  projectId: string,
  owner: string,
  count: number,
): Promise<string[]> {
  const rows = Array.from({ length: count }, () => {
    const id = newId('evt');
    return { id, p: projectId, env: envelope(projectId, owner, id) };
  });
  await sql`
    INSERT INTO events (id, project_id, type, version, envelope)
    SELECT x.id, x.p, 'balance.deposit.created', '1.0', x.env
    FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS x(id text, p text, env jsonb)`.execute(ctx.db);
  return rows.map((r) => r.id);
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

interface Row {
  shape: WorkerShape;
  subscriptions: number;
  events: number;
  deliveries: number;
  fanoutPerSec: number;
  deliveriesCreatedPerSec: number;
  deliveriesPerSec: number;
  latencyRate: number;
  achievedRate: number;
  p50: number;
  p99: number;
  latencySamples: number;
  /** Mean time of one HTTP request to the receiver, as the worker measured it. */
  requestMs: number;
}

async function meanRequestMs(ctx: AppContext): Promise<number> {
  const { values } = await ctx.metrics.deliveryLatency.get();
  const sum = values.filter((v) => v.metricName?.endsWith('_sum')).reduce((a, v) => a + v.value, 0);
  const count = values.filter((v) => v.metricName?.endsWith('_count')).reduce((a, v) => a + v.value, 0);
  return count ? (sum / count) * 1000 : Number.NaN;
}

async function waitCount(port: number, target: number, timeoutMs: number): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const n = Number(await receiverGet(port, '/count'));
    if (n >= target || Date.now() > deadline) return n;
    await sleep(20);
  }
}

interface WorkerShape {
  concurrency: number;
  perSubscription: number;
}

async function projectWith(ctx: AppContext, port: number, n: number) {
  const { project } = await createProject(ctx.db, ctx.sealer, { name: `bench ${n}`, currency: 'usd' });
  for (let i = 0; i < n; i++) {
    await createSubscription(
      ctx,
      project.id,
      { url: `http://127.0.0.1:${port}/hook/${i}`, events: ['balance.*'] },
      { createdBy: 'bench' },
    );
  }
  return project;
}

async function scenario(
  ctx: AppContext,
  port: number,
  n: number,
  project: { id: string; owner_user_id: string },
  shape: WorkerShape,
): Promise<Row> {
  await receiverGet(port, '/dump');

  ctx.metrics.deliveryLatency.reset();
  // 1. throughput on a backlog
  const events = Math.max(1, Math.round(DELIVERIES / n));
  const deliveries = events * n;
  for (let i = 0; i < events; i += 500)
    await writeEvents(ctx, project.id, project.owner_user_id, Math.min(500, events - i));
  const started = performance.now();
  let fanoutDone = 0;
  const worker: DeliveryWorker = startDeliveryWorker(ctx, shape);
  const fanoutWatch = (async () => {
    for (;;) {
      const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM events WHERE project_id = ${project.id} AND dispatched_at IS NULL`.execute(
        ctx.db,
      );
      if (Number(rows[0]!.n) === 0) {
        fanoutDone = performance.now() - started;
        return;
      }
      await sleep(10);
    }
  })();
  const got = await waitCount(port, deliveries, 300_000);
  const deliverMs = performance.now() - started;
  await fanoutWatch;
  await worker.stop(5000);
  if (got < deliveries) console.warn(`  only ${got} of ${deliveries} deliveries arrived`);
  await receiverGet(port, '/dump');

  // 2. latency at a steady rate
  const latencyWorker = startDeliveryWorker(ctx, shape);
  await latencyWorker.ready;
  const eventsPerSec = RATE / n;
  const tickMs = 10;
  const committed = new Map<string, number>();
  const t0 = performance.now();
  let sent = 0;
  const writes: Promise<void>[] = [];
  while (performance.now() - t0 < SECONDS * 1000) {
    // As many events as the elapsed time asks for, whatever the timer's drift.
    const count = Math.floor(((performance.now() - t0) / 1000) * eventsPerSec) + 1 - sent;
    if (count > 0) {
      sent += count;
      writes.push(
        writeEvents(ctx, project.id, project.owner_user_id, count).then((ids) => {
          const at = performance.timeOrigin + performance.now();
          for (const id of ids) committed.set(id, at);
          ctx.events.wake();
        }),
      );
    }
    await sleep(tickMs);
  }
  await Promise.all(writes);
  const expected = sent * n;
  await waitCount(port, expected, 120_000);
  const phaseMs = performance.now() - t0;
  await latencyWorker.stop(5000);
  const received = JSON.parse(await receiverGet(port, '/dump')) as Array<[string, number]>;
  const latencies = received
    .map(([id, at]) => at - (committed.get(id) ?? Number.NaN))
    .filter((v) => Number.isFinite(v))
    .sort((a, b) => a - b);
  return {
    shape,
    subscriptions: n,
    events,
    deliveries,
    fanoutPerSec: events / (fanoutDone / 1000),
    deliveriesCreatedPerSec: deliveries / (fanoutDone / 1000),
    deliveriesPerSec: got / (deliverMs / 1000),
    latencyRate: RATE,
    achievedRate: received.length / (phaseMs / 1000),
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    latencySamples: latencies.length,
    requestMs: await meanRequestMs(ctx),
  };
}

function fmt(n: number, digits = 0): string {
  return Number.isFinite(n)
    ? n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })
    : '—';
}

const loadAverage = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(', ');
const loadAtStart = loadAverage();

function report(rows: Row[], ctx: AppContext, seconds: number): string {
  const c = ctx.config;
  return [
    `Measured ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC on ${os.cpus().length} × ${os.cpus()[0]?.model.trim() ?? 'CPU'}, Node ${process.version}, ${ctx.database.kind === 'postgres' ? 'Postgres' : 'embedded Postgres'} and ${ctx.bus.kind === 'redis' ? 'Redis' : 'the in-process bus'} on the same machine, which other workloads shared during the run (numbers are lower bounds of what the code does on a quiet machine). Load average (1, 5, 15 min) at the start: ${loadAtStart}; at the end: ${loadAverage()}.`,
    `One worker; "Worker" is its concurrency / per-subscription concurrency (the defaults are ${c.WEBHOOK_WORKER_CONCURRENCY} / ${c.WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY}, set by WEBHOOK_WORKER_CONCURRENCY and WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY). Receiver: a plain-HTTP keep-alive server in its own process answering 200 at once. Whole run: ${fmt(seconds)} s.`,
    '',
    '| Subscriptions | Worker | Backlog (events → deliveries) | Events fanned out/s | Deliveries created/s | Deliveries sent/s | Steady load (deliveries/s asked → achieved) | Commit → receipt p50 | p99 | Mean request |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${fmt(r.subscriptions)} | ${r.shape.concurrency} / ${r.shape.perSubscription} | ${fmt(r.events)} → ${fmt(r.deliveries)} | ${fmt(r.fanoutPerSec)} | ${fmt(r.deliveriesCreatedPerSec)} | ${fmt(r.deliveriesPerSec)} | ${fmt(r.latencyRate)} → ${fmt(r.achievedRate)} | ${fmt(r.p50, 1)} ms | ${fmt(r.p99, 1)} ms | ${fmt(r.requestMs, 1)} ms |`,
    ),
    '',
    'Before measuring, 2 000 deliveries warm the worker up and the tables are analysed (as autovacuum does on a live system). Throughput: events written while no worker ran, then one worker started; "fanned out" is the backlog divided by the time until no event was left undispatched, "sent" the deliveries divided by the time until the receiver had them all. Latency: events committed every 10 ms (fewer per second with more subscriptions so that deliveries per second stay at the asked rate), measured from the commit returning to the receiver reading the request, both clocks on this machine.',
  ].join('\n');
}

async function main(): Promise<void> {
  const config = loadConfig({
    LOG_LEVEL: 'warn',
    DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/test',
    REDIS_URL: 'redis://127.0.0.1:6379',
    ...process.env,
    TOLLGATE_ENCRYPTION_KEY: process.env.TOLLGATE_ENCRYPTION_KEY ?? randomBytes(32).toString('hex'),
    WEBHOOK_ALLOW_HTTP: 'true',
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
  });
  const schema = `bench_wh_${randomBytes(4).toString('hex')}`;
  const ctx = await createContext(config, { schema, busPrefix: `${schema}:` });
  const began = performance.now();
  try {
    await ctx.migrate();
    const port = await startReceiver();
    // Warm-up, then statistics as autovacuum keeps them on a live system: a table created seconds ago
    // has none, and the planner would scan every due row on each claim.
    {
      const warm = await projectWith(ctx, port, 10);
      await writeEvents(ctx, warm.id, warm.owner_user_id, 200);
      const worker = startDeliveryWorker(ctx);
      await waitCount(port, 2000, 120_000);
      await worker.stop(5000);
      await receiverGet(port, '/dump');
      await sql`ANALYZE`.execute(ctx.db);
    }
    const rows: Row[] = [];
    const shapes: WorkerShape[] = [
      {
        concurrency: config.WEBHOOK_WORKER_CONCURRENCY,
        perSubscription: config.WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY,
      },
      ...(process.env.BENCH_WIDE === '0' ? [] : [{ concurrency: 128, perSubscription: 32 }]),
    ];
    for (const n of SUBSCRIPTIONS) {
      const project = await projectWith(ctx, port, n);
      for (const shape of shapes) {
        console.log(`${n} subscription(s), worker ${shape.concurrency} / ${shape.perSubscription}…`);
        const row = await scenario(ctx, port, n, project, shape);
        console.log(
          `  backlog: ${fmt(row.fanoutPerSec)} events/s fanned out, ${fmt(row.deliveriesPerSec)} deliveries/s; steady ${fmt(row.achievedRate)}/s: p50 ${fmt(row.p50, 1)} ms, p99 ${fmt(row.p99, 1)} ms; mean request ${fmt(row.requestMs, 1)} ms`,
        );
        rows.push(row);
      }
    }
    const text = report(rows, ctx, (performance.now() - began) / 1000);
    console.log(`\n${text}`);
    if (process.env.BENCH_WRITE !== '0') writeResultsBlock('webhook-benchmark', 'Webhooks', text);
  } finally {
    if (ctx.database.kind === 'postgres')
      await sql
        .raw(`DROP SCHEMA ${schema} CASCADE`)
        .execute(ctx.db)
        .catch(() => {});
    await ctx.close();
  }
}

if (process.argv.includes('--receiver')) runReceiver();
else
  main()
    .catch((err) => {
      console.error(err);
      process.exitCode = 1;
    })
    .finally(() => {
      for (const child of children) if (child.exitCode === null) child.kill('SIGTERM');
    });
