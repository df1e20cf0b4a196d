import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { idAt, newId } from '../../src/core/ids.ts';
import { pruneOnce } from '../../src/retention/index.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { createTestContext, realPostgres } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * Retention on a real database: what is old enough goes, in batches; what is recent, still pending,
 * still open or not yet expired stays; ledger entries always stay; locked rows are skipped, not waited for.
 * Responses chain sizes and finished background responses go by their creation time.
 */

let ctx: AppContext;
let projectId: string;
let subscriptionId: string;
let userId: string;

const DAY = 24 * 3600_000;
const ago = (ms: number) => new Date(Date.now() - ms).toISOString();

beforeAll(async () => {
  ctx = await createTestContext({
    RETENTION_DELIVERIES_DAYS: '30',
    RETENTION_EVENTS_DAYS: '30',
    RETENTION_IDEMPOTENCY_HOURS: '24',
    RETENTION_HOLDS_DAYS: '30',
    RETENTION_RESPONSES_DAYS: '30',
  });
  ({ projectId } = await seedProject(ctx));
  ({
    subscription: { id: subscriptionId },
  } = await createSubscription(
    ctx,
    projectId,
    { url: 'http://127.0.0.1:9/hook', events: ['*'] },
    { createdBy: 'test' },
  ));
  userId = newId('usr');
  await ctx.db
    .insertInto('end_users')
    .values({ id: userId, project_id: projectId, external_id: 'u1', balance: '100' })
    .execute();
});
afterAll(async () => {
  await ctx?.close();
});

/** Inserts one row of the project into `table`. */
async function insertRow(
  table:
    | 'events'
    | 'webhook_deliveries'
    | 'webhook_attempts'
    | 'holds'
    | 'ledger_entries'
    | 'idempotency_keys'
    | 'response_chains'
    | 'background_responses',
  values: Record<string, unknown>,
) {
  await ctx.db
    .insertInto(table)
    .values(values as never)
    .execute();
}

async function event(createdAt: string, dispatched: boolean): Promise<string> {
  // Ids sort by creation time: an old row carries an old id.
  const id = idAt('evt', Date.parse(createdAt));
  await insertRow('events', {
    id,
    project_id: projectId,
    type: 'balance.deposit.created',
    version: '1.0',
    envelope: JSON.stringify({ id }),
    created_at: createdAt,
    dispatched_at: dispatched ? createdAt : null,
  });
  return id;
}

async function delivery(
  eventId: string,
  status: 'pending' | 'success' | 'error',
  finishedAt: string | null,
  createdAt = finishedAt ?? ago(40 * DAY),
) {
  const id = idAt('dlv', Date.parse(createdAt));
  await insertRow('webhook_deliveries', {
    id,
    project_id: projectId,
    subscription_id: subscriptionId,
    event_id: eventId,
    event_type: 'balance.deposit.created',
    status,
    attempts: 1,
    attempt_limit: 8,
    finished_at: finishedAt,
    next_attempt_at: status === 'pending' ? ago(-DAY) : ago(0),
  });
  await insertRow('webhook_attempts', {
    delivery_id: id,
    attempt: 1,
    claim_id: 'c',
    outcome: status === 'pending' ? 'retry' : status,
    duration_ms: 1,
    started_at: finishedAt ?? ago(0),
  });
  return id;
}

/** The wallet's entries so far (each ledger entry takes the next number). */
let entries = 0;

async function hold(status: 'open' | 'settled' | 'released', closedAt: string | null) {
  const id = idAt('hold', Date.parse(closedAt ?? ago(40 * DAY)));
  await insertRow('holds', {
    id,
    project_id: projectId,
    user_id: userId,
    amount: '1',
    status,
    purpose: 'test',
    expires_at: ago(-DAY),
    closed_at: closedAt,
  });
  await insertRow('ledger_entries', {
    id: newId('act'),
    project_id: projectId,
    user_id: userId,
    kind: 'hold',
    amount: '0',
    held_delta: '1',
    balance_after: '100',
    held_after: '1',
    hold_id: id,
    source: 'test',
    seq: ++entries,
  });
  return id;
}

async function idempotencyKey(key: string, createdAt: string, expiresAt: string) {
  await insertRow('idempotency_keys', {
    project_id: projectId,
    endpoint: 'POST /v1/user/charge',
    key,
    request_hash: 'h',
    created_at: createdAt,
    expires_at: expiresAt,
  });
}

/** A Responses answer's recorded chain size (its id is the provider's: it says nothing of its age). */
async function chain(responseId: string, createdAt: string) {
  await insertRow('response_chains', {
    project_id: projectId,
    response_id: responseId,
    tokens: 10,
    created_at: createdAt,
  });
}

async function background(responseId: string, status: 'pending' | 'settled' | 'expired', createdAt: string) {
  await insertRow('background_responses', {
    project_id: projectId,
    response_id: responseId,
    user_id: userId,
    external_id: 'u1',
    model_id: 'm',
    request_id: 'req',
    held: '1',
    pricing: JSON.stringify({}),
    status,
    created_at: createdAt,
    settled_at: status === 'pending' ? null : createdAt,
  });
}

const responseIds = async (table: 'response_chains' | 'background_responses') =>
  (await ctx.db.selectFrom(table).select('response_id').execute()).map((r) => r.response_id).sort();

const ids = async (table: 'events' | 'webhook_deliveries' | 'holds') =>
  (await ctx.db.selectFrom(table).select('id').execute()).map((r) => r.id).sort();

describe('retention', () => {
  it('prunes by age in batches, keeps what is recent, pending, open or unexpired, and never the ledger', async () => {
    // Events and deliveries.
    const oldEvents = await Promise.all(Array.from({ length: 5 }, () => event(ago(40 * DAY), true)));
    const oldDeliveries = await Promise.all(oldEvents.map((e) => delivery(e, 'success', ago(40 * DAY))));
    const oldPendingEvent = await event(ago(40 * DAY), true);
    const pending = await delivery(oldPendingEvent, 'pending', null);
    const undispatched = await event(ago(40 * DAY), false);
    const recentEvent = await event(ago(DAY), true);
    const recentDelivery = await delivery(recentEvent, 'error', ago(DAY));
    // A finished delivery of an event still within retention goes on its own (events stay until a day
    // after their deliveries may go: 31 days here).
    const keptEvent = await event(ago(10 * DAY), true);
    const oldDeliveryOfKeptEvent = await delivery(keptEvent, 'error', ago(31 * DAY));
    // Holds.
    const oldClosed = await Promise.all([hold('settled', ago(40 * DAY)), hold('released', ago(35 * DAY))]);
    const open = await hold('open', null);
    const recentClosed = await hold('settled', ago(DAY));
    // Idempotency keys.
    await idempotencyKey('old-expired', ago(3 * DAY), ago(2 * DAY));
    await idempotencyKey('old-live', ago(3 * DAY), ago(-DAY));
    await idempotencyKey('young-expired', ago(3600_000), ago(60_000));
    // Responses chain sizes and background responses.
    for (const id of ['resp_old1', 'resp_old2', 'resp_old3']) await chain(id, ago(40 * DAY));
    await chain('resp_recent', ago(DAY));
    await background('resp_bg_settled', 'settled', ago(40 * DAY));
    await background('resp_bg_expired', 'expired', ago(35 * DAY));
    await background('resp_bg_pending', 'pending', ago(40 * DAY));
    await background('resp_bg_recent', 'settled', ago(DAY));
    const ledgerBefore = await ctx.db.selectFrom('ledger_entries').select('id').execute();

    const counts = await pruneOnce(ctx, { batchSize: 2 });
    expect(counts).toEqual({
      deliveries: 6,
      events: 5,
      idempotencyKeys: 1,
      holds: 2,
      responseChains: 3,
      backgroundResponses: 2,
    });
    expect(await responseIds('response_chains')).toEqual(['resp_recent']);
    expect(await responseIds('background_responses')).toEqual(['resp_bg_pending', 'resp_bg_recent']);

    const deliveriesLeft = await ids('webhook_deliveries');
    expect(deliveriesLeft).toEqual([pending, recentDelivery].sort());
    for (const d of [...oldDeliveries, oldDeliveryOfKeptEvent]) expect(deliveriesLeft).not.toContain(d);
    const attempts = await ctx.db.selectFrom('webhook_attempts').select('delivery_id').execute();
    expect(attempts.map((a) => a.delivery_id).sort()).toEqual([pending, recentDelivery].sort());
    expect(await ids('events')).toEqual([oldPendingEvent, undispatched, recentEvent, keptEvent].sort());
    expect(await ids('holds')).toEqual([open, recentClosed].sort());
    for (const h of oldClosed) expect(await ids('holds')).not.toContain(h);
    const keys = await ctx.db.selectFrom('idempotency_keys').select('key').execute();
    expect(keys.map((k) => k.key).sort()).toEqual(['old-live', 'young-expired']);
    // The ledger is never pruned; entries keep the id of the hold they moved money for.
    const ledgerAfter = await ctx.db.selectFrom('ledger_entries').select(['id', 'hold_id']).execute();
    expect(ledgerAfter).toHaveLength(ledgerBefore.length);
    expect(ledgerAfter.map((l) => l.hold_id)).toEqual(expect.arrayContaining(oldClosed));

    const pruned = (await ctx.metrics.pruned.get()).values;
    expect(Object.fromEntries(pruned.map((v) => [v.labels.kind, v.value]))).toMatchObject(counts);
    // Nothing left to do.
    expect(Object.values(await pruneOnce(ctx))).toEqual([0, 0, 0, 0, 0, 0]);
  });

  it('keeps everything when the settings are 0', async () => {
    const keep = {
      ...ctx,
      config: {
        ...ctx.config,
        RETENTION_DELIVERIES_DAYS: 0,
        RETENTION_EVENTS_DAYS: 0,
        RETENTION_IDEMPOTENCY_HOURS: 0,
        RETENTION_HOLDS_DAYS: 0,
        RETENTION_RESPONSES_DAYS: 0,
      },
    } as AppContext;
    const e = await event(ago(400 * DAY), true);
    await delivery(e, 'success', ago(400 * DAY));
    await hold('settled', ago(400 * DAY));
    await chain('resp_ancient', ago(400 * DAY));
    await background('resp_bg_ancient', 'settled', ago(400 * DAY));
    expect(Object.values(await pruneOnce(keep))).toEqual([0, 0, 0, 0, 0, 0]);
    expect(await pruneOnce(ctx)).toMatchObject({
      deliveries: 1,
      events: 1,
      holds: 1,
      responseChains: 1,
      backgroundResponses: 1,
    });
  });

  it.runIf(realPostgres)('skips rows another transaction holds instead of waiting for them', async () => {
    const e = await event(ago(40 * DAY), true);
    const locked = await delivery(e, 'success', ago(40 * DAY));
    const free = await delivery(await event(ago(40 * DAY), true), 'success', ago(40 * DAY));
    let during: Awaited<ReturnType<typeof pruneOnce>> | undefined;
    await ctx.db.transaction().execute(async (tx) => {
      // A worker holding the delivery row (as a claim or a result write would).
      await sql`SELECT id FROM webhook_deliveries WHERE id = ${locked} FOR UPDATE`.execute(tx);
      during = await pruneOnce(ctx);
    });
    // Both events go (neither has a pending delivery); the locked delivery stays for now.
    expect(during).toMatchObject({ deliveries: 1, events: 2 });
    expect(await ids('webhook_deliveries')).toContain(locked);
    expect(await ids('webhook_deliveries')).not.toContain(free);
    // Released: the next pass takes it.
    expect(await pruneOnce(ctx)).toMatchObject({ deliveries: 1, events: 0 });
    expect(await ids('webhook_deliveries')).not.toContain(locked);
  });
});
