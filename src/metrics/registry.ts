import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

/**
 * Every Prometheus metric Tollgate exports, named `tollgate_*`. Labelled by project and model, never by
 * end user. Each AppContext owns one Metrics (its own Registry), so tests and processes never share
 * state through prom-client's global registry. Counters move with traffic; nothing is computed by
 * scanning the database on a scrape (gauges such as queue depth are refreshed by the worker that owns
 * the queue).
 */
export class Metrics {
  readonly registry = new Registry();

  readonly buildInfo = new Gauge({
    name: 'tollgate_build_info',
    help: 'Always 1; labels carry the Tollgate version and the Node.js version.',
    labelNames: ['version', 'node_version'] as const,
    registers: [this.registry],
  });

  // ---- HTTP (every route of the proxy, recorded by src/metrics/routes.ts) ----
  readonly httpRequests = new Counter({
    name: 'tollgate_http_requests_total',
    help: 'HTTP requests answered, by route template, method and status code.',
    labelNames: ['project', 'route', 'method', 'status'] as const,
    registers: [this.registry],
  });
  readonly httpRequestDuration = new Histogram({
    name: 'tollgate_http_request_duration_seconds',
    help: 'Time from receiving a request to sending the last byte of its response (streams included).',
    labelNames: ['project', 'route', 'method'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
    registers: [this.registry],
  });

  // ---- chat ----
  readonly requests = new Counter({
    name: 'tollgate_requests_total',
    help: 'Metered requests (chat completions, responses, embeddings) by paywall decision (allowed, connect_required, topup_required) and outcome.',
    labelNames: ['project', 'model', 'decision', 'outcome', 'stream'] as const,
    registers: [this.registry],
  });
  readonly inputTokens = new Counter({
    name: 'tollgate_input_tokens_total',
    help: 'Prompt tokens of forwarded requests.',
    labelNames: ['project', 'model'] as const,
    registers: [this.registry],
  });
  readonly outputTokens = new Counter({
    name: 'tollgate_output_tokens_total',
    help: 'Completion tokens of forwarded requests.',
    labelNames: ['project', 'model'] as const,
    registers: [this.registry],
  });
  readonly charged = new Counter({
    name: 'tollgate_charged_amount_total',
    help: 'Amount charged, in currency units (chat, responses, embeddings, subscription fees and manual charges).',
    labelNames: ['project', 'model', 'currency', 'source'] as const,
    registers: [this.registry],
  });
  readonly chargeOverage = new Counter({
    name: 'tollgate_charge_overage_amount_total',
    help: 'Amount charged above the hold (the provider reported more than Tollgate estimated), in currency units.',
    labelNames: ['project', 'model', 'currency'] as const,
    registers: [this.registry],
  });
  readonly debtCreated = new Counter({
    name: 'tollgate_debt_created_amount_total',
    help: 'Amount charged that the balance did not cover (wallets left below zero), in currency units.',
    labelNames: ['project', 'model', 'currency'] as const,
    registers: [this.registry],
  });
  readonly granted = new Counter({
    name: 'tollgate_granted_amount_total',
    help: 'Credit granted (promotional, trial, goodwill: not money), in currency units.',
    labelNames: ['project', 'currency', 'reason'] as const,
    registers: [this.registry],
  });
  readonly deposited = new Counter({
    name: 'tollgate_deposited_amount_total',
    help: 'Amount deposited, in currency units.',
    labelNames: ['project', 'currency'] as const,
    registers: [this.registry],
  });
  readonly holdsOpen = new Gauge({
    name: 'tollgate_holds_open',
    help: 'Holds placed by this process and not yet settled or released.',
    labelNames: ['project'] as const,
    registers: [this.registry],
  });
  readonly escrowAdmissions = new Counter({
    name: 'tollgate_escrow_admissions_total',
    help: "Metered requests admitted, by where their reservation came from (from: memory — this pod's slice of the wallet — or database — a slice taken for it).",
    labelNames: ['project', 'from'] as const,
    registers: [this.registry],
  });
  readonly billingBatchSize = new Histogram({
    name: 'tollgate_billing_batch_size',
    help: 'Requests per group-committed billing statement (statement: take — a slice — or apply — a settle or a slice given back).',
    labelNames: ['statement'] as const,
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    registers: [this.registry],
  });
  readonly billingBatchDuration = new Histogram({
    name: 'tollgate_billing_batch_duration_seconds',
    help: 'Time of one group-committed billing statement, round trip and commit included (statement: take, apply).',
    labelNames: ['statement'] as const,
    buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
    registers: [this.registry],
  });
  readonly upstreamLatency = new Histogram({
    name: 'tollgate_upstream_latency_seconds',
    help: 'Time from sending a request upstream to its last byte.',
    labelNames: ['project', 'model', 'stream'] as const,
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
    registers: [this.registry],
  });
  readonly timeToFirstToken = new Histogram({
    name: 'tollgate_time_to_first_token_seconds',
    help: 'Time from receiving a streaming request to sending its first content chunk.',
    labelNames: ['project', 'model'] as const,
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
    registers: [this.registry],
  });
  readonly overhead = new Histogram({
    name: 'tollgate_overhead_latency_seconds',
    help: 'Latency Tollgate adds to a forwarded request (total time minus upstream time).',
    labelNames: ['project', 'model'] as const,
    buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
    registers: [this.registry],
  });
  // ---- routing and limits (src/routing, src/limits) ----
  readonly rateLimited = new Counter({
    name: 'tollgate_rate_limited_total',
    help: 'Metered requests refused with 429 by a rate limit, by scope (project, key, user) and limit (requests, tokens).',
    labelNames: ['project', 'scope', 'limit'] as const,
    registers: [this.registry],
  });
  readonly spendCapped = new Counter({
    name: 'tollgate_spend_capped_total',
    help: 'Metered requests refused because the end user reached a spend cap, by period (day, month).',
    labelNames: ['project', 'period'] as const,
    registers: [this.registry],
  });
  readonly limitsBackendErrors = new Counter({
    name: 'tollgate_limits_backend_errors_total',
    help: 'Rate limit or spend cap checks that could not reach Redis, by what happened to the request (allowed: fail open, refused: fail closed).',
    labelNames: ['project', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly upstreamErrors = new Counter({
    name: 'tollgate_upstream_errors_total',
    help: 'Failed upstream requests by reason (status, timeout, connection, malformed, internal).',
    labelNames: ['project', 'model', 'reason'] as const,
    registers: [this.registry],
  });

  // ---- webhooks ----
  readonly deliveries = new Counter({
    name: 'tollgate_webhook_deliveries_total',
    help: 'Finished delivery attempts by outcome (success, retry, error).',
    labelNames: ['project', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly deliveryAttempts = new Histogram({
    name: 'tollgate_webhook_delivery_attempts',
    help: 'Attempts a delivery took when it ended (success or error).',
    labelNames: ['outcome'] as const,
    buckets: [1, 2, 3, 4, 5, 6, 8, 10, 15, 20],
    registers: [this.registry],
  });
  readonly deliveryLatency = new Histogram({
    name: 'tollgate_webhook_delivery_duration_seconds',
    help: 'Duration of one delivery request.',
    labelNames: ['outcome'] as const,
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [this.registry],
  });
  readonly deliveriesPending = new Gauge({
    name: 'tollgate_webhook_deliveries_pending',
    help: 'Deliveries waiting to be sent (refreshed by the delivery worker).',
    registers: [this.registry],
  });
  readonly oldestPendingAge = new Gauge({
    name: 'tollgate_webhook_oldest_pending_age_seconds',
    help: 'Age of the oldest pending delivery (refreshed by the delivery worker).',
    registers: [this.registry],
  });
  readonly subscriptionsDisabled = new Counter({
    name: 'tollgate_webhook_subscriptions_disabled_total',
    help: 'Subscriptions disabled because their endpoint failed continuously for WEBHOOK_DISABLE_AFTER_HOURS.',
    labelNames: ['project'] as const,
    registers: [this.registry],
  });
  readonly pruned = new Counter({
    name: 'tollgate_retention_pruned_rows_total',
    help: 'Rows deleted by retention, by kind (deliveries, events, idempotencyKeys, holds).',
    labelNames: ['kind'] as const,
    registers: [this.registry],
  });
  readonly eventsFannedOut = new Counter({
    name: 'tollgate_events_fanned_out_total',
    help: 'Outbox events turned into deliveries.',
    registers: [this.registry],
  });

  // ---- operator ----
  readonly reconciles = new Counter({
    name: 'tollgate_operator_reconcile_total',
    help: 'Reconciles of WebhookSubscription resources by result (success, error, requeue, terminal).',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  readonly reconcileDuration = new Histogram({
    name: 'tollgate_operator_reconcile_duration_seconds',
    help: 'Duration of one reconcile.',
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });
  readonly leader = new Gauge({
    name: 'tollgate_operator_leader',
    help: '1 while this operator replica holds the leader lease.',
    registers: [this.registry],
  });

  constructor(options: { defaultMetrics?: boolean } = {}) {
    if (options.defaultMetrics ?? true)
      collectDefaultMetrics({ register: this.registry, prefix: 'tollgate_' });
    this.buildInfo.set({ version: tollgateVersion(), node_version: process.versions.node }, 1);
  }
}

let version: string | undefined;

/** The version of the tollgate package (read once from its package.json, from source or from dist/). */
export function tollgateVersion(): string {
  if (version !== undefined) return version;
  version = 'unknown';
  let dir = import.meta.dirname;
  for (let i = 0; i < 5; i++) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      try {
        const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: string; version?: string };
        if (pkg.name === 'tollgate' && pkg.version) {
          version = pkg.version;
          break;
        }
      } catch {}
    }
    dir = dirname(dir);
  }
  return version;
}
