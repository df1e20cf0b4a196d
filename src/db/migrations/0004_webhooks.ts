import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Webhook subscriptions, deliveries (one per event and subscription) and the attempts of each delivery.
 * A delivery is due when it is `pending` and `next_attempt_at` has passed; a worker claims it by moving
 * `next_attempt_at` one lease ahead and stamping a fresh `claim_id`, and records its result only while
 * that claim id is still on the row.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE webhook_subscriptions (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      url text NOT NULL,
      events jsonb NOT NULL,
      description text,
      custom_headers jsonb NOT NULL DEFAULT '{}',
      secret_sealed text NOT NULL,
      secret_suffix text NOT NULL,
      is_active boolean NOT NULL DEFAULT true,
      created_by text NOT NULL,
      managed_by text,
      consecutive_failures integer NOT NULL DEFAULT 0,
      last_delivered_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX webhook_subscriptions_project ON webhook_subscriptions (project_id, id);
    CREATE INDEX webhook_subscriptions_active ON webhook_subscriptions (project_id) WHERE is_active;
    CREATE UNIQUE INDEX webhook_subscriptions_managed_by ON webhook_subscriptions (managed_by) WHERE managed_by IS NOT NULL;

    CREATE TABLE webhook_deliveries (
      id text PRIMARY KEY,
      project_id text NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
      subscription_id text NOT NULL REFERENCES webhook_subscriptions(id) ON DELETE CASCADE,
      event_id text NOT NULL REFERENCES events(id) ON DELETE CASCADE,
      event_type text NOT NULL,
      status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'success', 'error')),
      attempts integer NOT NULL DEFAULT 0,
      attempt_limit integer NOT NULL,
      next_attempt_at timestamptz NOT NULL DEFAULT now(),
      claim_id text,
      last_status integer,
      last_response text,
      last_error text,
      last_duration_ms integer,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      finished_at timestamptz,
      UNIQUE (subscription_id, event_id)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
    CREATE INDEX webhook_deliveries_project ON webhook_deliveries (project_id, id DESC);
    CREATE INDEX webhook_deliveries_subscription ON webhook_deliveries (subscription_id, id DESC);
    -- A queue table: every delivery is updated twice soon after it is inserted. Vacuum and analyse it
    -- early so dead row versions and stale statistics do not slow the claim query down.
    ALTER TABLE webhook_deliveries SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

    CREATE TABLE webhook_attempts (
      delivery_id text NOT NULL REFERENCES webhook_deliveries(id) ON DELETE CASCADE,
      attempt integer NOT NULL,
      claim_id text NOT NULL,
      outcome text NOT NULL CHECK (outcome IN ('success', 'retry', 'error')),
      response_status integer,
      response_excerpt text,
      error text,
      duration_ms integer NOT NULL,
      started_at timestamptz NOT NULL,
      finished_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (delivery_id, attempt)
    );
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(db, 'DROP TABLE webhook_attempts, webhook_deliveries, webhook_subscriptions');
}
