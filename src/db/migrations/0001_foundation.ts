import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE projects (
      id text PRIMARY KEY,
      name text NOT NULL,
      currency text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
      owner_user_id text NOT NULL,
      settings jsonb NOT NULL DEFAULT '{}',
      upstream_base_url text,
      upstream_key_sealed text,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE api_keys (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      name text NOT NULL DEFAULT 'default',
      prefix text NOT NULL,
      key_hash text NOT NULL UNIQUE,
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    );
    CREATE INDEX api_keys_project ON api_keys (project_id);

    CREATE TABLE models (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      id text NOT NULL,
      upstream_model text NOT NULL,
      pricing_mode text NOT NULL CHECK (pricing_mode IN ('per_request', 'per_token', 'subscription')),
      per_request numeric CHECK (per_request >= 0),
      input_per_million numeric CHECK (input_per_million >= 0),
      output_per_million numeric CHECK (output_per_million >= 0),
      fee numeric CHECK (fee >= 0),
      period text,
      period_seconds integer CHECK (period_seconds > 0),
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (project_id, id)
    );

    CREATE TABLE end_users (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      external_id text NOT NULL,
      connected boolean NOT NULL DEFAULT false,
      connected_at timestamptz,
      balance numeric NOT NULL DEFAULT 0,
      held numeric NOT NULL DEFAULT 0,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      UNIQUE (project_id, external_id),
      CONSTRAINT end_users_no_overspend CHECK (held >= 0 AND balance >= held)
    );

    CREATE TABLE holds (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      amount numeric NOT NULL CHECK (amount >= 0),
      status text NOT NULL CHECK (status IN ('open', 'settled', 'released', 'expired')),
      purpose text NOT NULL,
      expires_at timestamptz NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      closed_at timestamptz
    );
    CREATE INDEX holds_open_expiry ON holds (expires_at) WHERE status = 'open';

    CREATE TABLE ledger_entries (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      user_id text NOT NULL REFERENCES end_users(id) ON DELETE CASCADE,
      kind text NOT NULL CHECK (kind IN ('deposit', 'charge', 'hold', 'release')),
      amount numeric NOT NULL,
      held_delta numeric NOT NULL DEFAULT 0,
      balance_after numeric NOT NULL,
      held_after numeric NOT NULL,
      hold_id text REFERENCES holds(id),
      source text NOT NULL,
      description text,
      metadata jsonb NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ledger_entries_user ON ledger_entries (user_id, id DESC);

    CREATE TABLE idempotency_keys (
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      endpoint text NOT NULL,
      key text NOT NULL,
      request_hash text NOT NULL,
      status_code integer,
      response jsonb,
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL,
      PRIMARY KEY (project_id, endpoint, key)
    );
    CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

    CREATE TABLE events (
      seq bigserial UNIQUE,
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      type text NOT NULL,
      version text NOT NULL,
      envelope jsonb NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      dispatched_at timestamptz
    );
    CREATE INDEX events_undispatched ON events (seq) WHERE dispatched_at IS NULL;
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    'DROP TABLE events, idempotency_keys, ledger_entries, holds, end_users, models, api_keys, projects',
  );
}
