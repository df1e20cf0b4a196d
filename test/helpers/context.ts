import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { type AppContext, createContext } from '../../src/app/context.ts';
import { loadConfig } from '../../src/config/index.ts';

export const TEST_ENCRYPTION_KEY = 'a'.repeat(64);

/** A fresh id for a test schema: `<seconds since the epoch, base 36>_<random>` (stale ones are dropped by age). */
export function newTestId(): string {
  return `${Math.floor(Date.now() / 1000).toString(36)}_${randomBytes(5).toString('hex')}`;
}

/** True when the suite runs against the real local Postgres (else the embedded database). */
export const realPostgres = Boolean(process.env.TOLLGATE_TEST_PG);

/** Runs one statement on the suite's real Postgres. */
export async function pgQuery(text: string): Promise<void> {
  const client = new pg.Client({ connectionString: process.env.TOLLGATE_TEST_PG });
  await client.connect();
  try {
    await client.query(text);
  } finally {
    await client.end();
  }
}

/** The suite's Postgres URL with `search_path` set to `schema`: a child process's DATABASE_URL. */
export function databaseUrlOf(schema: string): string {
  const url = new URL(process.env.TOLLGATE_TEST_PG!);
  url.searchParams.set('options', `-c search_path=${schema}`);
  return url.toString();
}

/** Creates an empty schema `tgt_<seconds, base 36>_<tag><random>` (dropped by age as the others). */
export async function createEmptySchema(tag: string): Promise<{ schema: string; databaseUrl: string }> {
  const schema = `tgt_${Math.floor(Date.now() / 1000).toString(36)}_${tag}${randomBytes(4).toString('hex')}`;
  await pgQuery(`CREATE SCHEMA ${schema}`);
  return { schema, databaseUrl: databaseUrlOf(schema) };
}

/**
 * What a `tollgate` child process needs to run on a test's schema (`tgt_<id>`) and the suite's Redis,
 * with the test key and its own data directory; nothing else of this process's environment.
 */
export function childEnv(schema: string, dataDir: string): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    DATABASE_URL: databaseUrlOf(schema),
    REDIS_URL: process.env.TOLLGATE_TEST_REDIS ?? '',
    TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    TOLLGATE_DATA_DIR: dataDir,
  };
}

/**
 * A fully built application context for one test file: its own Postgres schema (or its own embedded
 * database directory), its own bus channel prefix on the real Redis, migrations applied.
 * `env` overrides configuration variables; `shared.id` makes a second context on the same schema and bus
 * channels (a second pod).
 */
export async function createTestContext(
  env: Record<string, string> = {},
  shared: { id?: string } = {},
): Promise<AppContext> {
  const id = shared.id ?? newTestId();
  const dataDir = mkdtempSync(join(tmpdir(), 'tollgate-test-'));
  const config = loadConfig({
    LOG_LEVEL: 'silent',
    TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    TOLLGATE_DATA_DIR: dataDir,
    DATABASE_URL: process.env.TOLLGATE_TEST_PG || undefined,
    REDIS_URL: process.env.TOLLGATE_TEST_REDIS || undefined,
    PORT: '0',
    HOST: '127.0.0.1',
    WEBHOOK_ALLOW_HTTP: 'true',
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
    // The mock providers listen on loopback; the SSRF tests turn this off.
    TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
    TOLLGATE_SIGNUP: 'open',
    // A hold per request: a pod's slice of a wallet is what its request reserves and comes back as soon
    // as its last request settles, so tests read each request's hold in \`holds\` and \`held\` as 0 once
    // their requests are done. test/billing/billing-escrow.test.ts (and the billing property, read-your-writes
    // and 5×N tests) run escrow with slices of 16 requests, given back after 30 s idle.
    ESCROW_IDLE_MS: '0',
    ESCROW_SLICE_REQUESTS: '1',
    ...env,
  });
  const ctx = await createContext(config, { schema: `tgt_${id}`, busPrefix: `t${id}:` });
  await ctx.migrate();
  const close = ctx.close.bind(ctx);
  ctx.close = async () => {
    await close();
    rmSync(dataDir, { recursive: true, force: true });
  };
  return ctx;
}
