import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { sql } from 'kysely';
import { type Logger, pino } from 'pino';
import { KeyDirectory } from '../auth/key-directory.ts';
import { BillingService } from '../billing/service.ts';
import { type Bus, openBus } from '../bus/index.ts';
import { type Config, ConfigError, decodeKey, publicBaseUrl } from '../config/index.ts';
import { Sealer } from '../core/crypto.ts';
import { type Database, type DatabaseHandle, migrateToLatest, openDatabase } from '../db/index.ts';
import { EventRecorder } from '../events/outbox.ts';
import { Metrics } from '../metrics/registry.ts';
import { PaymentsModule } from '../payments/module.ts';
import { ProjectDirectory } from '../projects/directory.ts';
import { logTraceIds, startTracing, type Tracing } from '../tracing/index.ts';
import { SubscriptionFilter } from '../webhooks/filter.ts';

/**
 * The composition root: everything a Tollgate process shares, built once from the configuration and
 * handed to the HTTP server, the CLI commands and the workers. No module keeps global state.
 */
export interface AppContext {
  config: Config;
  log: Logger;
  database: DatabaseHandle;
  db: Database;
  bus: Bus;
  sealer: Sealer;
  events: EventRecorder;
  /** Every movement of money, and the effects after its commit. */
  billing: BillingService;
  /** Payments (src/payments): auto-recharge, watching every committed debit of this process. */
  payments: PaymentsModule;
  keys: KeyDirectory;
  projects: ProjectDirectory;
  metrics: Metrics;
  /** Traces (src/tracing): the no-op tracing unless the OTEL_* settings turn it on. */
  tracing: Tracing;
  /**
   * Public address for links (PUBLIC_BASE_URL, else http://localhost:PORT; a server listening on an
   * ephemeral port sets it once bound).
   */
  publicBaseUrl: string;
  /** Applies pending migrations (returns their names) and reloads what was read before they ran. */
  migrate(): Promise<string[]>;
  close(): Promise<void>;
}

export interface ContextOptions {
  /** Tables in this Postgres schema (tests). */
  schema?: string;
  /** Prefix of bus channels (tests sharing one Redis). */
  busPrefix?: string;
  log?: Logger;
  /** Replaces the tracing the settings would start (tests, benchmarks). */
  tracing?: Tracing;
}

export function createLogger(config: Config): Logger {
  return pino({
    level: config.LOG_LEVEL,
    base: undefined,
    // The trace of the span active when a line is written (nothing when tracing is off).
    mixin: logTraceIds,
    redact: {
      paths: ['req.headers.authorization', '*.apiKey', '*.secret', '*.upstreamKey'],
      censor: '[redacted]',
    },
  });
}

/**
 * The key ring that seals secrets and signs links, the active key first: TOLLGATE_ENCRYPTION_KEYS, else
 * TOLLGATE_ENCRYPTION_KEY, or with the embedded database a key generated once and kept beside it in
 * TOLLGATE_DATA_DIR.
 */
export function resolveEncryptionKeys(config: Config): Buffer[] {
  if (config.TOLLGATE_ENCRYPTION_KEYS)
    return config.TOLLGATE_ENCRYPTION_KEYS.split(',').map((k) => decodeKey(k.trim())!);
  return [resolveEncryptionKey(config)];
}

function resolveEncryptionKey(config: Config): Buffer {
  if (config.TOLLGATE_ENCRYPTION_KEY) return decodeKey(config.TOLLGATE_ENCRYPTION_KEY)!;
  if (config.DATABASE_URL) {
    throw new ConfigError(
      'TOLLGATE_ENCRYPTION_KEY',
      'is required when DATABASE_URL is set (generate one with `openssl rand -hex 32`)',
    );
  }
  const dir = resolve(config.TOLLGATE_DATA_DIR);
  const file = join(dir, 'encryption.key');
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true });
    writeFileSync(file, randomBytes(32).toString('hex'), { mode: 0o600 });
  }
  const key = decodeKey(readFileSync(file, 'utf8').trim());
  if (!key) throw new ConfigError('TOLLGATE_ENCRYPTION_KEY', `could not be read from ${file}`);
  return key;
}

export const KEY_CHECK = 'encryption_key_check';

/**
 * Refuses a key ring that does not hold the key the database was set up with (it could open no sealed
 * secret and verify no link: every authenticated request would fail). The first start after migration
 * 0005 records the key's fingerprint — after checking the key opens a secret already sealed, when there
 * is one. Before that migration there is nothing to compare with and nothing is checked. During a
 * rotation the recorded fingerprint is the old key's (in the ring, after the new one) until
 * `tollgate keys rotate` has re-sealed everything and records the new one.
 */
export async function verifyEncryptionKey(db: Database, sealer: Sealer, keyFile?: string): Promise<void> {
  const mismatch = () =>
    new ConfigError(
      'TOLLGATE_ENCRYPTION_KEY',
      keyFile
        ? `is not the key this database was set up with (the key in ${keyFile} does not match the database's key check); restore the original key file`
        : "is not the key this database was set up with (it does not match the database's key check); start with the original key",
    );
  const table = await sql<{ t: string | null }>`select to_regclass('system_settings')::text as t`.execute(db);
  if (!table.rows[0]?.t) return;
  const stored = await db
    .selectFrom('system_settings')
    .select('value')
    .where('name', '=', KEY_CHECK)
    .executeTakeFirst();
  if (stored) {
    if (!sealer.keyChecks().includes(stored.value)) throw mismatch();
    return;
  }
  // First start with the key check: the key must open what is already sealed.
  const sealed =
    (
      await db
        .selectFrom('projects')
        .select('upstream_key_sealed as v')
        .where('upstream_key_sealed', 'is not', null)
        .limit(1)
        .executeTakeFirst()
    )?.v ??
    (await db.selectFrom('webhook_subscriptions').select('secret_sealed as v').limit(1).executeTakeFirst())
      ?.v;
  if (sealed) {
    try {
      sealer.open(sealed);
    } catch {
      throw mismatch();
    }
  }
  await db
    .insertInto('system_settings')
    .values({ name: KEY_CHECK, value: sealer.keyCheck() })
    .onConflict((oc) => oc.column('name').doNothing())
    .execute();
  // Another process may have recorded its key first.
  const now = await db
    .selectFrom('system_settings')
    .select('value')
    .where('name', '=', KEY_CHECK)
    .executeTakeFirstOrThrow();
  if (!sealer.keyChecks().includes(now.value)) throw mismatch();
}

export async function createContext(config: Config, options: ContextOptions = {}): Promise<AppContext> {
  const log = options.log ?? createLogger(config);
  const sealer = new Sealer(resolveEncryptionKeys(config));
  const database = await openDatabase({
    url: config.DATABASE_URL,
    dataDir: config.TOLLGATE_DATA_DIR,
    poolSize: config.DATABASE_POOL_SIZE,
    ...(options.schema ? { schema: options.schema } : {}),
  });
  const keyFile =
    config.TOLLGATE_ENCRYPTION_KEY || config.TOLLGATE_ENCRYPTION_KEYS
      ? undefined
      : join(resolve(config.TOLLGATE_DATA_DIR), 'encryption.key');
  try {
    await verifyEncryptionKey(database.db, sealer, keyFile);
  } catch (err) {
    await database.close();
    throw err;
  }
  let bus: Bus;
  try {
    bus = await openBus({
      url: config.REDIS_URL,
      ...(options.busPrefix ? { prefix: options.busPrefix } : {}),
    });
  } catch (err) {
    await database.close();
    throw err;
  }
  // Events are written only when an active webhook subscription of the project can match them.
  const eventFilter = new SubscriptionFilter(database.db, bus);
  const events = new EventRecorder(eventFilter, bus);
  const keys = new KeyDirectory(database.db, bus);
  const projects = new ProjectDirectory(database.db, bus, sealer);
  try {
    await Promise.all([keys.start(), projects.start(), eventFilter.start()]);
  } catch (err) {
    // A failed start closes what it opened, so the process can exit.
    await Promise.allSettled([keys.stop(), projects.stop(), eventFilter.stop()]);
    await bus.close();
    await database.close();
    throw err;
  }
  const metrics = new Metrics();
  const tracing = options.tracing ?? (await startTracing(config, log));
  const billing = new BillingService({
    database,
    events,
    metrics,
    log,
    bus,
    escrow: {
      ttlSeconds: config.HOLD_TTL_SECONDS,
      idleMs: config.ESCROW_IDLE_MS,
      sliceRequests: config.ESCROW_SLICE_REQUESTS,
      settleCommit: config.SETTLE_COMMIT,
    },
  });
  try {
    await billing.start();
  } catch (err) {
    await Promise.allSettled([keys.stop(), projects.stop(), eventFilter.stop()]);
    await bus.close();
    await database.close();
    throw err;
  }
  const payments = new PaymentsModule({
    db: database.db,
    sealer,
    billing,
    events,
    config,
    log,
    projects,
    // (as the server sets it once bound)
    get publicBaseUrl() {
      return context.publicBaseUrl;
    },
  });
  const context: AppContext = {
    config,
    log,
    database,
    db: database.db,
    bus,
    sealer,
    events,
    billing,
    payments,
    keys,
    projects,
    metrics,
    tracing,
    publicBaseUrl: publicBaseUrl(config),
    async migrate() {
      const applied = await migrateToLatest(database);
      await verifyEncryptionKey(database.db, sealer, keyFile);
      await eventFilter.reloadAll();
      return applied;
    },
    async close() {
      await payments.close();
      await billing.close();
      await Promise.allSettled([keys.stop(), projects.stop(), eventFilter.stop()]);
      await bus.close();
      await database.close();
      await tracing.shutdown();
    },
  };
  return context;
}
