import { sql } from 'kysely';
import { z } from 'zod';
import { type Bus, channels } from '../bus/index.ts';
import type { Config } from '../config/index.ts';
import { conflict, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { textInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { EventEnvelope } from '../events/outbox.ts';
import { eventObject } from './deliver.ts';
import { getSubscription } from './subscriptions.ts';

/** Delivery logs: what was sent where, every attempt and its answer. */

/** What the delivery log uses of the application context (callers pass the context). */
export interface DeliveryLogStore {
  db: Database;
  /** Wakes the delivery workers when a delivery is due again. */
  bus: Bus;
  config: Pick<Config, 'WEBHOOK_MAX_ATTEMPTS'>;
}

const intParam = (min: number, max: number, fallback: number) =>
  z
    .union([z.string(), z.number()])
    .optional()
    .transform((v, issue) => {
      if (v === undefined || v === '') return fallback;
      const n = typeof v === 'number' ? v : /^-?\d+$/.test(v.trim()) ? Number(v) : Number.NaN;
      if (!Number.isInteger(n) || n < min || n > max) {
        issue.addIssue({ code: 'custom', message: `must be a whole number from ${min} to ${max}` });
        return z.NEVER;
      }
      return n;
    });

export const logsQuerySchema = z.strictObject({
  subscriptionId: textInput(100).optional(),
  status: z
    .enum(['pending', 'success', 'error'], { error: "must be 'pending', 'success' or 'error'" })
    .optional(),
  eventType: textInput(200).optional(),
  limit: intParam(1, 100, 20),
  starting_after: textInput(100).optional(),
});

export type LogsQuery = z.infer<typeof logsQuerySchema>;

export interface AttemptView {
  attempt: number;
  outcome: 'success' | 'retry' | 'error';
  responseStatus: number | null;
  responseBody: string | null;
  error: string | null;
  durationMs: number;
  startedAt: string;
  finishedAt: string;
}

export interface DeliveryLogView {
  id: string;
  object: 'webhook_delivery';
  subscriptionId: string;
  eventId: string;
  eventType: string;
  status: 'pending' | 'success' | 'error';
  attempts: number;
  nextAttemptAt: string | null;
  lastResponseStatus: number | null;
  lastResponseBody: string | null;
  lastError: string | null;
  durationMs: number | null;
  createdAt: string;
  updatedAt: string;
  finishedAt: string | null;
  /** The Event object sent in every attempt's body. */
  payload: EventEnvelope;
  attemptLog: AttemptView[];
}

const iso = (d: Date | string | null) => (d === null ? null : new Date(d).toISOString());

async function fetchLogs(
  ctx: Pick<DeliveryLogStore, 'db'>,
  projectId: string,
  where: { id?: string; query?: LogsQuery },
): Promise<{ data: DeliveryLogView[]; hasMore: boolean }> {
  const limit = where.query?.limit ?? 1;
  let q = ctx.db
    .selectFrom('webhook_deliveries as d')
    .innerJoin('events as e', 'e.id', 'd.event_id')
    .select([
      'd.id',
      'd.subscription_id',
      'd.event_id',
      'd.event_type',
      'd.status',
      'd.attempts',
      'd.next_attempt_at',
      'd.last_status',
      'd.last_response',
      'd.last_error',
      'd.last_duration_ms',
      'd.created_at',
      'd.updated_at',
      'd.finished_at',
      'e.envelope',
    ])
    .where('d.project_id', '=', projectId)
    .orderBy('d.id', 'desc')
    .limit(limit + 1);
  if (where.id) q = q.where('d.id', '=', where.id);
  const query = where.query;
  if (query?.subscriptionId) q = q.where('d.subscription_id', '=', query.subscriptionId);
  if (query?.status) q = q.where('d.status', '=', query.status);
  if (query?.eventType) q = q.where('d.event_type', '=', query.eventType);
  if (query?.starting_after) q = q.where('d.id', '<', query.starting_after);
  const rows = await q.execute();
  const page = rows.slice(0, limit);
  const attempts = page.length
    ? await ctx.db
        .selectFrom('webhook_attempts')
        .select([
          'delivery_id',
          'attempt',
          'outcome',
          'response_status as responseStatus',
          'response_excerpt as responseBody',
          'error',
          'duration_ms as durationMs',
          'started_at',
          'finished_at',
        ])
        .where(
          'delivery_id',
          'in',
          page.map((r) => r.id),
        )
        .orderBy('delivery_id')
        .orderBy('attempt')
        .execute()
    : [];
  const byDelivery = new Map<string, AttemptView[]>();
  for (const { delivery_id, started_at, finished_at, ...attempt } of attempts) {
    const list = byDelivery.get(delivery_id) ?? [];
    list.push({ ...attempt, startedAt: iso(started_at)!, finishedAt: iso(finished_at)! });
    byDelivery.set(delivery_id, list);
  }
  return {
    hasMore: rows.length > limit,
    data: page.map((r) => ({
      id: r.id,
      object: 'webhook_delivery',
      subscriptionId: r.subscription_id,
      eventId: r.event_id,
      eventType: r.event_type,
      status: r.status,
      attempts: r.attempts,
      nextAttemptAt: r.status === 'pending' ? iso(r.next_attempt_at) : null,
      lastResponseStatus: r.last_status,
      lastResponseBody: r.last_response,
      lastError: r.last_error,
      durationMs: r.last_duration_ms,
      createdAt: iso(r.created_at)!,
      updatedAt: iso(r.updated_at)!,
      finishedAt: iso(r.finished_at),
      payload: eventObject(r.envelope as unknown as EventEnvelope),
      attemptLog: byDelivery.get(r.id) ?? [],
    })),
  };
}

export function listDeliveryLogs(ctx: Pick<DeliveryLogStore, 'db'>, projectId: string, query: LogsQuery) {
  return fetchLogs(ctx, projectId, { query });
}

export async function getDeliveryLog(
  ctx: Pick<DeliveryLogStore, 'db'>,
  projectId: string,
  id: string,
): Promise<DeliveryLogView> {
  const { data } = await fetchLogs(ctx, projectId, { id });
  if (!data[0]) throw notFound(`No webhook delivery with id '${id}'.`, 'delivery_not_found', 'id');
  return data[0];
}

/**
 * Sends a finished delivery again as one more attempt (same delivery id, attempts counting on).
 * A delivery still pending is refused: it is already due or waiting for its next retry.
 */
export async function retryDelivery(
  ctx: DeliveryLogStore,
  projectId: string,
  id: string,
): Promise<DeliveryLogView> {
  const current = await getDeliveryLog(ctx, projectId, id);
  if (current.status === 'pending')
    throw conflict('This delivery is still pending; it will be retried automatically.', 'delivery_pending');
  const updated = await ctx.db
    .updateTable('webhook_deliveries')
    .set({
      status: 'pending',
      attempt_limit: sql`attempts + 1`,
      next_attempt_at: sql`now()`,
      claim_id: null,
      finished_at: null,
      updated_at: sql`now()`,
    })
    .where('id', '=', id)
    .where('project_id', '=', projectId)
    .where('status', '<>', 'pending')
    .executeTakeFirst();
  if (Number(updated.numUpdatedRows) === 0)
    throw conflict('This delivery is still pending; it will be retried automatically.', 'delivery_pending');
  return queued(ctx, projectId, id);
}

/**
 * Queues a `webhook.test` event for one subscription only (whatever its patterns): a ping to check the
 * endpoint and its signature verification. Returns the delivery's log entry.
 */
export async function sendTestPing(
  ctx: DeliveryLogStore,
  project: { id: string; owner_user_id: string },
  subscriptionId: string,
  actor: { type: string; id: string },
): Promise<DeliveryLogView> {
  const subscription = await getSubscription(ctx, project.id, subscriptionId);
  if (!subscription.isActive)
    throw conflict('The subscription is inactive; enable it before sending a test.', 'subscription_inactive');
  const envelope: EventEnvelope = {
    id: newId('evt'),
    paywallId: project.id,
    ownerUserId: project.owner_user_id,
    type: 'webhook.test',
    version: '1.0',
    status: 'pending',
    createdAt: new Date().toISOString(),
    trigger: { source: 'api', actorType: actor.type, actorId: actor.id },
    subject: { type: 'webhook_subscription', id: subscription.id, externalId: '' },
    data: { subscriptionId: subscription.id, message: 'A test delivery from Tollgate.' },
    metadata: {},
  };
  const deliveryId = newId('dlv');
  await ctx.db.transaction().execute(async (tx) => {
    await tx
      .insertInto('events')
      .values({
        id: envelope.id,
        project_id: project.id,
        type: envelope.type,
        version: envelope.version,
        envelope: JSON.stringify(envelope),
        created_at: envelope.createdAt,
        dispatched_at: envelope.createdAt,
      })
      .execute();
    await tx
      .insertInto('webhook_deliveries')
      .values({
        id: deliveryId,
        project_id: project.id,
        subscription_id: subscription.id,
        event_id: envelope.id,
        event_type: envelope.type,
        attempt_limit: ctx.config.WEBHOOK_MAX_ATTEMPTS,
        claim_id: null,
        last_status: null,
        last_response: null,
        last_error: null,
        last_duration_ms: null,
      })
      .execute();
  });
  return queued(ctx, project.id, deliveryId);
}

/**
 * A delivery just queued, as the answer describes it (pending), read before the workers are woken: a
 * worker that delivers at once must not turn the 202 into a report of the delivery's end.
 */
async function queued(ctx: DeliveryLogStore, projectId: string, id: string): Promise<DeliveryLogView> {
  const view = await getDeliveryLog(ctx, projectId, id);
  await ctx.bus.publish(channels.deliveriesDue, '').catch(() => {});
  return view;
}
