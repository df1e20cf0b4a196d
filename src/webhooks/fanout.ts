import { sql } from 'kysely';
import type { Config } from '../config/index.ts';
import { newId } from '../core/ids.ts';
import type { Database } from '../db/index.ts';
import type { EventEnvelope } from '../events/outbox.ts';
import type { Metrics } from '../metrics/registry.ts';
import { matchesAny } from './patterns.ts';
import type { EnvelopeCache } from './queue.ts';

/** What the fan-out uses of the application context (callers pass the context). */
export interface FanoutContext {
  db: Database;
  config: Pick<Config, 'WEBHOOK_MAX_ATTEMPTS'>;
  metrics: Pick<Metrics, 'eventsFannedOut'>;
}

export interface FanoutResult {
  events: number;
  deliveries: number;
}

/**
 * Turns a batch of undispatched outbox events into one pending delivery per matching active
 * subscription, and marks the events dispatched, in one transaction: a process dying in between rolls
 * both back, so no event is lost or fanned out twice (the unique (subscription, event) pair guards
 * the deliveries as well). Events are locked with SKIP LOCKED, so many workers fan out side by side.
 */
export async function fanOut(
  ctx: FanoutContext,
  batchSize = 200,
  envelopes?: EnvelopeCache,
): Promise<FanoutResult> {
  const attemptLimit = ctx.config.WEBHOOK_MAX_ATTEMPTS;
  const result = await ctx.db.transaction().execute(async (tx) => {
    const events = (
      await sql<{ id: string; project_id: string; type: string; envelope: EventEnvelope | string }>`
        SELECT id, project_id, type, envelope FROM events
        WHERE dispatched_at IS NULL
        ORDER BY seq
        LIMIT ${batchSize}
        FOR UPDATE SKIP LOCKED`.execute(tx)
    ).rows;
    if (events.length === 0) return { events: 0, deliveries: 0 };
    // The worker that fans out usually sends too: keep the envelopes it just read.
    if (envelopes)
      for (const e of events)
        envelopes.set(e.id, typeof e.envelope === 'string' ? JSON.parse(e.envelope) : e.envelope);
    const projectIds = [...new Set(events.map((e) => e.project_id))];
    const subscriptions = await tx
      .selectFrom('webhook_subscriptions')
      .select(['id', 'project_id', 'events'])
      .where('is_active', '=', true)
      .where('project_id', 'in', projectIds)
      .orderBy('id')
      .execute();
    const byProject = new Map<string, typeof subscriptions>();
    for (const s of subscriptions) {
      const list = byProject.get(s.project_id) ?? [];
      list.push(s);
      byProject.set(s.project_id, list);
    }
    const rows: { id: string; p: string; s: string; e: string; t: string }[] = [];
    for (const event of events) {
      for (const s of byProject.get(event.project_id) ?? []) {
        if (matchesAny(s.events, event.type))
          rows.push({ id: newId('dlv'), p: event.project_id, s: s.id, e: event.id, t: event.type });
      }
    }
    let inserted = 0;
    for (let i = 0; i < rows.length; i += 2000) {
      const chunk = JSON.stringify(rows.slice(i, i + 2000));
      const res = await sql`
        INSERT INTO webhook_deliveries (id, project_id, subscription_id, event_id, event_type, attempt_limit)
        SELECT x.id, x.p, x.s, x.e, x.t, ${attemptLimit}::int
        FROM jsonb_to_recordset(${chunk}::jsonb) AS x(id text, p text, s text, e text, t text)
        ON CONFLICT (subscription_id, event_id) DO NOTHING`.execute(tx);
      inserted += Number(res.numAffectedRows ?? 0);
    }
    await sql`
      UPDATE events SET dispatched_at = now()
      WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(events.map((e) => e.id))}::jsonb)))`.execute(
      tx,
    );
    return { events: events.length, deliveries: inserted };
  });
  if (result.events) ctx.metrics.eventsFannedOut.inc(result.events);
  return result;
}
