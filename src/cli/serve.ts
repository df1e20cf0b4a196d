import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { hashPassword, signUp } from '../admin/accounts.ts';
import { type AppContext, createContext } from '../app/context.ts';
import { startJobs } from '../app/jobs.ts';
import { CLI_ACTOR } from '../audit/index.ts';
import { findWallet } from '../billing/ledger.ts';
import { type Config, isProduction, publicBaseUrl, testPaymentsAllowed } from '../config/index.ts';
import { randomToken } from '../core/ids.ts';
import { displayAmount } from '../core/money.ts';
import { pendingMigrations } from '../db/index.ts';
import { buildServer } from '../http/server.ts';
import { applyPricing } from '../models/service.ts';
import { connectionOf } from '../payments/connection.ts';
import { connectPayments } from '../payments/service.ts';
import { createProject, ECHO_UPSTREAM } from '../projects/service.ts';
import { connectUser } from '../users/service.ts';
import { startDeliveryWorker } from '../webhooks/worker/index.ts';

export interface Running {
  ctx: AppContext;
  app: FastifyInstance;
  url: string;
  stop(): Promise<void>;
}

/** Start-up failed for a reason the operator can fix; the message is the one line to print. */
export class StartupError extends Error {}

/** Builds and starts the HTTP server with the maintenance jobs; `stop` drains and closes everything. */
export async function startServing(ctx: AppContext): Promise<Running> {
  const app = await buildServer(ctx);
  try {
    await app.listen({ port: ctx.config.PORT, host: ctx.config.HOST });
  } catch (err) {
    await app.close().catch(() => {});
    throw listenError(err, ctx.config);
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : ctx.config.PORT;
  ctx.publicBaseUrl = publicBaseUrl(ctx.config, port);
  const stopJobs = startJobs(ctx);
  const url = `http://${ctx.config.HOST === '0.0.0.0' ? 'localhost' : ctx.config.HOST}:${port}`;
  // A second process refused by the embedded database's lock is told where this one answers.
  ctx.database.lock?.setUrl(url);
  return {
    ctx,
    app,
    url,
    async stop() {
      await stopJobs();
      await app.close();
      await ctx.close();
    },
  };
}

function listenError(err: unknown, config: Config): Error {
  const code = (err as { code?: string }).code;
  const where = `${config.HOST}:${config.PORT}`;
  if (code === 'EADDRINUSE') {
    return new StartupError(
      `port ${config.PORT} is already in use (${where}): stop the process using it, or set PORT to a free port`,
    );
  }
  if (code === 'EACCES') {
    return new StartupError(`not allowed to listen on ${where}: set PORT to a port above 1023`);
  }
  if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND') {
    return new StartupError(`cannot listen on ${where}: HOST is not an address of this machine (set HOST)`);
  }
  return err instanceof Error ? err : new Error(String(err));
}

/**
 * Resolves when SIGINT or SIGTERM arrives. `dispose` removes the handlers, so that after a failed start a
 * Ctrl+C is not swallowed.
 */
function untilSignal(): { signal: Promise<string>; dispose(): void } {
  let on: (signal: string) => void = () => {};
  const signal = new Promise<string>((resolveSignal) => {
    on = (name: string) => resolveSignal(name);
    process.once('SIGINT', on);
    process.once('SIGTERM', on);
  });
  return {
    signal,
    dispose() {
      process.off('SIGINT', on);
      process.off('SIGTERM', on);
    },
  };
}

/** Runs the start-up steps of a server; when one fails, closes what was opened (the context) first. */
async function starting<T>(ctx: AppContext, steps: () => Promise<T>): Promise<T> {
  try {
    return await steps();
  } catch (err) {
    await ctx.close().catch(() => {});
    throw err;
  }
}

export async function runProxy(config: Config, options: { migrate: boolean }): Promise<number> {
  const signals = untilSignal();
  try {
    return await proxy(config, options, signals.signal);
  } finally {
    signals.dispose();
  }
}

async function proxy(config: Config, options: { migrate: boolean }, stopRequested: Promise<string>) {
  const ctx = await createContext(config);
  const running = await starting(ctx, async () => {
    await prepareProxy(ctx, options);
    return startServing(ctx);
  });
  ctx.log.info(
    { url: running.url, database: ctx.database.kind, bus: ctx.bus.kind },
    `tollgate proxy listening on ${running.url} (database: ${ctx.database.kind}, bus: ${ctx.bus.kind})`,
  );
  const signal = await stopRequested;
  ctx.log.info(`${signal} received: draining in-flight requests`);
  await running.stop();
  return 0;
}

async function prepareProxy(ctx: AppContext, options: { migrate: boolean }): Promise<void> {
  if (options.migrate) {
    const applied = await ctx.migrate();
    if (applied.length) ctx.log.info({ applied }, `applied migrations: ${applied.join(', ')}`);
  } else {
    const pending = await pendingMigrations(ctx.database);
    if (pending.length) {
      ctx.log.warn(
        { pending },
        'migrations are pending: run `tollgate migrate`; /readyz reports not ready until then',
      );
    }
  }
}

interface DevState {
  projectId: string;
  apiKey: string;
  /** The demo project was given test payments once (a developer who disconnects them keeps that). */
  testPayments?: boolean;
  /** The first dashboard login (made on first start; older data directories get one on the next). */
  admin?: { email: string; password: string };
}

export const DEV_ADMIN_EMAIL = 'admin@localhost';

/**
 * The dev server's full-access admin token: TOLLGATE_ADMIN_TOKEN, or one generated once and kept in
 * TOLLGATE_DATA_DIR (like the encryption key), so the printed TOLLGATE_ADMIN_TOKEN stays valid.
 */
export function devAdminToken(config: Config): string {
  if (config.TOLLGATE_ADMIN_TOKEN) return config.TOLLGATE_ADMIN_TOKEN;
  const dir = resolve(config.TOLLGATE_DATA_DIR);
  const file = join(dir, 'admin.token');
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true });
    writeFileSync(file, `tga_dev_${randomToken(24)}`, { mode: 0o600 });
  }
  return readFileSync(file, 'utf8').trim();
}

/** The first developer account of a dev server; it owns the demo project, so the dashboard shows it. */
async function ensureDevAdmin(ctx: AppContext, state: DevState): Promise<DevState> {
  if (state.admin) return state;
  const existing = await ctx.db
    .selectFrom('developers')
    .select('id')
    .where('email', '=', DEV_ADMIN_EMAIL)
    .executeTakeFirst();
  const password = randomToken(12);
  let developerId = existing?.id;
  if (existing) {
    await ctx.db
      .updateTable('developers')
      .set({ password_hash: await hashPassword(password) })
      .where('id', '=', existing.id)
      .execute();
  } else {
    const created = await signUp(ctx.db, { email: DEV_ADMIN_EMAIL, password });
    if (!created) throw new Error(`${DEV_ADMIN_EMAIL} was created by another process; start again`);
    developerId = created.id;
  }
  await ctx.db
    .updateTable('projects')
    .set({ owner_user_id: developerId! })
    .where('id', '=', state.projectId)
    .execute();
  await ctx.projects.changed(state.projectId);
  return { ...state, admin: { email: DEV_ADMIN_EMAIL, password } };
}

export const DEV_USER = 'demo-user';
export const DEV_MODEL = 'demo-echo';
export const DEV_EMBEDDING_MODEL = 'demo-embed';

/** Creates the demo project, key, model and user once; later starts reuse them (kept in the data dir). */
export async function seedDev(ctx: AppContext): Promise<DevState> {
  const file = join(resolve(ctx.config.TOLLGATE_DATA_DIR), 'dev.json');
  if (existsSync(file)) {
    const state = JSON.parse(readFileSync(file, 'utf8')) as DevState;
    const found = await ctx.db
      .selectFrom('projects')
      .select('id')
      .where('id', '=', state.projectId)
      .executeTakeFirst();
    if (found) {
      if (state.admin) return state;
      const withAdmin = await ensureDevAdmin(ctx, state);
      writeFileSync(file, JSON.stringify(withAdmin, null, 2), { mode: 0o600 });
      return withAdmin;
    }
  }
  const created = await createProject(ctx.db, ctx.sealer, {
    name: 'Demo',
    currency: 'usd',
    upstreamUrl: ECHO_UPSTREAM,
  });
  await applyPricing(ctx.db, created.project.id, {
    currency: 'usd',
    models: [
      { id: DEV_MODEL, pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' } },
      {
        id: 'demo-per-request',
        upstreamModel: DEV_MODEL,
        pricing: { mode: 'per_request', perRequest: '0.01' },
      },
      {
        id: DEV_EMBEDDING_MODEL,
        pricing: { mode: 'per_token', inputPerMillion: '0.1' },
        endpoints: ['embeddings'],
      },
    ],
  });
  const trigger = { source: 'dev', actorType: 'admin', actorId: 'dev' };
  await connectUser(ctx.db, ctx.events, created.project, DEV_USER, trigger);
  await ctx.billing.deposit({
    project: created.project,
    externalId: DEV_USER,
    amount: '10.00',
    source: 'dev',
    trigger,
  });
  const state = await ensureDevAdmin(ctx, { projectId: created.project.id, apiKey: created.apiKey });
  // With DATABASE_URL nothing else has made the data directory yet.
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, JSON.stringify(state, null, 2), { mode: 0o600 });
  return state;
}

/**
 * The demo project pays through the test provider (a test checkout, no account, no network): connected
 * once, when test payments are on and nothing else is connected; dev.json remembers it was done.
 */
async function ensureDemoPayments(ctx: AppContext, state: DevState): Promise<void> {
  if (state.testPayments || !testPaymentsAllowed(ctx.config)) return;
  if (!(await connectionOf(ctx, state.projectId)))
    await connectPayments(ctx, state.projectId, { provider: 'test' }, CLI_ACTOR);
  const file = join(resolve(ctx.config.TOLLGATE_DATA_DIR), 'dev.json');
  writeFileSync(file, JSON.stringify({ ...state, testPayments: true }, null, 2), { mode: 0o600 });
}

/** The demo user's line: what it was given on the first start, what it has on the next ones. */
async function demoUserLine(ctx: AppContext, state: DevState, firstStart: boolean): Promise<string> {
  if (firstStart) return `${DEV_USER} (connected, 10.00 usd to start)`;
  const wallet = await findWallet(ctx.db, state.projectId, DEV_USER);
  if (!wallet) return `${DEV_USER} (not connected)`;
  // at the currency's precision, as the dashboard shows it
  const usd = (v: string) => displayAmount(v, 'usd');
  return `${DEV_USER} (balance ${usd(wallet.balance)} usd, ${usd(wallet.available)} available)`;
}

export async function runDev(config: Config): Promise<number> {
  const signals = untilSignal();
  try {
    return await dev(config, signals.signal);
  } finally {
    signals.dispose();
  }
}

async function dev(config: Config, stopRequested: Promise<string>): Promise<number> {
  // In dev, webhooks may go to plain-HTTP and local receivers unless the environment says otherwise.
  const ctx = await createContext({
    ...config,
    // A development server is not for the network: loopback unless HOST says otherwise.
    HOST: process.env.HOST?.trim() ? config.HOST : '127.0.0.1',
    TOLLGATE_ADMIN_TOKEN: devAdminToken(config),
    WEBHOOK_ALLOW_HTTP: process.env.WEBHOOK_ALLOW_HTTP?.trim() ? config.WEBHOOK_ALLOW_HTTP : true,
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: process.env.WEBHOOK_ALLOW_PRIVATE_NETWORKS?.trim()
      ? config.WEBHOOK_ALLOW_PRIVATE_NETWORKS
      : true,
    // Providers on this machine (Ollama, vLLM, a mock) and open sign-up, unless the environment says otherwise.
    TOLLGATE_ALLOW_PRIVATE_PROVIDERS: process.env.TOLLGATE_ALLOW_PRIVATE_PROVIDERS?.trim()
      ? config.TOLLGATE_ALLOW_PRIVATE_PROVIDERS
      : true,
    TOLLGATE_SIGNUP: process.env.TOLLGATE_SIGNUP?.trim() ? config.TOLLGATE_SIGNUP : 'open',
    // Test payments (a test checkout, no network), unless the environment says otherwise; never in production.
    TOLLGATE_TEST_PAYMENTS: process.env.TOLLGATE_TEST_PAYMENTS?.trim()
      ? config.TOLLGATE_TEST_PAYMENTS
      : !isProduction(config),
  });
  const firstStart = !existsSync(join(resolve(config.TOLLGATE_DATA_DIR), 'dev.json'));
  const { state, running, demoUser } = await starting(ctx, async () => {
    const applied = await ctx.migrate();
    if (applied.length) ctx.log.info(`applied migrations: ${applied.join(', ')}`);
    const state = await seedDev(ctx);
    const running = await startServing(ctx);
    // (after binding: the test provider's webhook endpoint is this server's address)
    await ensureDemoPayments(ctx, state);
    return { state, running, demoUser: await demoUserLine(ctx, state, firstStart) };
  });
  // Webhooks are fanned out and delivered in this process.
  const worker = startDeliveryWorker(ctx);
  const base = publicBaseUrl(
    config,
    running.app.server.address() ? (running.app.server.address() as { port: number }).port : undefined,
  );
  const where =
    ctx.database.kind === 'embedded'
      ? `embedded Postgres in ${resolve(config.TOLLGATE_DATA_DIR, 'pgdata')}`
      : 'DATABASE_URL';
  process.stdout.write(
    [
      '',
      `Tollgate dev is running at ${base}/v1`,
      `  database:   ${where}`,
      `  bus:        ${ctx.bus.kind === 'redis' ? 'Redis (REDIS_URL)' : 'in-process (no REDIS_URL)'}`,
      `  project:    ${state.projectId}`,
      `  API key:    ${state.apiKey}`,
      `  models:     ${DEV_MODEL} (per token), demo-per-request (0.01 per request), ${DEV_EMBEDDING_MODEL} (embeddings)`,
      '              answered by the built-in echo provider (Chat Completions, Responses, Embeddings, Messages)',
      `  demo user:  ${demoUser}`,
      `  payments:   ${testPaymentsAllowed(ctx.config) ? 'test payments (a test checkout with test cards; no money moves)' : 'none connected'}`,
      '',
      `Dashboard:    ${base}/dashboard`,
      `  sign in as  ${state.admin?.email ?? DEV_ADMIN_EMAIL} / ${state.admin?.password ?? '(see dev.json)'}`,
      '',
      'CLI against this server (the embedded database is locked while it runs):',
      `  export TOLLGATE_URL=${running.url} TOLLGATE_ADMIN_TOKEN=${ctx.config.TOLLGATE_ADMIN_TOKEN}`,
      `  ./scripts/tollgate users deposit --project ${state.projectId} --user ${DEV_USER} --amount 5.00`,
      '',
      'Try:',
      `  curl -s ${base}/v1/models -H 'Authorization: Bearer ${state.apiKey}'`,
      `  curl -s ${base}/v1/chat/completions -H 'Authorization: Bearer ${state.apiKey}' -H 'Content-Type: application/json' \\`,
      `    -d '{"model":"${DEV_MODEL}","user":"${DEV_USER}","messages":[{"role":"user","content":"Hello"}]}'`,
      '',
      'Press Ctrl+C to stop.',
      '',
    ].join('\n'),
  );
  const signal = await stopRequested;
  ctx.log.info(`${signal} received: stopping`);
  await worker.stop();
  await running.stop();
  return 0;
}
