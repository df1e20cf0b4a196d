import type { ColumnType, Generated, Insertable, Selectable, Updateable } from 'kysely';

/**
 * Table types for kysely. NUMERIC columns are strings (exact decimals), timestamps are Dates.
 * Each domain's tables are grouped under a heading; the migrations in ./migrations create them.
 */
type Timestamp = ColumnType<Date, Date | string | undefined, Date | string>;
type Numeric = ColumnType<string, string | undefined, string>;
/** A column with a database default: optional on insert. */
type Default<T> = ColumnType<T, T | undefined, T>;
type Json<T = Record<string, unknown>> = ColumnType<T, T | string | undefined, T | string>;

// ---- projects, keys, models (foundation) ----

export interface ProjectSettings {
  /** Message shown when the user must connect; `{link}` is replaced by the link. */
  connectMessage?: string;
  /** Message shown when the balance cannot cover the request; `{link}` and `{amount}` are replaced. */
  topupMessage?: string;
  /** Where the connect page returns to after connecting. */
  returnUrl?: string;
  /** Developer's checkout page; the top-up link redirects there with `user` and `amount`. */
  checkoutUrl?: string;
  /** Completion bound for per-token holds when the client sets no max_tokens. */
  maxCompletionTokens?: number;
  /** `balance.low` when a charge takes a balance below this (a decimal string); a user's own overrides it. */
  lowBalanceThreshold?: string;
  /** Admission: a request whose worst case exceeds available + this (a decimal string, default 0) is refused. */
  debtLimit?: string;
  /** A credit grant given once per end user when they first connect (`reason: trial`). */
  trial?: { amount: string; expiresInDays?: number | undefined };
}

export interface ProjectsTable {
  id: string;
  name: string;
  currency: string;
  owner_user_id: string;
  settings: Json<ProjectSettings>;
  upstream_base_url: string | null;
  upstream_key_sealed: string | null;
  /** Rate and spend limits of the pricing file (src/limits). */
  limits: ColumnType<
    ProjectLimits | null,
    ProjectLimits | string | null | undefined,
    ProjectLimits | string | null
  >;
  /** The resources managing the project, its models and its limits (`<Kind> <ns>/<name>`); NULL: by hand. */
  managed_by: ColumnType<string | null, string | null | undefined, string | null>;
  pricing_managed_by: ColumnType<string | null, string | null | undefined, string | null>;
  limits_managed_by: ColumnType<string | null, string | null | undefined, string | null>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export interface ApiKeysTable {
  id: string;
  project_id: string;
  name: Default<string>;
  prefix: string;
  key_hash: string;
  created_at: Timestamp;
  revoked_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  managed_by: ColumnType<string | null, string | null | undefined, string | null>;
}

/** A key of one end user of a project (`tgu_…`, migration 0028): hashed, optionally capped and expiring. */
export interface EndUserKeysTable {
  id: string;
  project_id: string;
  external_id: string;
  name: string;
  prefix: string;
  key_hash: string;
  spend_cap: ColumnType<string | null, string | null | undefined, string | null>;
  expires_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: Timestamp;
  revoked_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
}

export type PricingMode = 'per_request' | 'per_token' | 'subscription';

export type ModelEndpoint = 'chat' | 'responses' | 'embeddings';

export interface ModelsTable {
  project_id: string;
  id: string;
  upstream_model: string;
  pricing_mode: PricingMode;
  per_request: Numeric | null;
  input_per_million: Numeric | null;
  output_per_million: Numeric | null;
  /** Price of cached input tokens per 1M (per_token; null: the input price). */
  cached_input_per_million: Numeric | null;
  cache_write_per_million: Numeric | null;
  cache_write_1h_per_million: Numeric | null;
  /** Multiplier of the prompt estimate in per-token holds (null: the tokenizer family's default). */
  hold_margin: Numeric | null;
  /** Output and context limits (null: the upstream model family's, src/models/output-limits.ts). */
  max_output_tokens: Default<number | null>;
  context_window: Default<number | null>;
  /** The APIs the model serves: `chat`, `responses`, `embeddings`. */
  endpoints: Default<ModelEndpoint[]>;
  fee: Numeric | null;
  period: string | null;
  period_seconds: number | null;
  /** Routes of the pricing file (src/routing); null: the provider `default` with `upstream_model`. */
  routes: ColumnType<
    ModelRoute[] | null,
    ModelRoute[] | string | null | undefined,
    ModelRoute[] | string | null
  >;
  created_at: Timestamp;
  updated_at: Timestamp;
}

// ---- routing and limits ----

/** One route of a model: a provider of the project and the model name it knows. */
export interface ModelRoute {
  provider: string;
  model: string;
  /** Lower first; routes without one are tried in the order listed. */
  priority?: number;
  /** Share of the load among routes of equal priority (default 1). */
  weight?: number;
}

export interface RateLimit {
  rpm?: number;
  tpm?: number;
}

export interface ProjectLimits {
  project?: RateLimit;
  key?: RateLimit;
  user?: RateLimit;
  /** Spend caps per end user, decimal strings in the project's currency. */
  spend?: { daily?: string; monthly?: string };
}

export interface ProvidersTable {
  project_id: string;
  name: string;
  base_url: string;
  key_sealed: string | null;
  connect_timeout_ms: number | null;
  response_timeout_ms: number | null;
  /** The API the provider speaks (migration 0015). */
  kind: Default<ProviderKind>;
  managed_by: ColumnType<string | null, string | null | undefined, string | null>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export type ProviderKind = 'openai-compatible' | 'anthropic';

export interface SpendCapsTable {
  project_id: string;
  external_id: string;
  daily: Numeric | null;
  monthly: Numeric | null;
  updated_at: Timestamp;
}

/** The hold amounts of requests admitted against spend caps through Postgres (Redis down; 0027). */
export interface SpendReservationsTable {
  id: string;
  project_id: string;
  external_id: string;
  amount: Numeric;
  expires_at: Timestamp;
  created_at: Timestamp;
}

// ---- payments (src/payments) ----

/** A project's top-up options (amounts in the project's currency, decimal strings). */
export interface PaymentSettings {
  presets?: string[];
  minimum?: string;
  maximum?: string;
  /** Auto-recharge of a saved card (issue 25): offered or not, the defaults, and the monthly cap per user. */
  autoRecharge?: AutoRechargeSettings;
}

export interface AutoRechargeSettings {
  offered: boolean;
  /** Recharge when the available balance falls below this (a user may choose their own). */
  threshold: string;
  /** What one recharge adds (a user may choose their own, within minimum and maximum). */
  amount: string;
  /** The most recharged per user per calendar month (UTC). */
  monthlyCap: string;
}

export interface PaymentConnectionsTable {
  project_id: string;
  /** `test`: the test provider (src/payments/test-provider; never in a production configuration). */
  provider: 'stripe' | 'test';
  key_sealed: string;
  /** e.g. `sk_test_…4242`: the kind of key and its last four characters. */
  key_hint: string;
  livemode: Default<boolean>;
  /** The endpoint Tollgate created in the provider's account; null when the secret was pasted. */
  webhook_endpoint_id: string | null;
  webhook_secret_sealed: string;
  settings: Json<PaymentSettings>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** An object of a test provider account (migration 0029): an endpoint, checkout, payment, card or refund. */
export interface TestPaymentObjectsTable {
  id: string;
  account: string;
  kind: string;
  idempotency_key: string | null;
  data: Json<Record<string, unknown>>;
  created_at: Timestamp;
}

/** `uncredited`: paid, but it could not be credited (migration 0023); `problem` says why. */
export type PaymentStatus = 'pending' | 'paid' | 'refunded' | 'disputed' | 'failed' | 'uncredited';

export interface PaymentsTable {
  id: string;
  project_id: string;
  /** Null only on an `uncredited` payment whose user Tollgate does not know. */
  user_id: string | null;
  external_id: string;
  provider: string;
  status: Default<PaymentStatus>;
  amount: Numeric;
  currency: string;
  checkout_id: string | null;
  payment_intent_id: string | null;
  charge_id: string | null;
  receipt_url: string | null;
  refunded: Default<string>;
  disputed: Default<string>;
  /** Reversals the balance could not cover (the no-overspend rule). */
  uncollected: Default<string>;
  created_at: Timestamp;
  updated_at: Timestamp;
  paid_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  /** The payer ticked "save this card and recharge automatically" at checkout. */
  save_card: Default<boolean>;
  /** Why a paid payment could not be credited (status `uncredited`); null otherwise. */
  problem: string | null;
  /** What refunds and disputes took back, in total (at most `amount`; 0027). */
  reversed: Default<string>;
}

export interface PaymentCustomersTable {
  user_id: string;
  project_id: string;
  provider: string;
  customer_id: string;
  payment_method_id: string | null;
  auto_recharge: Default<boolean>;
  threshold: Numeric | null;
  amount: Numeric | null;
  failure_reason: string | null;
  failed_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export interface RechargesTable {
  /** The id of its `payments` row. */
  id: string;
  project_id: string;
  user_id: string;
  status: Default<'pending' | 'succeeded' | 'failed'>;
  amount: Numeric;
  currency: string;
  payment_intent_id: string | null;
  failure_code: string | null;
  failure_reason: string | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export interface PaymentMovementsTable {
  project_id: string;
  key: string;
  payment_id: string;
  kind: 'deposit' | 'refund' | 'dispute' | 'dispute_won';
  amount: Numeric;
  entry_id: string | null;
  created_at: Timestamp;
  /** What a refund or dispute took back of its payment (debited and uncollected; 0027). */
  reversed: Default<string>;
}

// ---- end users and money (foundation) ----

export interface EndUsersTable {
  id: string;
  project_id: string;
  external_id: string;
  connected: Default<boolean>;
  connected_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  /** What the wallet can spend: paid money and unspent credit grants. */
  balance: Numeric;
  /** The pods' slices of the wallet (escrow): what the take's condition counts (0024: internal). */
  held: Numeric;
  /** What the requests in flight reserved (0024): the `held` everything outside a pod shows. */
  reserved: Default<string>;
  /** The number of the wallet's last ledger entry (0024): each movement increments it. */
  entries: Default<string>;
  /** The credit grants' part of the balance (the sum of their `remaining`). */
  granted: Default<string>;
  /** Overrides the project's `lowBalanceThreshold` for this user. */
  low_balance_threshold: ColumnType<string | null, string | null | undefined, string | null>;
  /** When the user got the project's trial grant (once, ever). */
  trial_granted_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** `grant`: a credit grant (not money); `grant_expiry`: its unspent rest leaving at expiry. */
export type LedgerKind = 'deposit' | 'charge' | 'hold' | 'release' | 'grant' | 'grant_expiry';

/** A credit grant (promo, trial, goodwill, …): spent before paid money, may expire. */
export interface CreditGrantsTable {
  id: string;
  project_id: string;
  user_id: string;
  amount: Numeric;
  remaining: Numeric;
  priority: Default<number>;
  reason: string;
  expires_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  expired_amount: ColumnType<string | null, string | null | undefined, string | null>;
  expired_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  /** The `grant` ledger entry. */
  entry_id: string;
  metadata: Json;
  created_at: Timestamp;
}

export interface LedgerEntriesTable {
  id: string;
  project_id: string;
  user_id: string;
  kind: LedgerKind;
  /** Change of the balance (deposit +, charge −, hold/release 0). */
  amount: Numeric;
  /** Change of the held amount (hold +, release −, a charge settling a hold −). */
  held_delta: Default<string>;
  balance_after: Numeric;
  held_after: Numeric;
  hold_id: ColumnType<string | null, string | null | undefined, string | null>;
  source: string;
  description: ColumnType<string | null, string | null | undefined, string | null>;
  metadata: Json;
  /** The entry's number in its wallet (0024): the activity's order, in which it replays. */
  seq: string;
  created_at: Timestamp;
}

export type HoldStatus = 'open' | 'settled' | 'released' | 'expired';

export interface HoldsTable {
  id: string;
  project_id: string;
  user_id: string;
  amount: Numeric;
  status: HoldStatus;
  purpose: string;
  expires_at: Timestamp;
  created_at: Timestamp;
  closed_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  /** The pod whose slice this is (escrow, 0021). */
  owner: string | null;
  /** The number of the last change its pod applied (escrow, 0021). */
  seq: Default<string>;
  /** What the slice's requests in flight reserved, as its pod's change `reserved_seq` said (0024). */
  reserved: Default<string>;
  reserved_seq: Default<string>;
}

export interface IdempotencyKeysTable {
  project_id: string;
  endpoint: string;
  key: string;
  request_hash: string;
  status_code: number | null;
  /** The exact bytes (JSON text) of the stored response. */
  response_body: string | null;
  created_at: Timestamp;
  expires_at: Timestamp;
}

/** Facts about the installation (`encryption_key_check`), one row per name. */
export interface SystemSettingsTable {
  name: string;
  value: string;
  created_at: Generated<Timestamp>;
}

// ---- users ----

/** Nonces of used connect links (a connect link works once); kept until the link would expire. */
export interface UsedLinkTokensTable {
  nonce: string;
  project_id: string;
  kind: string;
  external_id: string;
  used_at: Timestamp;
  expires_at: Timestamp;
}

// ---- chat ----

/** The current (or last) subscription period of a user for a subscription-priced model. */
export interface ModelSubscriptionsTable {
  project_id: string;
  user_id: string;
  model_id: string;
  fee: Numeric;
  period_start: Timestamp;
  period_end: Timestamp;
  charge_entry_id: string | null;
  periods: Default<number>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

// ---- events outbox (foundation) ----

export interface EventsTable {
  id: string;
  project_id: string;
  type: string;
  version: string;
  envelope: Json;
  created_at: Timestamp;
  dispatched_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  seq: Generated<string>;
}

// ---- webhooks ----

export interface WebhookSubscriptionsTable {
  id: string;
  project_id: string;
  url: string;
  events: Json<string[]>;
  description: string | null;
  custom_headers: Json<Record<string, string>>;
  secret_sealed: string;
  secret_suffix: string;
  is_active: Default<boolean>;
  created_by: string;
  managed_by: string | null;
  consecutive_failures: Default<number>;
  last_delivered_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  failing_since: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  disabled_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  disabled_reason: string | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export interface WebhookSubscriptionOwnersTable {
  subscription_id: string;
  owner: string | null;
  expires_at: ColumnType<Date, Date | string | undefined, Date | string>;
}

export type DeliveryStatus = 'pending' | 'success' | 'error';

export interface WebhookDeliveriesTable {
  id: string;
  project_id: string;
  subscription_id: string;
  event_id: string;
  event_type: string;
  status: Default<DeliveryStatus>;
  attempts: Default<number>;
  attempt_limit: number;
  next_attempt_at: Timestamp;
  claim_id: string | null;
  last_status: number | null;
  last_response: string | null;
  last_error: string | null;
  last_duration_ms: number | null;
  created_at: Timestamp;
  updated_at: Timestamp;
  finished_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
}

export interface WebhookAttemptsTable {
  delivery_id: string;
  attempt: number;
  claim_id: string;
  outcome: 'success' | 'retry' | 'error';
  response_status: number | null;
  response_excerpt: string | null;
  error: string | null;
  duration_ms: number;
  started_at: Timestamp;
  finished_at: Timestamp;
}

// ---- admin (developers, sessions, admin tokens) ----

export interface DevelopersTable {
  id: string;
  email: string;
  password_hash: string;
  created_at: Timestamp;
}

export interface AdminSessionsTable {
  id: string;
  developer_id: string;
  token_hash: string;
  csrf_token: string;
  created_at: Timestamp;
  expires_at: Timestamp;
}

export interface AdminTokensTable {
  id: string;
  /** null: a full-access token (every project). */
  developer_id: string | null;
  name: string;
  prefix: string;
  token_hash: string;
  created_at: Timestamp;
  revoked_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
}

/** The audit log (0020): append-only, the database refuses UPDATE, DELETE and TRUNCATE. */
export interface AuditLogTable {
  id: string;
  created_at: Timestamp;
  project_id: string | null;
  /** `developer`, `admin_token`, `api_key`, `cli` or `operator`. */
  actor_type: string;
  actor_id: string;
  actor_email: string | null;
  /** The developer account that acted (a session, or a developer's admin token), if any. */
  developer_id: string | null;
  ip: string | null;
  /** `admin_api`, `dashboard`, `v1`, `cli` or `operator`. */
  via: string;
  action: string;
  target_type: string;
  target_id: string | null;
  before: ColumnType<unknown, unknown, never>;
  after: ColumnType<unknown, unknown, never>;
}

export interface DB {
  audit_log: AuditLogTable;
  developers: DevelopersTable;
  admin_sessions: AdminSessionsTable;
  admin_tokens: AdminTokensTable;
  projects: ProjectsTable;
  api_keys: ApiKeysTable;
  end_user_keys: EndUserKeysTable;
  models: ModelsTable;
  end_users: EndUsersTable;
  ledger_entries: LedgerEntriesTable;
  credit_grants: CreditGrantsTable;
  holds: HoldsTable;
  idempotency_keys: IdempotencyKeysTable;
  used_link_tokens: UsedLinkTokensTable;
  model_subscriptions: ModelSubscriptionsTable;
  events: EventsTable;
  webhook_subscriptions: WebhookSubscriptionsTable;
  webhook_subscription_owners: WebhookSubscriptionOwnersTable;
  webhook_deliveries: WebhookDeliveriesTable;
  webhook_attempts: WebhookAttemptsTable;
  system_settings: SystemSettingsTable;
  providers: ProvidersTable;
  spend_caps: SpendCapsTable;
  spend_reservations: SpendReservationsTable;
  payment_connections: PaymentConnectionsTable;
  test_payment_objects: TestPaymentObjectsTable;
  payments: PaymentsTable;
  payment_movements: PaymentMovementsTable;
  payment_customers: PaymentCustomersTable;
  recharges: RechargesTable;
  response_chains: ResponseChainsTable;
  background_responses: BackgroundResponsesTable;
}

/** A Responses answer Tollgate settled: the tokens charged, for the hold of a request continuing it. */
export interface ResponseChainsTable {
  project_id: string;
  response_id: string;
  conversation_id: string | null;
  tokens: ColumnType<string, number | string, number | string>;
  created_at: Timestamp;
}

/**
 * A Responses `background` response the provider is still working on (migration 0026): charged its
 * hold (`held`) when accepted; `settled` once its real cost (`charged`, the usage in `usage`) is known
 * and the rest of the hold went back; `expired` when it was never seen finished (the hold stays charged).
 */
export interface BackgroundResponsesTable {
  project_id: string;
  response_id: string;
  user_id: string;
  external_id: string;
  model_id: string;
  request_id: string;
  held: Numeric;
  /** The per-token prices when it was accepted (cost.ts's MeteredPricing, as decimal strings). */
  pricing: ColumnType<Record<string, unknown>, string, string>;
  input_count: Default<number>;
  status: Default<'pending' | 'settled' | 'expired'>;
  charged: Numeric | null;
  /** Cost above the hold, not charged (an anomaly: the hold covers the bound sent). */
  excess: Numeric | null;
  usage: ColumnType<Record<string, unknown> | null, string | null, string | null>;
  attempts: Default<number>;
  next_check_at: Timestamp;
  created_at: Timestamp;
  settled_at: Date | null;
}

export type Project = Selectable<ProjectsTable>;
export type ModelRow = Selectable<ModelsTable>;
export type EndUser = Selectable<EndUsersTable>;
export type LedgerEntry = Selectable<LedgerEntriesTable>;
export type CreditGrant = Selectable<CreditGrantsTable>;
export type Hold = Selectable<HoldsTable>;
export type NewEvent = Insertable<EventsTable>;
export type ProjectUpdate = Updateable<ProjectsTable>;
