import type { Kysely } from 'kysely';
import { runStatements } from './run-statements.ts';

/**
 * Webhooks for production (issue 14):
 * - `webhook_subscription_owners`: one row per subscription naming the worker that may send its
 *   deliveries until `expires_at` (renewed while it has some). A worker claims deliveries only of
 *   subscriptions it owns or whose ownership ran out, so the per-subscription concurrency limit holds
 *   across all workers. A trigger makes the row with the subscription.
 * - endpoint health: `failing_since` (first failed attempt since the last success), `disabled_at` and
 *   `disabled_reason` (set when a subscription was disabled for failing too long; cleared on re-enable).
 * - retention: no new index on the hot tables (each one would cost every claim and result write an
 *   index entry; measured: a third of the delivery throughput with 100 subscriptions). Old rows are
 *   found by primary key range, ids sorting by creation time. `ledger_entries.hold_id` stops being a
 *   foreign key (closed holds are pruned, the ledger never is: the column keeps the id of the hold it
 *   moved money for), and so does `webhook_deliveries.event_id` (an event is pruned only after its
 *   deliveries, by age, so deleting it needs no cascade and no index on event_id).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    CREATE TABLE webhook_subscription_owners (
      subscription_id text PRIMARY KEY REFERENCES webhook_subscriptions(id) ON DELETE CASCADE,
      owner text,
      expires_at timestamptz NOT NULL DEFAULT '-infinity'
    );
    INSERT INTO webhook_subscription_owners (subscription_id) SELECT id FROM webhook_subscriptions;
    CREATE FUNCTION webhook_subscription_owner_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO webhook_subscription_owners (subscription_id) VALUES (NEW.id) ON CONFLICT DO NOTHING; RETURN NEW; END $$;
    CREATE TRIGGER webhook_subscription_owner_row AFTER INSERT ON webhook_subscriptions
      FOR EACH ROW EXECUTE FUNCTION webhook_subscription_owner_row();

    ALTER TABLE webhook_subscriptions
      ADD COLUMN failing_since timestamptz,
      ADD COLUMN disabled_at timestamptz,
      ADD COLUMN disabled_reason text;
    CREATE INDEX webhook_subscriptions_failing ON webhook_subscriptions (failing_since)
      WHERE is_active AND failing_since IS NOT NULL;

    ALTER TABLE ledger_entries DROP CONSTRAINT IF EXISTS ledger_entries_hold_id_fkey;
    ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_event_id_fkey;
  `,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await runStatements(
    db,
    `
    ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_event_id_fkey FOREIGN KEY (event_id) REFERENCES events(id) ON DELETE CASCADE NOT VALID;
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_hold_id_fkey FOREIGN KEY (hold_id) REFERENCES holds(id) NOT VALID;
    DROP INDEX webhook_subscriptions_failing;
    ALTER TABLE webhook_subscriptions DROP COLUMN failing_since, DROP COLUMN disabled_at, DROP COLUMN disabled_reason;
    DROP TRIGGER webhook_subscription_owner_row ON webhook_subscriptions;
    DROP FUNCTION webhook_subscription_owner_row();
    DROP TABLE webhook_subscription_owners;
  `,
  );
}
