import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import type { Database } from '../db/index.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { Metrics } from '../metrics/registry.ts';
import { type SubscriptionStore, subscriptionsChanged } from './subscriptions.ts';

/**
 * Endpoint health, as Svix does it: a subscription whose attempts have all failed for
 * WEBHOOK_DISABLE_AFTER_HOURS (`failing_since`, the first failure after the last success, kept by the
 * result writer) is disabled, with a reason. Each one disabled gets the event
 * `webhook.subscription.disabled` (in the same transaction), counts in
 * `tollgate_webhook_subscriptions_disabled_total`, and its project's subscribers are told (the
 * operator then sets `Ready=False`/`EndpointDisabled` on a managed one). Re-enabling — `isActive: true`
 * through the API or the CLI, or a spec change of the resource — clears the reason.
 */
export async function disableFailingSubscriptions(
  ctx: EndpointHealthContext,
  now = new Date(),
): Promise<number> {
  const hours = ctx.config.WEBHOOK_DISABLE_AFTER_HOURS;
  if (hours <= 0) return 0;
  const disabled = await ctx.db.transaction().execute(async (tx) => {
    const { rows } = await sql<{
      id: string;
      project_id: string;
      owner_user_id: string;
      url: string;
      failing_since: Date | string;
      consecutive_failures: number;
      managed_by: string | null;
      reason: string;
    }>`
      WITH failing AS MATERIALIZED (
        SELECT id FROM webhook_subscriptions
        WHERE is_active AND failing_since IS NOT NULL
          AND failing_since <= ${now.toISOString()}::timestamptz - ${hours}::float8 * interval '1 hour'
        ORDER BY id
        LIMIT 100
        FOR NO KEY UPDATE SKIP LOCKED
      )
      UPDATE webhook_subscriptions s
      SET is_active = false,
          disabled_at = now(),
          disabled_reason = 'every delivery attempt failed for ' || ${hours}::int || ' hours (since '
            || to_char(s.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')',
          updated_at = now()
      FROM projects p
      WHERE s.id IN (SELECT id FROM failing) AND p.id = s.project_id
      RETURNING s.id, s.project_id, p.owner_user_id, s.url, s.failing_since, s.consecutive_failures,
        s.managed_by, s.disabled_reason AS reason`.execute(tx);
    for (const row of rows) {
      await ctx.events.record(tx, {
        project: { id: row.project_id, owner_user_id: row.owner_user_id },
        type: 'webhook.subscription.disabled',
        trigger: { source: 'webhooks', actorType: 'system', actorId: 'endpoint-health' },
        subject: { type: 'webhook_subscription', id: row.id, externalId: row.managed_by ?? '' },
        data: {
          subscriptionId: row.id,
          url: row.url,
          reason: row.reason,
          failingSince: new Date(row.failing_since).toISOString(),
          consecutiveFailures: row.consecutive_failures,
        },
      });
    }
    return rows;
  });
  if (disabled.length === 0) return 0;
  ctx.events.wake();
  for (const row of disabled) {
    ctx.metrics.subscriptionsDisabled.inc({ project: row.project_id });
    ctx.log.warn(
      { subscription: row.id, project: row.project_id, reason: row.reason },
      'webhook subscription disabled: its endpoint kept failing',
    );
  }
  for (const project of new Set(disabled.map((r) => r.project_id))) await subscriptionsChanged(ctx, project);
  return disabled.length;
}

/** What endpoint health uses of the application context (callers pass the context). */
export interface EndpointHealthContext extends Pick<SubscriptionStore, 'bus'> {
  db: Database;
  config: Pick<Config, 'WEBHOOK_DISABLE_AFTER_HOURS'>;
  events: Pick<EventRecorder, 'filter' | 'record' | 'wake'>;
  metrics: Pick<Metrics, 'subscriptionsDisabled'>;
  log: Logger;
}
