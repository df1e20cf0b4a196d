import ipaddr from 'ipaddr.js';
import { z } from 'zod';

/**
 * Every setting Tollgate reads, as one zod schema over environment variables.
 * The configuration table of docs/configuration.md is generated from the same list (`configDocs`), so the two agree.
 */

const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'], { message: 'must be true or false' })
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

const int = (min: number, max: number) =>
  z.coerce
    .number({ message: 'must be a whole number' })
    .int({ message: 'must be a whole number' })
    .min(min, { message: `must be at least ${min}` })
    .max(max, { message: `must be at most ${max}` });

const url = (protocols: string[]) =>
  z.string().refine(
    (v) => {
      try {
        return protocols.includes(new URL(v).protocol);
      } catch {
        return false;
      }
    },
    { message: `must be a URL starting with ${protocols.map((p) => `${p}//`).join(' or ')}` },
  );

/**
 * TOLLGATE_TRUSTED_PROXIES: a hop count (`1`: the one proxy in front, e.g. the ingress controller) or a
 * comma-separated list of addresses and CIDRs; fastify's `trustProxy`. Unset: no proxy is trusted, so
 * X-Forwarded-For and X-Forwarded-Proto are ignored and the client address is the peer's.
 */
const trustedProxies = z.string().transform((v, ctx): number | string[] => {
  if (/^\d+$/.test(v)) return Number(v);
  const list = v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const item of list) {
    const ok = item.includes('/') ? safe(() => ipaddr.parseCIDR(item)) : ipaddr.isValid(item);
    if (!ok) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a hop count or a list of addresses and CIDRs (not "${item}")`,
      });
      return z.NEVER;
    }
  }
  return list;
});

function safe(fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch {
    return false;
  }
}

const encryptionKey = z.string().refine((v) => decodeKey(v) !== undefined, {
  message:
    'must be 32 bytes, given as 64 hex characters or base64 (generate one with `openssl rand -hex 32`)',
});
/** A key ring: keys separated by commas, the active one first. */
const encryptionKeys = z.string().refine(
  (v) => {
    const keys = v.split(',').map((k) => k.trim());
    return (
      keys.length > 0 && keys.every((k) => decodeKey(k) !== undefined) && new Set(keys).size === keys.length
    );
  },
  {
    message:
      'must be 32-byte keys (64 hex characters or base64) separated by commas, the active one first, none twice',
  },
);

export const configSchema = z.object({
  PORT: int(0, 65535).default(8080),
  HOST: z.string().min(1).default('0.0.0.0'),
  PUBLIC_BASE_URL: url(['http:', 'https:']).optional(),
  DATABASE_URL: url(['postgres:', 'postgresql:']).optional(),
  DATABASE_POOL_SIZE: int(1, 200).default(10),
  TOLLGATE_DATA_DIR: z.string().min(1).default('.tollgate'),
  REDIS_URL: url(['redis:', 'rediss:']).optional(),
  TOLLGATE_ENCRYPTION_KEY: encryptionKey.optional(),
  TOLLGATE_ENCRYPTION_KEYS: encryptionKeys.optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  BODY_LIMIT_BYTES: int(1024, 100 * 1024 * 1024).default(4 * 1024 * 1024),
  REQUEST_TIMEOUT_MS: int(1000, 600_000).default(30_000),
  JSON_MAX_DEPTH: int(2, 1000).default(64),
  LINK_TOKEN_TTL_SECONDS: int(60, 30 * 24 * 3600).default(24 * 3600),
  HOLD_TTL_SECONDS: int(10, 24 * 3600).default(60),
  ESCROW_IDLE_MS: int(0, 3_600_000).default(30_000),
  ESCROW_SLICE_REQUESTS: int(1, 10_000).default(64),
  SETTLE_COMMIT: z.enum(['durable', 'async']).default('durable'),
  DEFAULT_MAX_COMPLETION_TOKENS: int(1, 10_000_000).default(4096),
  UPSTREAM_CONNECT_TIMEOUT_MS: int(100, 600_000).default(10_000),
  UPSTREAM_RESPONSE_TIMEOUT_MS: int(100, 3_600_000).default(120_000),
  TOLLGATE_ALLOW_PRIVATE_PROVIDERS: bool.default(false),
  ROUTING_MAX_ATTEMPTS: int(1, 20).default(3),
  ROUTING_DEADLINE_MS: int(100, 3_600_000).default(180_000),
  ROUTING_CIRCUIT_FAILURES: int(1, 10_000).default(5),
  ROUTING_CIRCUIT_COOLDOWN_MS: int(100, 3_600_000).default(30_000),
  LIMITS_FAIL_OPEN: bool.default(true),
  TOLLGATE_TRUSTED_PROXIES: trustedProxies.optional(),
  SIGNIN_MAX_ATTEMPTS: int(1, 1000).default(5),
  SIGNIN_MAX_ATTEMPTS_PER_ADDRESS: int(1, 100_000).default(30),
  SIGNIN_WINDOW_SECONDS: int(1, 24 * 3600).default(900),
  SIGNUP_MAX_PER_HOUR: int(1, 100_000).default(20),
  WEBHOOK_MAX_ATTEMPTS: int(1, 100).default(8),
  WEBHOOK_BACKOFF_BASE_MS: int(1, 24 * 3600 * 1000).default(30_000),
  WEBHOOK_TIMEOUT_MS: int(100, 300_000).default(10_000),
  WEBHOOK_ALLOW_HTTP: bool.default(false),
  WEBHOOK_ALLOW_PRIVATE_NETWORKS: bool.default(false),
  WEBHOOK_CA_FILE: z.string().min(1).optional(),
  WEBHOOK_WORKER_CONCURRENCY: int(1, 1000).default(32),
  WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY: int(1, 100).default(4),
  WEBHOOK_CLAIM_LEASE_MS: int(1000, 3_600_000).default(60_000),
  WEBHOOK_POLL_INTERVAL_MS: int(10, 600_000).default(1000),
  WEBHOOK_DISABLE_AFTER_HOURS: int(0, 24 * 365).default(120),
  RETENTION_DELIVERIES_DAYS: int(0, 3650).default(30),
  RETENTION_EVENTS_DAYS: int(0, 3650).default(30),
  RETENTION_IDEMPOTENCY_HOURS: int(0, 24 * 3650).default(24),
  RETENTION_HOLDS_DAYS: int(0, 3650).default(30),
  RETENTION_RESPONSES_DAYS: int(0, 3650).default(30),
  RETENTION_INTERVAL_SECONDS: int(10, 24 * 3600).default(300),
  RETENTION_BATCH_SIZE: int(10, 100_000).default(1000),
  OPERATOR_PORT: int(0, 65535).default(8081),
  OPERATOR_LEASE_NAME: z.string().min(1).default('tollgate-operator'),
  OPERATOR_LEASE_NAMESPACE: z.string().min(1).optional(),
  OPERATOR_LEASE_DURATION_SECONDS: int(1, 3600).default(15),
  OPERATOR_RENEW_DEADLINE_SECONDS: int(1, 3600).default(10),
  OPERATOR_RETRY_PERIOD_SECONDS: int(1, 3600).default(2),
  OPERATOR_STATUS_SYNC_SECONDS: int(1, 3600).default(30),
  OPERATOR_SHUTDOWN_GRACE_SECONDS: int(0, 3600).default(20),
  POD_NAME: z.string().min(1).optional(),
  TOLLGATE_ADMIN_TOKEN: z
    .string()
    .min(24, { message: 'must be at least 24 characters (generate one with `openssl rand -hex 32`)' })
    .optional(),
  TOLLGATE_URL: url(['http:', 'https:']).optional(),
  TOLLGATE_SIGNUP: z
    .enum(['open', 'invite', 'closed'], { message: "must be 'open', 'invite' or 'closed'" })
    .default('invite'),
  STRIPE_API_URL: url(['http:', 'https:']).optional(),
  TOLLGATE_TEST_PAYMENTS: bool.default(false),
  NODE_ENV: z.string().min(1).optional(),
  OTEL_TRACES_EXPORTER: z.enum(['otlp', 'none'], { message: "must be 'otlp' or 'none'" }).optional(),
  OTEL_EXPORTER_OTLP_ENDPOINT: url(['http:', 'https:']).optional(),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: url(['http:', 'https:']).optional(),
  OTEL_EXPORTER_OTLP_PROTOCOL: z
    .enum(['http/protobuf', 'http/json'], { message: "must be 'http/protobuf' or 'http/json'" })
    .default('http/protobuf'),
  OTEL_SERVICE_NAME: z.string().min(1).default('tollgate'),
  OTEL_TRACES_SAMPLER: z
    .enum([
      'always_on',
      'always_off',
      'traceidratio',
      'parentbased_always_on',
      'parentbased_always_off',
      'parentbased_traceidratio',
    ])
    .default('parentbased_always_on'),
  OTEL_TRACES_SAMPLER_ARG: z.coerce
    .number({ message: 'must be a number from 0 to 1' })
    .min(0, { message: 'must be a number from 0 to 1' })
    .max(1, { message: 'must be a number from 0 to 1' })
    .optional(),
  OTEL_SDK_DISABLED: bool.default(false),
});

export type Config = z.infer<typeof configSchema>;

/** One line per setting for the table in docs/configuration.md: name, default, meaning. */
export const configDocs: Record<keyof Config, string> = {
  PORT: 'HTTP port of `tollgate proxy` and `tollgate dev`.',
  HOST: 'Address to listen on (`tollgate dev`: `127.0.0.1` unless HOST is set).',
  PUBLIC_BASE_URL:
    'Public address of the proxy, used in connect and top-up links (default `http://localhost:PORT`).',
  DATABASE_URL:
    'Postgres connection string. Unset: an embedded Postgres (PGlite) kept in `TOLLGATE_DATA_DIR`.',
  DATABASE_POOL_SIZE:
    'Connections per process to Postgres: a third of them (at least one; one more when the size is 1) for the metered hot path’s statements, the rest for everything else.',
  TOLLGATE_DATA_DIR: 'Where the embedded database and the generated dev encryption key live.',
  REDIS_URL:
    'Redis connection string (cache invalidation and wake-ups across pods). Unset: in-process stand-ins.',
  TOLLGATE_ENCRYPTION_KEY:
    '32-byte key (64 hex characters or base64) that encrypts provider keys, payment keys and webhook secrets and signs links. Required with `DATABASE_URL` (or `TOLLGATE_ENCRYPTION_KEYS`); `dev` generates one in `TOLLGATE_DATA_DIR`.',
  TOLLGATE_ENCRYPTION_KEYS:
    'A key ring for online key rotation: keys separated by commas, the active one first; replaces `TOLLGATE_ENCRYPTION_KEY`. New secrets and links use the first; every key still opens and verifies what it sealed and signed. See [Rotating the encryption key](operations.md#rotating-the-encryption-key).',
  LOG_LEVEL: 'fatal, error, warn, info, debug, trace or silent.',
  BODY_LIMIT_BYTES: 'Largest request body accepted; larger bodies get 413.',
  REQUEST_TIMEOUT_MS:
    'Longest time to receive a whole request, headers and body: a connection trickling its request is answered 408 and closed within 1.5× this.',
  JSON_MAX_DEPTH:
    'Deepest nesting of objects and arrays accepted in a JSON body (the body itself is level 1); deeper bodies get 400 `json_too_deep` before any work.',
  LINK_TOKEN_TTL_SECONDS: 'Lifetime of connect and top-up links.',
  HOLD_TTL_SECONDS:
    'A hold (a pod’s slice of a wallet, renewed while the pod lives) not renewed within this time is released by the sweeper: its pod died.',
  ESCROW_IDLE_MS:
    'A pod gives a wallet’s slice back after this long without a request of that wallet (0: as soon as its last request settles, a hold per request). See [Escrow](billing.md#escrow-admission-without-a-round-trip).',
  ESCROW_SLICE_REQUESTS:
    'A pod takes a slice of a wallet this many times the reservation of the request that needs it (at most the available balance); its next requests are admitted from memory.',
  SETTLE_COMMIT:
    '`durable`: a request’s charge is flushed to the WAL before its last byte. `async`: it is visible at once (reads still see it) and flushed within moments, saving the flush’s wait (~0.5–1 ms) on every request; a Postgres crash then loses the last moments’ charges (those requests go free; nothing is overspent, the ledger stays consistent). See [Escrow](billing.md#escrow-admission-without-a-round-trip).',
  DEFAULT_MAX_COMPLETION_TOKENS:
    'Output bound of a request that sets none, for a model whose pricing sets no `maxOutputTokens` and whose family Tollgate does not know (known families use their published limits: see [Bounds](billing.md#bounds-the-worst-case-of-a-request)); the project’s `maxCompletionTokens` caps it.',
  UPSTREAM_CONNECT_TIMEOUT_MS: 'Connect time-out towards model providers.',
  UPSTREAM_RESPONSE_TIMEOUT_MS: 'Time-out for the provider’s response headers and between streamed chunks.',
  TOLLGATE_ALLOW_PRIVATE_PROVIDERS:
    'Allow provider base URLs on private, loopback and link-local addresses (a model server on the same host or network). Off: such URLs are refused when saved and every upstream connection is checked again. `dev` turns it on.',
  ROUTING_MAX_ATTEMPTS:
    'Attempts of one metered request across its model’s routes (the first included) before it fails.',
  ROUTING_DEADLINE_MS:
    'One deadline for all the attempts of a request, until a provider answers (non-streaming: until its answer is read).',
  ROUTING_CIRCUIT_FAILURES: 'Consecutive failures of a route that open its circuit breaker.',
  ROUTING_CIRCUIT_COOLDOWN_MS:
    'How long an open circuit skips its route before one probe request is let through.',
  LIMITS_FAIL_OPEN:
    'When Redis cannot be reached, rate limits let requests through and spend caps are checked against Postgres (`true`), or every limit refuses with 503 (`false`); `tollgate_limits_backend_errors_total` counts these.',
  TOLLGATE_TRUSTED_PROXIES:
    'Proxies in front of Tollgate whose `X-Forwarded-For`/`X-Forwarded-Proto` are believed: a hop count (`1`: one proxy, e.g. the ingress controller) or comma-separated addresses and CIDRs. Unset: none — the client address is the TCP peer, forwarded headers are ignored (the Helm chart sets `1`, its ingress).',
  SIGNIN_MAX_ATTEMPTS:
    'Sign-in attempts (dashboard and admin API, right or wrong) per e-mail and client address within `SIGNIN_WINDOW_SECONDS`; each is counted before the password is checked, past it 429. Counted in Redis when `REDIS_URL` is set (shared by every pod).',
  SIGNIN_MAX_ATTEMPTS_PER_ADDRESS:
    'Sign-in attempts per client address (any e-mail) within `SIGNIN_WINDOW_SECONDS`.',
  SIGNIN_WINDOW_SECONDS: 'The window of the sign-in limits; a limit lifts when its window ends.',
  SIGNUP_MAX_PER_HOUR: 'Sign-ups (dashboard and admin API) per client address per hour; past it 429.',
  WEBHOOK_MAX_ATTEMPTS: 'Delivery attempts before a delivery ends in `error`.',
  WEBHOOK_BACKOFF_BASE_MS: 'First retry delay; doubles on each attempt, with jitter.',
  WEBHOOK_TIMEOUT_MS: 'Time-out of one delivery request.',
  WEBHOOK_ALLOW_HTTP: 'Allow plain-HTTP subscription URLs.',
  WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'Allow destinations on private, loopback and link-local addresses.',
  WEBHOOK_CA_FILE: 'Extra PEM CA bundle trusted for webhook destinations.',
  WEBHOOK_WORKER_CONCURRENCY: 'Deliveries in flight per worker.',
  WEBHOOK_PER_SUBSCRIPTION_CONCURRENCY: 'Deliveries in flight per subscription per worker.',
  WEBHOOK_CLAIM_LEASE_MS: 'A claimed delivery whose worker died becomes due again after this long.',
  WEBHOOK_POLL_INTERVAL_MS: 'Polling interval of the delivery worker when no wake-up arrives.',
  WEBHOOK_DISABLE_AFTER_HOURS:
    'A subscription whose deliveries have all failed for this long is disabled (event `webhook.subscription.disabled`); 0: never.',
  RETENTION_DELIVERIES_DAYS:
    'Finished webhook deliveries (and their attempts) older than this are pruned; 0: kept forever.',
  RETENTION_EVENTS_DAYS:
    'Outbox events older than this (and at least a day older than `RETENTION_DELIVERIES_DAYS`, whose log shows them) are pruned unless a delivery of theirs is pending; 0: kept forever.',
  RETENTION_IDEMPOTENCY_HOURS: 'Expired idempotency keys older than this are pruned; 0: kept forever.',
  RETENTION_HOLDS_DAYS:
    'Closed (settled, released, expired) holds older than this are pruned; ledger entries never are. 0: kept forever.',
  RETENTION_RESPONSES_DAYS:
    'Responses chain sizes recorded longer ago than this (a request continuing an older chain is held at the model’s context window) and finished background responses older than this are pruned; 0: kept forever.',
  RETENTION_INTERVAL_SECONDS: 'How often each serving process runs the retention pass.',
  RETENTION_BATCH_SIZE: 'Rows deleted per statement (and per transaction) by the retention pass.',
  OPERATOR_PORT: 'Port of the operator’s `/healthz`, `/readyz` and `/metrics`.',
  OPERATOR_LEASE_NAME: 'Name of the leader-election Lease.',
  OPERATOR_LEASE_NAMESPACE: 'Namespace of the Lease (default: the pod’s namespace, else `default`).',
  OPERATOR_LEASE_DURATION_SECONDS: 'Lease duration.',
  OPERATOR_RENEW_DEADLINE_SECONDS: 'The leader steps down when it cannot renew within this time.',
  OPERATOR_RETRY_PERIOD_SECONDS: 'Interval between acquire/renew attempts.',
  OPERATOR_STATUS_SYNC_SECONDS: 'Interval at which delivery stats are mirrored into resource status.',
  OPERATOR_SHUTDOWN_GRACE_SECONDS:
    'On SIGTERM, time allowed for in-flight deliveries before the lease is released.',
  POD_NAME: 'Leader-election identity (set from the downward API; default: the host name).',
  TOLLGATE_ADMIN_TOKEN:
    'Full-access bearer token of the admin API (`/admin/v1`), the first admin token; more are created and revoked over the API. `dev` generates one in `TOLLGATE_DATA_DIR`. Unset: only developer sessions and created tokens.',
  TOLLGATE_SIGNUP:
    'Who may create a developer account: `open` (anyone), `invite` (an invite code from a full-access admin, `POST /admin/v1/invites`) or `closed` (only a full-access admin token, `POST /admin/v1/developers`). `dev` uses `open`.',
  TOLLGATE_URL:
    'For the CLI: the address of a running Tollgate (e.g. `http://127.0.0.1:8080`); with `TOLLGATE_ADMIN_TOKEN` the admin commands go over the admin API instead of the database.',
  STRIPE_API_URL:
    'Tests and stand-ins only: the address of a Stripe API stand-in (e.g. `http://127.0.0.1:12111`) that the `stripe` library calls instead of Stripe. Unset in production.',
  TOLLGATE_TEST_PAYMENTS:
    'The `test` payment provider: a checkout page Tollgate hosts with test cards (succeed, decline, authentication) that credits balances through the same webhooks as Stripe, with no account and no network. `dev` turns it on. Refused in a production configuration (`NODE_ENV=production`, as the image sets).',
  NODE_ENV:
    '`production` (the container image sets it) marks a production configuration: `TOLLGATE_TEST_PAYMENTS` is refused at start-up and the `test` payment provider cannot be selected.',
  OTEL_TRACES_EXPORTER:
    '`otlp` turns traces on (to `http://localhost:4318` when no endpoint is set), `none` off whatever else is set. Unset: traces are on exactly when an OTLP endpoint is set. See [Traces (OpenTelemetry)](operations.md#traces-opentelemetry).',
  OTEL_EXPORTER_OTLP_ENDPOINT:
    'Base address of an OTLP/HTTP receiver (a collector, Jaeger, …); spans go to its `/v1/traces`. Setting it turns traces on.',
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:
    'Full URL spans are posted to (used as is; wins over `OTEL_EXPORTER_OTLP_ENDPOINT`). Setting it turns traces on.',
  OTEL_EXPORTER_OTLP_PROTOCOL:
    '`http/protobuf` or `http/json` (gRPC is not supported). Headers (`OTEL_EXPORTER_OTLP_HEADERS`, e.g. an API key) are read by the exporter from the environment.',
  OTEL_SERVICE_NAME: 'The `service.name` of the spans.',
  OTEL_TRACES_SAMPLER:
    'always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio (`parentbased_*`: a sampled client `traceparent` is followed).',
  OTEL_TRACES_SAMPLER_ARG: 'The ratio (0 to 1) of the `traceidratio` samplers (default 1).',
  OTEL_SDK_DISABLED: '`true` turns traces off whatever else is set.',
};

export class ConfigError extends Error {
  readonly variable: string;
  constructor(variable: string, problem: string) {
    super(`configuration error: ${variable} ${problem}`);
    this.variable = variable;
  }
}

/** Parses the environment; throws ConfigError naming the first bad variable. Empty strings count as unset. */
export function loadConfig(env: Record<string, string | undefined> = process.env): Config {
  const input: Record<string, string> = {};
  for (const key of Object.keys(configSchema.shape)) {
    const value = env[key];
    if (value !== undefined && value.trim() !== '') input[key] = value.trim();
  }
  const result = configSchema.safeParse(input);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const variable = String(issue.path[0] ?? 'configuration');
    const shown = input[variable];
    const secret =
      variable.includes('KEY') ||
      variable.includes('URL') ||
      variable.includes('TOKEN') ||
      variable.includes('ENDPOINT');
    const suffix = shown !== undefined && !secret ? ` (got "${shown}")` : '';
    throw new ConfigError(variable, `${issue.message}${suffix}`);
  }
  if (result.data.TOLLGATE_TEST_PAYMENTS && isProduction(result.data)) {
    throw new ConfigError(
      'TOLLGATE_TEST_PAYMENTS',
      'must not be on in a production configuration (NODE_ENV=production): test payments credit balances without money',
    );
  }
  return result.data;
}

/** A production configuration: NODE_ENV=production (the container image sets it). */
export function isProduction(config: Pick<Config, 'NODE_ENV'>): boolean {
  return config.NODE_ENV === 'production';
}

/**
 * Whether the `test` payment provider may be connected and used: turned on (TOLLGATE_TEST_PAYMENTS;
 * `tollgate dev` turns it on) and never in a production configuration, whatever else says so.
 */
export function testPaymentsAllowed(config: Pick<Config, 'NODE_ENV' | 'TOLLGATE_TEST_PAYMENTS'>): boolean {
  return config.TOLLGATE_TEST_PAYMENTS && !isProduction(config);
}

export function publicBaseUrl(config: Config, boundPort?: number): string {
  const base = config.PUBLIC_BASE_URL ?? `http://localhost:${boundPort ?? config.PORT}`;
  return base.replace(/\/+$/, '');
}

/** Decodes a 32-byte key given as hex or base64; undefined when it is neither. */
export function decodeKey(value: string): Buffer | undefined {
  if (/^[0-9a-fA-F]{64}$/.test(value)) return Buffer.from(value, 'hex');
  if (/^[A-Za-z0-9+/_-]+={0,2}$/.test(value)) {
    const buf = Buffer.from(value, 'base64');
    if (buf.length === 32) return buf;
  }
  return undefined;
}
