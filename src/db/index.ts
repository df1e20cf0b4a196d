import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CompiledQuery, Kysely, sql } from 'kysely';
import { Migrator } from 'kysely/migration';
import pg from 'pg';
import { TollgatePGliteDialect, TollgatePostgresDialect } from './introspection.ts';
import { acquireEmbeddedLock, type HeldLock } from './lock.ts';
import { migrations } from './migrations/index.ts';
import type { DB } from './schema.ts';

export type { DB } from './schema.ts';
export type Database = Kysely<DB>;

export interface DatabaseOptions {
  /** Postgres URL; without it the embedded Postgres (PGlite) in `dataDir` is used. */
  url?: string | undefined;
  dataDir: string;
  poolSize?: number;
  /** Put every table in this schema (created when missing). Tests use one schema per file. */
  schema?: string;
}

export interface DatabaseHandle {
  db: Database;
  kind: 'postgres' | 'embedded';
  /** Schema holding the tables when not the default one. */
  schema?: string | undefined;
  /**
   * Runs one hot-path statement of the billing service as a prepared statement (named, so each
   * connection parses and plans it once) in its own transaction. On the embedded database it runs in
   * order with every other statement.
   */
  run<R>(statement: Statement, values: unknown[]): Promise<R[]>;
  /** The embedded database's exclusive lock (./lock.ts). */
  lock?: HeldLock;
  close(): Promise<void>;
}

/** A statement with a stable name (one per text), run prepared by `DatabaseHandle.run`. */
export interface Statement {
  name: string;
  text: string;
}

// NUMERIC and BIGINT come back as strings on both drivers: amounts are never JS floats.
pg.types.setTypeParser(pg.types.builtins.NUMERIC, (v) => v);
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => v);

export async function openDatabase(options: DatabaseOptions): Promise<DatabaseHandle> {
  if (options.url) {
    const schema = options.schema;
    if (schema && !/^[a-z_][a-z0-9_]*$/.test(schema)) throw new Error(`invalid schema name ${schema}`);
    // The metered hot path's statements (`run`) have connections of their own, with generic plans: a
    // statement of many CTEs costs ~0.6 ms to plan, and once a project has more than a few hundred
    // wallets Postgres's plan cache keeps choosing custom plans, planned at every execution (a settle's
    // Postgres CPU tripled, 0.33 → 0.95 ms, with 1 000 wallets). A third of DATABASE_POOL_SIZE (at least
    // one); every other query keeps Postgres's default planning (partial indexes need their literals).
    const size = options.poolSize ?? 10;
    const hotSize = Math.max(1, Math.floor(size / 3));
    const config = {
      connectionString: options.url,
      // Shown in pg_stat_activity; an `application_name` in DATABASE_URL wins.
      application_name: 'tollgate',
      // While Postgres is unreachable a request waits this long for a connection, then gets 503.
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      ...(schema ? { options: `-c search_path=${schema}` } : {}),
    };
    const pool = watched(new pg.Pool({ ...config, max: Math.max(1, size - hotSize) }));
    const hot = watched(
      new pg.Pool({
        ...config,
        max: hotSize,
        // Before the connection's first statement. (Behind a transaction-mode pooler the setting may not
        // stick: the statements are then only planned more often.)
        onConnect: async (client: pg.ClientBase) => {
          await client.query('SET plan_cache_mode = force_generic_plan');
        },
      }),
    );
    try {
      await pool.query(schema ? `CREATE SCHEMA IF NOT EXISTS ${schema}` : 'SELECT 1');
    } catch (err) {
      await Promise.all([pool.end().catch(() => {}), hot.end().catch(() => {})]);
      throw connectError(err, options.url);
    }
    const db = new Kysely<DB>({ dialect: new TollgatePostgresDialect({ pool }) });
    let closed: Promise<void> | undefined;
    return {
      db,
      kind: 'postgres',
      schema,
      async run<R>(statement: Statement, values: unknown[]) {
        const result = await hot.query({ name: statement.name, text: statement.text, values });
        return result.rows as R[];
      },
      close() {
        // Once: a second close (a test that lost its database on purpose, then shuts down) is a no-op.
        closed ??= Promise.all([db.destroy(), hot.end()]).then(() => {});
        return closed;
      },
    };
  }
  const { PGlite } = await import('@electric-sql/pglite');
  const dir = resolve(options.dataDir, 'pgdata');
  mkdirSync(dir, { recursive: true });
  // One process at a time: a second one is refused with a line naming the first (./lock.ts).
  const lock = acquireEmbeddedLock(options.dataDir);
  let pglite: InstanceType<typeof PGlite>;
  try {
    pglite = await PGlite.create(dir, {
      parsers: { 1700: (v: string) => v, 20: (v: string) => v },
    });
  } catch (err) {
    lock.release();
    throw err;
  }
  const db = new Kysely<DB>({ dialect: new TollgatePGliteDialect({ pglite }) });
  return {
    db,
    kind: 'embedded',
    async run<R>(statement: Statement, values: unknown[]) {
      // Through kysely, which gives the one connection to one transaction at a time.
      const result = await db.executeQuery<R>(CompiledQuery.raw(statement.text, values));
      return result.rows as R[];
    },
    lock,
    async close() {
      try {
        await db.destroy();
      } finally {
        lock.release();
      }
    },
  };
}

const CONNECT_TIMEOUT_MS = 5000;

/** A pool whose connections failing (a restart, pg_terminate_backend) never end the process. */
function watched(pool: pg.Pool): pg.Pool {
  pool.on('error', () => {
    // An idle client lost its connection; the pool replaces it. Queries report their own errors.
  });
  pool.on('connect', (client) => {
    // A client checked out (inside a transaction, between two statements) has no listener of the
    // pool's: without this one, Postgres ending the connection would be an unhandled 'error' event that
    // ends the process. The statement running on it, or the next one, fails instead, and the pool drops
    // the client when it is released.
    client.on('error', () => {});
  });
  return pool;
}

/** Node's codes for a connection that could not be made or was lost. */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENETDOWN',
]);

/** node-postgres's messages for a connection that is gone (they carry no code). */
const LOST_CONNECTION =
  /^(Connection terminated|Client has encountered a connection error|Client was closed and is not queryable|timeout exceeded when trying to connect|Connection ended unexpectedly)/;

/**
 * True when `err` says the database cannot be reached right now (down, restarting, the connection
 * dropped, no connection free in time) rather than that the statement was wrong: the request may be
 * retried later. SQLSTATE class 08 (connection exception), 57P01–57P03 (shut down by the administrator,
 * crashed, not accepting connections yet), 53300 (too many connections), and Node's network errors.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 5; depth++) {
    const { code, message, errors } = e as { code?: unknown; message?: unknown; errors?: unknown };
    if (typeof code === 'string') {
      if (NETWORK_CODES.has(code) || code.startsWith('08') || /^57P0[123]$/.test(code) || code === '53300')
        return true;
    }
    if (typeof message === 'string' && LOST_CONNECTION.test(message)) return true;
    // A connection attempt to several addresses (localhost: ::1 and 127.0.0.1) fails with all of them.
    if (Array.isArray(errors) && errors.some((x) => isDatabaseUnavailable(x))) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Start-up: a connection failure as one line that names DATABASE_URL (never its password). */
function connectError(err: unknown, url: string): Error {
  let where = 'DATABASE_URL';
  try {
    const u = new URL(url);
    where = `DATABASE_URL (${u.hostname}:${u.port || 5432}${u.pathname})`;
  } catch {}
  const e = err as { code?: string; message?: string; errors?: Array<{ code?: string }> };
  const code = e.code ?? e.errors?.[0]?.code;
  const detail = e.message || code || String(err);
  const reason =
    code === 'ENOTFOUND' || code === 'EAI_AGAIN'
      ? 'the host name does not resolve'
      : code === 'ECONNREFUSED'
        ? 'nothing accepts connections there'
        : code === '28P01' || code === '28000'
          ? 'the user or password is not accepted'
          : code === '3D000'
            ? 'the database does not exist'
            : undefined;
  const text = reason
    ? `cannot connect to the database at ${where}: ${reason} (${code}); check DATABASE_URL and that Postgres is running`
    : `cannot connect to the database at ${where}: ${detail}${code && !detail.includes(code) ? ` (${code})` : ''}; check DATABASE_URL`;
  return new DatabaseConnectError(text, { cause: err });
}

/** The database named by DATABASE_URL could not be reached at start-up. */
export class DatabaseConnectError extends Error {}

export function embeddedDataDir(dataDir: string): string {
  return join(resolve(dataDir), 'pgdata');
}

/**
 * The migrator keeps its bookkeeping tables in the schema the tables go to (the current schema of the
 * connection, which a `search_path` in DATABASE_URL's `options` may choose).
 */
async function migrator({ db, schema }: DatabaseHandle): Promise<Migrator> {
  const current =
    schema ?? (await sql<{ schema: string }>`select current_schema() as schema`.execute(db)).rows[0]?.schema;
  return new Migrator({
    db,
    provider: { getMigrations: async () => migrations },
    // Numbers are reserved per branch (0007–0009 and 0010 were written in parallel): a database that
    // already ran a later one still applies an earlier one that arrives afterwards.
    allowUnorderedMigrations: true,
    ...(current ? { migrationTableSchema: current } : {}),
  });
}

/** Applies pending migrations; returns the names applied. Throws with the failing migration's error. */
export async function migrateToLatest(handle: DatabaseHandle): Promise<string[]> {
  const { error, results } = await (await migrator(handle)).migrateToLatest();
  if (error) {
    const failed = results?.find((r) => r.status === 'Error');
    const message = error instanceof Error ? error.message : String(error);
    throw new Error(`migration ${failed?.migrationName ?? '(unknown)'} failed: ${message}`);
  }
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}

/** Names of migrations not yet applied. */
export async function pendingMigrations(handle: DatabaseHandle): Promise<string[]> {
  const all = await (await migrator(handle)).getMigrations();
  return all.filter((m) => !m.executedAt).map((m) => m.name);
}

export async function ping(db: Database): Promise<void> {
  await sql`select 1`.execute(db);
}
