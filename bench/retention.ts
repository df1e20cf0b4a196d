import os from 'node:os';
import { sql } from 'kysely';
import { Pool } from 'undici';
import { createContext } from '../src/app/context.ts';
import { loadConfig } from '../src/config/index.ts';
import { idBound } from '../src/core/ids.ts';
import { createProject } from '../src/projects/service.ts';
import { pruneOnce } from '../src/retention/index.ts';
import { createSubscription } from '../src/webhooks/subscriptions.ts';
import { start, stop, stopAll } from './harness.ts';
import { writeResultsBlock } from './report.ts';

/**
 * `node bench/retention.ts`: prunes about a million old rows (BENCH_PRUNE_ROWS, default 1 000 000: a
 * quarter each of events, webhook deliveries, their attempts and closed holds, all 40 days old) while
 * chat completions run through a real `tollgate proxy` (bench/tollgate.ts: real Postgres and Redis, the
 * mock provider) on the same database schema, and compares the chat load before, during and after the
 * pruning: requests per second, p50 and p99. Closed loop, BENCH_CONCURRENCY (16) clients,
 * BENCH_SECONDS (15) for the runs without pruning. Writes docs/benchmarks.md between the retention
 * markers (BENCH_WRITE=0: print only).
 */
const ROWS = Number(process.env.BENCH_PRUNE_ROWS ?? 1_000_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 16);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 15);
const USERS = 200;

interface LoadResult {
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
}

/** Chat completions in a closed loop until `until()` says stop. */
async function chatLoad(origin: string, apiKey: string, until: () => boolean): Promise<LoadResult> {
  const pool = new Pool(origin, { connections: CONCURRENCY, keepAliveTimeout: 30_000 });
  const latencies: number[] = [];
  let errors = 0;
  let n = 0;
  const began = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (!until()) {
        const i = n++;
        const started = performance.now();
        try {
          const res = await pool.request({
            path: '/v1/chat/completions',
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
            body: JSON.stringify({
              model: 'bench-model',
              user: `user-${i % USERS}`,
              max_tokens: 16,
              messages: [{ role: 'user', content: `Hello! This is request ${i}.` }],
            }),
          });
          await res.body.dump();
          if (res.statusCode !== 200) errors++;
        } catch (err) {
          // A connection reset (the server closing a kept-alive socket as it is reused) counts as an error.
          errors++;
          if (errors <= 3) console.warn(`request failed: ${(err as Error).message}`);
        }
        latencies.push(performance.now() - started);
      }
    }),
  );
  const seconds = (performance.now() - began) / 1000;
  await pool.close();
  latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))] ?? NaN;
  return { requests: latencies.length, rps: latencies.length / seconds, p50: at(0.5), p99: at(0.99), errors };
}

const fmt = (n: number, d = 0) =>
  n.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });
const load = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(', ');

async function main(): Promise<void> {
  const upstream = await start('upstream.ts', {});
  const tollgate = await start('tollgate.ts', {
    UPSTREAM: upstream.info.baseUrl!,
    BENCH_USERS: String(USERS),
    // The proxy's own retention job stays out of the way: this driver prunes.
    RETENTION_INTERVAL_SECONDS: '86400',
  });
  const config = loadConfig({
    LOG_LEVEL: 'warn',
    DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/test',
    REDIS_URL: 'redis://127.0.0.1:6379',
    ...process.env,
    TOLLGATE_ENCRYPTION_KEY: process.env.TOLLGATE_ENCRYPTION_KEY ?? 'b'.repeat(64),
    WEBHOOK_ALLOW_HTTP: 'true',
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
  });
  const ctx = await createContext(config, {
    schema: tollgate.info.schema!,
    busPrefix: `${tollgate.info.schema}-prune:`,
  });
  try {
    // Old rows in another project of the same schema (same tables, same indexes as the chat load).
    const quarter = Math.round(ROWS / 4);
    const { project } = await createProject(ctx.db, ctx.sealer, { name: 'old', currency: 'usd' });
    const { subscription } = await createSubscription(
      ctx,
      project.id,
      { url: 'http://127.0.0.1:9/old', events: ['*'] },
      { createdBy: 'bench' },
    );
    await sql`UPDATE webhook_subscriptions SET is_active = false WHERE id = ${subscription.id}`.execute(
      ctx.db,
    );
    await sql`INSERT INTO end_users (id, project_id, external_id) VALUES ('usr_old', ${project.id}, 'old')`.execute(
      ctx.db,
    );
    const seeding = performance.now();
    const old = sql`now() - interval '40 days'`;
    // Ids sort by creation time (retention finds old rows by id range): old rows carry old ids.
    const at = Date.now() - 40 * 24 * 3600_000;
    const [evt, dlv, hold] = [idBound('evt', at), idBound('dlv', at), idBound('hold', at)];
    await sql`
      INSERT INTO events (id, project_id, type, version, envelope, created_at, dispatched_at)
      SELECT ${evt} || lpad(g::text, 16, '0'), ${project.id}, 'balance.deposit.created', '1.0', '{"old":true}', ${old}, ${old}
      FROM generate_series(1, ${quarter}) g`.execute(ctx.db);
    await sql`
      INSERT INTO webhook_deliveries (id, project_id, subscription_id, event_id, event_type, status, attempts,
        attempt_limit, next_attempt_at, finished_at, created_at, updated_at, last_status)
      SELECT ${dlv} || lpad(g::text, 16, '0'), ${project.id}, ${subscription.id}, ${evt} || lpad(g::text, 16, '0'), 'balance.deposit.created',
        'success', 1, 8, ${old}, ${old}, ${old}, ${old}, 200
      FROM generate_series(1, ${quarter}) g`.execute(ctx.db);
    await sql`
      INSERT INTO webhook_attempts (delivery_id, attempt, claim_id, outcome, response_status, duration_ms, started_at, finished_at)
      SELECT ${dlv} || lpad(g::text, 16, '0'), 1, 'c', 'success', 200, 3, ${old}, ${old}
      FROM generate_series(1, ${quarter}) g`.execute(ctx.db);
    await sql`
      INSERT INTO holds (id, project_id, user_id, amount, status, purpose, expires_at, created_at, closed_at)
      SELECT ${hold} || lpad(g::text, 16, '0'), ${project.id}, 'usr_old', 1, 'settled', 'bench', ${old}, ${old}, ${old}
      FROM generate_series(1, ${quarter}) g`.execute(ctx.db);
    await sql`ANALYZE`.execute(ctx.db);
    const seedSeconds = (performance.now() - seeding) / 1000;
    console.log(`seeded ${fmt(quarter * 4)} old rows in ${fmt(seedSeconds, 1)} s (load ${load()})`);

    const origin = new URL(tollgate.info.url!).origin;
    const apiKey = tollgate.info.apiKey!;
    // Warm-up.
    {
      const until = performance.now() + 3000;
      await chatLoad(origin, apiKey, () => performance.now() > until);
    }
    const timed = async (label: string) => {
      const loadAt = load();
      const until = performance.now() + SECONDS * 1000;
      const r = await chatLoad(origin, apiKey, () => performance.now() > until);
      console.log(
        `${label}: ${fmt(r.rps)} req/s, p50 ${fmt(r.p50, 1)} ms, p99 ${fmt(r.p99, 1)} ms (load ${loadAt})`,
      );
      return { ...r, load: loadAt };
    };
    const before = await timed('chat alone, before');

    const loadDuring = load();
    let done = false;
    const pruneStarted = performance.now();
    const pruning = pruneOnce(ctx, { maxBatches: 1_000_000 }).finally(() => {
      done = true;
    });
    const during = await chatLoad(origin, apiKey, () => done);
    const counts = await pruning;
    const pruneSeconds = (performance.now() - pruneStarted) / 1000;
    const pruned = Object.values(counts).reduce((a, b) => a + b, 0);
    // Attempts go with their deliveries (ON DELETE CASCADE): count them as pruned rows too.
    const { rows: left } = await sql<{ n: string }>`
      SELECT (SELECT count(*) FROM webhook_attempts WHERE delivery_id LIKE ${`${dlv}%`}) AS n`.execute(
      ctx.db,
    );
    const attempts = quarter - Number(left[0]!.n);
    console.log(
      `chat while pruning: ${fmt(during.rps)} req/s, p50 ${fmt(during.p50, 1)} ms, p99 ${fmt(during.p99, 1)} ms; pruned ${fmt(pruned + attempts)} rows in ${fmt(pruneSeconds, 1)} s (load ${loadDuring})`,
    );
    const after = await timed('chat alone, after');

    const row = (label: string, r: LoadResult & { load?: string }, loadAt: string) =>
      `| ${label} | ${fmt(r.requests)} | ${fmt(r.rps)} | ${fmt(r.p50, 1)} ms | ${fmt(r.p99, 1)} ms | ${r.errors} | ${loadAt} |`;
    const text = [
      `Measured ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC on ${os.cpus().length} × ${os.cpus()[0]?.model.trim() ?? 'CPU'}, Node ${process.version}; Tollgate (\`tollgate proxy\`), the mock provider, Postgres, Redis and this driver on the same machine, shared with other workloads. Chat: ${CONCURRENCY} clients in a closed loop, per-token pricing (a hold, a settle and ledger entries per request).`,
      `Pruned: ${fmt(quarter)} events, ${fmt(quarter)} webhook deliveries, ${fmt(attempts)} attempts (deleted with their deliveries) and ${fmt(counts.holds)} closed holds, all 40 days old — ${fmt(pruned + attempts)} rows in ${fmt(pruneSeconds, 1)} s (${fmt((pruned + attempts) / pruneSeconds)} rows/s) by one retention pass at the defaults (batches of ${config.RETENTION_BATCH_SIZE}, SKIP LOCKED), in the same tables the chat load writes (holds).`,
      '',
      '| Chat load | Requests | Requests/s | p50 | p99 | Errors | Load average (1, 5, 15 min) at start |',
      '|---|---:|---:|---:|---:|---:|---|',
      row(`alone, before (${SECONDS} s)`, before, before.load),
      row('while pruning', during, loadDuring),
      row(`alone, after (${SECONDS} s)`, after, after.load),
    ].join('\n');
    console.log(`\n${text}`);
    if (process.env.BENCH_WRITE !== '0') writeResultsBlock('retention-benchmark', 'Retention', text);
  } finally {
    await ctx.close();
    await stop(tollgate);
    await stop(upstream);
  }
}

main()
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(stopAll);
