import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { createContext } from '../src/app/context.ts';
import { startServing } from '../src/cli/serve.ts';
import { loadConfig } from '../src/config/index.ts';
import { applyPricing } from '../src/models/service.ts';
import { createProject } from '../src/projects/service.ts';
import { connectUser } from '../src/users/service.ts';

/**
 * Tollgate as the benchmark runs it: a real `tollgate proxy` server (the same startServing as the CLI)
 * on real Postgres and Redis, in its own schema, with a per-token model on the benchmark's provider and
 * BENCH_USERS connected users with large balances. The project has no webhook subscriptions, so no
 * events are written (as for any unsubscribed project). A second project, the same but with rate limits
 * (project, key, user; requests and tokens) and spend caps set high enough never to refuse, measures
 * what limits cost (src/limits). Prints `{"url", "apiKey", "limitsApiKey", "schema"}` when ready.
 *
 * On SIGTERM it waits for settles in flight, gives its slices back (escrow), checks the ledger (balance = Σ entries, nothing held) and
 * reports what it found on stdout before dropping its schema.
 */
const schema = `bench_${randomBytes(4).toString('hex')}`;
const users = Number(process.env.BENCH_USERS ?? 1000);
const config = loadConfig({
  ...process.env,
  PORT: '0',
  HOST: '127.0.0.1',
  LOG_LEVEL: process.env.LOG_LEVEL ?? 'warn',
  DATABASE_URL: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  REDIS_URL: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  TOLLGATE_ENCRYPTION_KEY: process.env.TOLLGATE_ENCRYPTION_KEY ?? 'b'.repeat(64),
  TOLLGATE_DATA_DIR: mkdtempSync(join(tmpdir(), 'tollgate-bench-')),
  // The benchmark's provider listens on loopback.
  TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
});
const ctx = await createContext(config, { schema, busPrefix: `${schema}:` });
await ctx.migrate();
const trigger = { source: 'bench', actorType: 'admin', actorId: 'bench' };
const { project, apiKey } = await createProject(ctx.db, ctx.sealer, {
  name: 'Bench',
  currency: 'usd',
  upstreamUrl: process.env.UPSTREAM ?? 'http://127.0.0.1:8090/v1',
  upstreamKey: 'sk-bench',
});
const models = [
  {
    id: 'bench-model',
    upstreamModel: 'mock-model',
    pricing: { mode: 'per_token' as const, inputPerMillion: '0.15', outputPerMillion: '0.6' },
  },
];
await applyPricing(ctx.db, project.id, { currency: 'usd', models });
const limited = await createProject(ctx.db, ctx.sealer, {
  name: 'Bench with limits',
  currency: 'usd',
  upstreamUrl: process.env.UPSTREAM ?? 'http://127.0.0.1:8090/v1',
  upstreamKey: 'sk-bench',
});
await applyPricing(ctx.db, limited.project.id, {
  currency: 'usd',
  models,
  limits: {
    project: { rpm: 100_000_000, tpm: 1_000_000_000_000 },
    key: { rpm: 100_000_000 },
    user: { rpm: 1_000_000, tpm: 1_000_000_000 },
    spend: { daily: '1000000', monthly: '10000000' },
  },
});
for (const p of [project, limited.project]) {
  for (let i = 0; i < users; i += 20) {
    await Promise.all(
      Array.from({ length: Math.min(20, users - i) }, async (_, k) => {
        const externalId = `user-${i + k}`;
        await connectUser(ctx.db, ctx.events, p, externalId, trigger);
        await ctx.billing.deposit({
          project: p,
          externalId,
          amount: '100000.00',
          source: 'bench',
          trigger,
        });
      }),
    );
  }
}
const running = await startServing(ctx);

// The driver samples memory with SIGUSR2: a full GC, then the process's memory on stdout. The handler
// is in place before the ready line: until then SIGUSR2 would end the process.
process.on('SIGUSR2', () => {
  (globalThis as { gc?: () => void }).gc?.();
  const { rss, heapUsed } = process.memoryUsage();
  process.stdout.write(`${JSON.stringify({ memory: { rss, heapUsed } })}\n`);
});
process.stdout.write(
  `${JSON.stringify({ url: running.url, apiKey, limitsApiKey: limited.apiKey, schema })}\n`,
);

process.on('SIGTERM', async () => {
  const { chatServiceOf } = await import('../src/chat/routes.ts');
  await chatServiceOf(ctx)?.idle();
  // shutdown gives the pod's slices back (escrow): nothing may stay held after it
  await ctx.billing.close();
  const { rows } = await sql<{ users: string; bad: string; held: string; charges: string; charged: string }>`
    SELECT count(*) AS users,
           count(*) FILTER (WHERE e.balance <> coalesce(l.sum, 0) OR e.held <> coalesce(h.held, 0)) AS bad,
           sum(e.held) AS held,
           (SELECT count(*) FROM ledger_entries WHERE kind = 'charge') AS charges,
           (SELECT coalesce(-sum(amount), 0) FROM ledger_entries WHERE kind = 'charge') AS charged
    FROM end_users e
    LEFT JOIN (SELECT user_id, sum(amount) AS sum FROM ledger_entries GROUP BY user_id) l ON l.user_id = e.id
    LEFT JOIN (SELECT user_id, sum(amount) AS held FROM holds WHERE status = 'open' GROUP BY user_id) h
      ON h.user_id = e.id
  `.execute(ctx.db);
  process.stdout.write(`${JSON.stringify({ ledger: rows[0] })}\n`);
  await running.stop().catch(() => {});
  const cleanup = await createContext(config, {});
  await sql
    .raw(`DROP SCHEMA IF EXISTS ${schema} CASCADE`)
    .execute(cleanup.db)
    .catch(() => {});
  await cleanup.close();
  process.exit(0);
});
