import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, statSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createContext } from '../src/app/context.ts';
import { loadConfig } from '../src/config/index.ts';
import { applyPricing } from '../src/models/service.ts';
import { createProject } from '../src/projects/service.ts';
import { connectUser } from '../src/users/service.ts';
import { here, root } from './harness.ts';

/**
 * Tollgate as the benchmark runs it: the shipped `tollgate proxy` command (dist/bin/tollgate.js, the
 * bundle the image runs, rebuilt when its sources are newer; BENCH_FROM=source runs cmd/tollgate.ts from
 * source instead) on real Postgres and Redis, in a schema of its own, with a per-token model on the
 * benchmark's provider and BENCH_USERS connected users with large balances. The project has no webhook
 * subscriptions, so no events are written (as for any unsubscribed project). A second project, the same
 * but with rate limits (project, key, user; requests and tokens) and spend caps set high enough never to
 * refuse, measures what limits cost (src/limits).
 *
 * This process sets the schema up, then becomes the server (execve, same pid): the server starts fresh,
 * as a pod does, with none of the set-up's memory. bench/serving-probe.mjs, loaded into it, prints
 * `{"url", "apiKey", "limitsApiKey", "schema", "served"}` once it answers and its memory on SIGUSR2. On
 * SIGTERM the command shuts down as in production (settles in flight finish, slices go back); the
 * driver's `stop` (bench/harness.ts) then checks the ledger and drops the schema.
 */
const from = process.env.BENCH_FROM ?? 'bundle';
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
await ctx.close();

// The served process is the shipped command (`tollgate proxy`, bundled in dist/bin/ as the image runs
// it) or, with BENCH_FROM=source, cmd/tollgate.ts run from source. It replaces this one (execve: the same
// pid, so the driver's CPU and memory readings are the server's), with this process's Node flags.
const port = await freePort();
const database = new URL(config.DATABASE_URL!);
database.searchParams.set('options', `-c search_path=${schema}`);
if (!process.execve) throw new Error('bench/tollgate.ts needs process.execve (Node ≥ 22.15, not on Windows)');
process.execve(
  process.execPath,
  [
    process.execPath,
    ...process.execArgv.filter((a) => a !== '--expose-gc'),
    '--expose-gc',
    '--import',
    join(here, 'serving-probe.mjs'),
    entry(),
    'proxy',
  ],
  {
    ...process.env,
    NODE_ENV: 'production', // as the image
    HOST: '127.0.0.1',
    PORT: String(port),
    LOG_LEVEL: process.env.LOG_LEVEL ?? 'warn',
    DATABASE_URL: database.toString(),
    REDIS_URL: config.REDIS_URL ?? '',
    TOLLGATE_ENCRYPTION_KEY: config.TOLLGATE_ENCRYPTION_KEY!,
    TOLLGATE_DATA_DIR: config.TOLLGATE_DATA_DIR,
    TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
    BENCH_READY: JSON.stringify({
      url: `http://127.0.0.1:${port}`,
      apiKey,
      limitsApiKey: limited.apiKey,
      schema,
      served: from,
    }),
  },
);

/** The file the served process runs; the bundle is built first when a source file is newer than it. */
function entry(): string {
  if (from === 'source') return join(root, 'cmd/tollgate.ts');
  if (from !== 'bundle') throw new Error(`BENCH_FROM must be bundle or source, not ${from}`);
  const bundle = join(root, 'dist/bin/tollgate.js');
  const built = existsSync(bundle) ? statSync(bundle).mtimeMs : 0;
  const newest = Math.max(
    ...['cmd', 'src'].flatMap((dir) =>
      readdirSync(join(root, dir), { recursive: true, withFileTypes: true })
        .filter((f) => f.isFile())
        .map((f) => statSync(join(f.parentPath, f.name)).mtimeMs),
    ),
    statSync(join(root, 'rolldown.config.ts')).mtimeMs,
  );
  if (newest > built) {
    process.stderr.write('bench: building dist/bin (npm run build), its sources changed\n');
    execFileSync('npm', ['run', '--silent', 'build'], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  }
  return bundle;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
    server.once('error', reject);
  });
}
