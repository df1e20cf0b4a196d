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
// biome-ignore format: one metric a line, a table
export class Metrics {
  readonly registry = new Registry();

  // Each metric registers on this Metrics' own registry.
  #counter<const L extends string>(name: string, help: string, labelNames: readonly L[] = []) {
    return new Counter({ name, help, labelNames, registers: [this.registry] });
  }

  #gauge<const L extends string>(name: string, help: string, labelNames: readonly L[] = []) {
    return new Gauge({ name, help, labelNames, registers: [this.registry] });
  }

  #histogram<const L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[],
    buckets: number[],
  ) {
    return new Histogram({ name, help, labelNames, buckets, registers: [this.registry] });
  }

  readonly buildInfo = this.#gauge('tollgate_build_info', 'Always 1; labels carry the Tollgate version and the Node.js version.', ['version', 'node_version']);

  // ---- HTTP (every route of the proxy, recorded by src/metrics/routes.ts) ----
  readonly httpRequests = this.#counter('tollgate_http_requests_total', 'HTTP requests answered, by route template, method and status code.', ['project', 'route', 'method', 'status']);
  readonly httpRequestDuration = this.#histogram('tollgate_http_request_duration_seconds', 'Time from receiving a request to sending the last byte of its response (streams included).', ['project', 'route', 'method'], [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]);

  // ---- chat ----
  readonly requests = this.#counter('tollgate_requests_total', 'Metered requests (chat completions, responses, embeddings, messages) by decision (allowed, connect_required, topup_required, spend_cap_reached, rate_limited, invalid_request) and outcome.', ['project', 'model', 'decision', 'outcome', 'stream']);
  readonly inputTokens = this.#counter('tollgate_input_tokens_total', 'Prompt tokens of forwarded requests.', ['project', 'model']);
  readonly outputTokens = this.#counter('tollgate_output_tokens_total', 'Completion tokens of forwarded requests.', ['project', 'model']);
  readonly charged = this.#counter('tollgate_charged_amount_total', 'Amount charged, in currency units (chat, responses, embeddings, subscription fees and manual charges).', ['project', 'model', 'currency', 'source']);
  readonly chargeOverage = this.#counter('tollgate_charge_overage_amount_total', 'Amount charged above the hold (the provider reported more than Tollgate estimated), in currency units.', ['project', 'model', 'currency']);
  readonly debtCreated = this.#counter('tollgate_debt_created_amount_total', 'Amount charged that the balance did not cover (wallets left below zero), in currency units.', ['project', 'model', 'currency']);
  readonly granted = this.#counter('tollgate_granted_amount_total', 'Credit granted (promotional, trial, goodwill: not money), in currency units.', ['project', 'currency', 'reason']);
  readonly deposited = this.#counter('tollgate_deposited_amount_total', 'Amount deposited, in currency units.', ['project', 'currency']);
  readonly holdsOpen = this.#gauge('tollgate_holds_open', 'Holds placed by this process and not yet settled or released.', ['project']);
  readonly escrowAdmissions = this.#counter('tollgate_escrow_admissions_total', "Metered requests admitted, by where their reservation came from (from: memory — this pod's slice of the wallet — or database — a slice taken for it).", ['project', 'from']);
  readonly billingBatchSize = this.#histogram('tollgate_billing_batch_size', 'Requests per group-committed billing statement (statement: take — a slice — or apply — a settle or a slice given back).', ['statement'], [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
  readonly billingBatchDuration = this.#histogram('tollgate_billing_batch_duration_seconds', 'Time of one group-committed billing statement, round trip and commit included (statement: take, apply).', ['statement'], [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]);
  readonly upstreamLatency = this.#histogram('tollgate_upstream_latency_seconds', 'Time from sending a request upstream to its last byte.', ['project', 'model', 'stream'], [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]);
  readonly timeToFirstToken = this.#histogram('tollgate_time_to_first_token_seconds', 'Time from receiving a streaming request to sending its first content chunk.', ['project', 'model'], [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30]);
  readonly overhead = this.#histogram('tollgate_overhead_latency_seconds', 'Latency Tollgate adds to a forwarded request (total time minus upstream time).', ['project', 'model'], [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]);
  // ---- routing and limits (src/routing, src/limits) ----
  readonly rateLimited = this.#counter('tollgate_rate_limited_total', 'Metered requests refused with 429 by a rate limit, by scope (project, key, user) and limit (requests, tokens).', ['project', 'scope', 'limit']);
  readonly spendCapped = this.#counter('tollgate_spend_capped_total', 'Metered requests refused because the end user reached a spend cap, by period (day, month).', ['project', 'period']);
  readonly limitsBackendErrors = this.#counter('tollgate_limits_backend_errors_total', 'Rate limit or spend cap checks that could not reach Redis, by what happened to the request (allowed: fail open, postgres: spend caps checked there, refused: fail closed).', ['project', 'outcome']);
  readonly usageAnomalies = this.#counter('tollgate_usage_anomalies_total', 'Metered requests whose reported usage exceeded their bounds (output above the bound sent, input above the context window), by which (input, output).', ['project', 'model', 'kind']);
  readonly anomalousTokens = this.#counter('tollgate_usage_anomalous_tokens_total', 'Tokens reported above the bounds and not charged, by kind (input, output).', ['project', 'model', 'kind']);
  readonly upstreamErrors = this.#counter('tollgate_upstream_errors_total', 'Failed upstream requests by reason (status, timeout, connection, malformed, internal).', ['project', 'model', 'reason']);

  // ---- webhooks ----
  readonly deliveries = this.#counter('tollgate_webhook_deliveries_total', 'Finished delivery attempts by outcome (success, retry, error).', ['project', 'outcome']);
  readonly deliveryAttempts = this.#histogram('tollgate_webhook_delivery_attempts', 'Attempts a delivery took when it ended (success or error).', ['outcome'], [1, 2, 3, 4, 5, 6, 8, 10, 15, 20]);
  readonly deliveryLatency = this.#histogram('tollgate_webhook_delivery_duration_seconds', 'Duration of one delivery request.', ['outcome'], [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]);
  readonly deliveriesPending = this.#gauge('tollgate_webhook_deliveries_pending', 'Deliveries waiting to be sent (refreshed by the delivery worker).');
  readonly oldestPendingAge = this.#gauge('tollgate_webhook_oldest_pending_age_seconds', 'Age of the oldest pending delivery (refreshed by the delivery worker).');
  readonly subscriptionsDisabled = this.#counter('tollgate_webhook_subscriptions_disabled_total', 'Subscriptions disabled because their endpoint failed continuously for WEBHOOK_DISABLE_AFTER_HOURS.', ['project']);
  readonly pruned = this.#counter('tollgate_retention_pruned_rows_total', 'Rows deleted by retention, by kind (deliveries, events, idempotencyKeys, holds, responseChains, backgroundResponses).', ['kind']);
  readonly eventsFannedOut = this.#counter('tollgate_events_fanned_out_total', 'Outbox events turned into deliveries.');

  // ---- operator ----
  readonly reconciles = this.#counter('tollgate_operator_reconcile_total', 'Reconciles of WebhookSubscription resources by result (success, error, requeue, terminal).', ['result']);
  readonly reconcileDuration = this.#histogram('tollgate_operator_reconcile_duration_seconds', 'Duration of one reconcile.', [], [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]);
  readonly leader = this.#gauge('tollgate_operator_leader', '1 while this operator replica holds the leader lease.');

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
