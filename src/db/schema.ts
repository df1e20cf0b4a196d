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
}

export interface ProjectsTable {
  id: string;
  name: string;
  currency: string;
  owner_user_id: string;
  settings: Json<ProjectSettings>;
  upstream_base_url: string | null;
  upstream_key_sealed: string | null;
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
}

export type PricingMode = 'per_request' | 'per_token' | 'subscription';

export interface ModelsTable {
  project_id: string;
  id: string;
  upstream_model: string;
  pricing_mode: PricingMode;
  per_request: Numeric | null;
  input_per_million: Numeric | null;
  output_per_million: Numeric | null;
  fee: Numeric | null;
  period: string | null;
  period_seconds: number | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

// ---- end users and money (foundation) ----

export interface EndUsersTable {
  id: string;
  project_id: string;
  external_id: string;
  connected: Default<boolean>;
  connected_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  balance: Numeric;
  held: Numeric;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export type LedgerKind = 'deposit' | 'charge' | 'hold' | 'release';

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
}

export interface IdempotencyKeysTable {
  project_id: string;
  endpoint: string;
  key: string;
  request_hash: string;
  status_code: number | null;
  response: Json<unknown> | null;
  created_at: Timestamp;
  expires_at: Timestamp;
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

export interface DB {
  projects: ProjectsTable;
  api_keys: ApiKeysTable;
  models: ModelsTable;
  end_users: EndUsersTable;
  ledger_entries: LedgerEntriesTable;
  holds: HoldsTable;
  idempotency_keys: IdempotencyKeysTable;
  events: EventsTable;
}

export type Project = Selectable<ProjectsTable>;
export type ModelRow = Selectable<ModelsTable>;
export type EndUser = Selectable<EndUsersTable>;
export type LedgerEntry = Selectable<LedgerEntriesTable>;
export type Hold = Selectable<HoldsTable>;
export type NewEvent = Insertable<EventsTable>;
export type ProjectUpdate = Updateable<ProjectsTable>;
