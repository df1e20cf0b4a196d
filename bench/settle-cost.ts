import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createContext } from '../src/app/context.ts';
import {
  type ApplyItem,
  applyParameters,
  applySlices,
  type TakeItem,
  takeParameters,
  takeSlices,
} from '../src/billing/statements.ts';
import { loadConfig } from '../src/config/index.ts';
import { createProject } from '../src/projects/service.ts';
import { connectUser } from '../src/users/service.ts';

/**
 * `npm run bench:settle`: what one settle statement (`applySlices`, src/billing/statements.ts) costs
 * Postgres, read from its backend process's CPU time (/proc), with its latency from Node. A project in
 * a schema of its own, SETTLE_WALLETS wallets (default 1000; the planner sees their statistics) of which
 * SETTLE_BATCH (1) are settled per statement, in turn, each on its open slice — as a pod settles a
 * batch of requests. Each plan cache mode in turn (`auto`, Postgres's default, and
 * `force_generic_plan`, what the hot path's connections use: src/db/index.ts), durable and
 * SETTLE_COMMIT=async, SETTLE_STATEMENTS (3000) statements each; then the floor, a one-row `INSERT` with its
 * commit, durable and not.
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const WALLETS = Number(process.env.SETTLE_WALLETS ?? 1000);
const BATCH = Number(process.env.SETTLE_BATCH ?? 1);
const STATEMENTS = Number(process.env.SETTLE_STATEMENTS ?? 3000);
const schema = `bench_settle_${randomBytes(4).toString('hex')}`;
const trigger = { source: 'bench', actorType: 'admin', actorId: 'bench' };

const config = loadConfig({
  ...process.env,
  PORT: '0',
  LOG_LEVEL: 'warn',
  DATABASE_URL: url,
  TOLLGATE_ENCRYPTION_KEY: 'b'.repeat(64),
  TOLLGATE_DATA_DIR: mkdtempSync(join(tmpdir(), 'tollgate-bench-settle-')),
});
const ctx = await createContext(config, { schema });
const connect = async () => {
  const c = new pg.Client({ connectionString: url, options: `-c search_path=${schema}` });
  await c.connect();
  return c;
};
let client: pg.Client | undefined;
try {
  await ctx.migrate();
  const { project } = await createProject(ctx.db, ctx.sealer, {
    name: 'Settle',
    currency: 'usd',
    upstreamUrl: 'http://127.0.0.1:9/v1',
    upstreamKey: 'k',
  });
  const setup = await connect();
  // The wallets: connected, funded, each with an open slice of this "pod".
  const wallets: Array<{ userId: string; sliceId: string; seq: number }> = [];
  for (let i = 0; i < WALLETS; i++) {
    const externalId = `user-${i}`;
    await connectUser(ctx.db, ctx.events, project, externalId, trigger);
    await ctx.billing.deposit({ project, externalId, amount: '1000', source: 'bench', trigger });
    const sliceId = `hold_${randomBytes(10).toString('hex')}`;
    const take: TakeItem = {
      externalId,
      need: '1',
      want: '100',
      sliceId,
      purpose: 'chat',
      debtLimit: '0',
      seq: '0',
      reserved: '0',
    };
    const { rows } = await setup.query({
      name: takeSlices.name,
      text: takeSlices.text,
      values: takeParameters(project.id, [take], 'bench-pod', 3600),
    });
    wallets.push({ userId: rows[0].user_id, sliceId, seq: 0 });
  }
  await setup.query('ANALYZE');
  await setup.end();
  const metadata = JSON.stringify({
    requestId: 'req_01m8ax12za8ggfd8mchdv0xb0t',
    model: 'bench-model',
    api: 'chat',
    inputTokens: 14,
    cachedInputTokens: 0,
    outputTokens: 5,
    reasoningTokens: 0,
    usageSource: 'provider',
    outcome: 'success',
    holdAmount: '0.0000051',
  });
  let next = 0;
  const settle = (commit: 'on' | 'off') => {
    const batch = Array.from({ length: BATCH }, () => wallets[next++ % WALLETS]!).sort((a, b) =>
      a.sliceId < b.sliceId ? -1 : 1,
    );
    const items: ApplyItem[] = batch.map((w) => ({
      sliceId: w.sliceId,
      userId: w.userId,
      seq: String(++w.seq),
      charged: '0.0000051',
      released: '0.0000051',
      close: false,
      reserved: '0',
      entryId: `act_${randomBytes(10).toString('hex')}`,
      source: 'chat',
      description: 'chat bench-model: 14 input (0 cached) + 5 output tokens',
      metadata,
      events: null,
      threshold: null,
    }));
    return client!.query({
      name: applySlices.name,
      text: applySlices.text,
      values: applyParameters(project.id, items, commit),
    });
  };
  console.log(
    `${WALLETS} wallets, ${BATCH} settled per statement, ${STATEMENTS} statements per line (Postgres backend CPU and latency per statement)`,
  );
  for (const mode of ['auto', 'force_generic_plan']) {
    // A connection per mode: its plan cache starts empty.
    await client?.end();
    client = await connect();
    await client.query(`SET plan_cache_mode = ${mode}`);
    const backend: number = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    const cpuMs = () => {
      const fields = readFileSync(`/proc/${backend}/stat`, 'utf8').split(') ')[1]!.split(' ');
      return (Number(fields[11]) + Number(fields[12])) * 10; // utime + stime, in ticks of 10 ms
    };
    for (const commit of ['on', 'off'] as const) {
      for (let i = 0; i < 50; i++) await settle(commit);
      const times = new Float64Array(STATEMENTS);
      const before = cpuMs();
      for (let i = 0; i < STATEMENTS; i++) {
        const started = performance.now();
        await settle(commit);
        times[i] = performance.now() - started;
      }
      const cpu = (cpuMs() - before) / STATEMENTS;
      times.sort();
      const { rows } = await client.query(
        `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1`,
        [applySlices.name],
      );
      console.log(
        `plan_cache_mode ${mode.padEnd(18)} ${commit === 'on' ? 'durable' : 'async  '}  CPU ${cpu.toFixed(3)} ms  p50 ${times[STATEMENTS >> 1]!.toFixed(3)} ms  p99 ${times[Math.floor(STATEMENTS * 0.99)]!.toFixed(3)} ms  (plans so far: ${rows[0].generic_plans} generic, ${rows[0].custom_plans} custom)`,
      );
    }
  }
  // The floor: a one-row INSERT with its commit, on a connection of its own.
  await client?.end();
  client = await connect();
  await client.query(
    'CREATE TABLE floor_writes (id text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())',
  );
  for (const commit of ['on', 'off'] as const) {
    await client.query(`SET synchronous_commit = ${commit}`);
    const times = new Float64Array(STATEMENTS);
    for (let i = 0; i < STATEMENTS; i++) {
      const started = performance.now();
      await client.query({
        name: 'floor_write',
        text: 'INSERT INTO floor_writes (id) VALUES ($1)',
        values: [`w_${commit}_${i}`],
      });
      times[i] = performance.now() - started;
    }
    times.sort();
    console.log(
      `one-row INSERT (the floor)        ${commit === 'on' ? 'durable' : 'async  '}  p50 ${times[STATEMENTS >> 1]!.toFixed(3)} ms  p99 ${times[Math.floor(STATEMENTS * 0.99)]!.toFixed(3)} ms`,
    );
  }
} finally {
  await client?.end().catch(() => {});
  await ctx.db.schema
    .dropSchema(schema)
    .cascade()
    .execute()
    .catch(() => {});
  await ctx.close();
}
