import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Kysely, PGliteDialect, PostgresDialect, sql } from 'kysely';
import { Migrator } from 'kysely/migration';
import pg from 'pg';
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
  close(): Promise<void>;
}

// NUMERIC and BIGINT come back as strings on both drivers: amounts are never JS floats.
pg.types.setTypeParser(pg.types.builtins.NUMERIC, (v) => v);
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => v);

export async function openDatabase(options: DatabaseOptions): Promise<DatabaseHandle> {
  if (options.url) {
    const schema = options.schema;
    if (schema && !/^[a-z_][a-z0-9_]*$/.test(schema)) throw new Error(`invalid schema name ${schema}`);
    const pool = new pg.Pool({
      connectionString: options.url,
      max: options.poolSize ?? 10,
      ...(schema ? { options: `-c search_path=${schema}` } : {}),
    });
    pool.on('error', () => {
      // An idle client lost its connection; the pool replaces it. Queries report their own errors.
    });
    if (schema) await pool.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
    const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) });
    return { db, kind: 'postgres', schema, close: () => db.destroy() };
  }
  const { PGlite } = await import('@electric-sql/pglite');
  const dir = resolve(options.dataDir, 'pgdata');
  mkdirSync(dir, { recursive: true });
  const pglite = await PGlite.create(dir, {
    parsers: { 1700: (v: string) => v, 20: (v: string) => v },
  });
  const db = new Kysely<DB>({ dialect: new PGliteDialect({ pglite }) });
  return { db, kind: 'embedded', close: () => db.destroy() };
}

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
