import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAudit } from '../audit/index.ts';
import { notFound } from '../core/errors.ts';
import { randomToken } from '../core/ids.ts';
import { Money, priceSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { SpendCaps } from '../projects/directory.ts';

/**
 * Spend caps per end user (`SpendCaps`, cached with the project in src/projects/directory.ts): the
 * periods they count over, the amounts charged in a period, and a user's own caps written.
 */

export type SpendPeriod = 'day' | 'month';

/** Amounts are counted in billionths of the currency unit (exact integers in Redis and in Lua). */
export const SPEND_SCALE = 1_000_000_000;

export function toUnits(amount: string, round: 'up' | 'down' = 'up'): number {
  const scaled = new Money(amount).times(SPEND_SCALE);
  return (round === 'up' ? scaled.ceil() : scaled.floor()).toNumber();
}

export function fromUnits(units: number): string {
  return new Money(units).div(SPEND_SCALE).toFixed();
}

/** The current period: its id (part of the counter key), start and end (UTC). */
export function periodOf(period: SpendPeriod, now = new Date()): { id: string; start: Date; end: Date } {
  const y = now.getUTCFullYear();
  const m = now.getUTCMonth();
  if (period === 'day') {
    const start = new Date(Date.UTC(y, m, now.getUTCDate()));
    return { id: start.toISOString().slice(0, 10), start, end: new Date(start.getTime() + 86_400_000) };
  }
  const start = new Date(Date.UTC(y, m, 1));
  return { id: start.toISOString().slice(0, 7), start, end: new Date(Date.UTC(y, m + 1, 1)) };
}

/** What a user has been charged since `since` (all charges: metered requests, subscription fees, manual). */
export async function chargedSince(
  db: Database,
  projectId: string,
  externalId: string,
  since: Date,
): Promise<string> {
  const row = await db
    .selectFrom('ledger_entries as l')
    .innerJoin('end_users as e', 'e.id', 'l.user_id')
    .select(sql<string>`coalesce(-sum(l.amount), 0)::text`.as('spent'))
    .where('e.project_id', '=', projectId)
    .where('e.external_id', '=', externalId)
    .where('l.kind', '=', 'charge')
    .where('l.created_at', '>=', since)
    .executeTakeFirst();
  return row?.spent ?? '0';
}

/**
 * What counts against a user's caps besides the ledger's charges since `since`: the hold amounts of
 * requests admitted through Postgres while Redis was down (`spend_reservations`, until they settle or
 * expire), and — when `slices` — the wallet's open holds (the pods' slices, which cover what every
 * request in flight reserved: their whole amount counts, a conservative bound). One statement: one
 * snapshot, so a charge moving from a slice to the ledger is counted once.
 */
export async function spentAndReserved(
  db: Database,
  projectId: string,
  externalId: string,
  since: Date,
  opts: { slices: boolean },
): Promise<{ charged: string; reserved: string; held: string }> {
  const { rows } = await sql<{ charged: string; reserved: string; held: string }>`
    SELECT
      (SELECT coalesce(-sum(l.amount), 0) FROM ledger_entries l JOIN end_users e ON e.id = l.user_id
        WHERE e.project_id = ${projectId} AND e.external_id = ${externalId} AND l.kind = 'charge'
          AND l.created_at >= ${since})::text AS charged,
      (SELECT coalesce(sum(r.amount), 0) FROM spend_reservations r
        WHERE r.project_id = ${projectId} AND r.external_id = ${externalId} AND r.expires_at > now())::text
        AS reserved,
      (CASE WHEN ${opts.slices} THEN
        (SELECT coalesce(sum(h.amount), 0) FROM holds h JOIN end_users e ON e.id = h.user_id
          WHERE e.project_id = ${projectId} AND e.external_id = ${externalId} AND h.status = 'open')
        ELSE 0 END)::text AS held
  `.execute(db);
  return rows[0] ?? { charged: '0', reserved: '0', held: '0' };
}

/** How long a reservation made through Postgres counts when its request never settles (its pod died). */
export const RESERVATION_TTL_MS = 30 * 60_000;

export type PostgresSpendDecision =
  | { ok: true; reservationId: string }
  | { ok: false; period: SpendPeriod; cap: string; spent: string };

/**
 * The spend caps checked against Postgres (Redis unreachable): under the user's advisory lock, for each
 * cap the ledger's charges of its period, the open slices and the reservations made this way, plus
 * `amount`, must stay within the cap; then the request's reservation is written, in the same
 * transaction, so concurrent requests on any pod count it. Slower than Redis, and as strict.
 */
export async function reserveInPostgres(
  db: Database,
  input: {
    projectId: string;
    externalId: string;
    amount: string;
    caps: Array<{ period: SpendPeriod; cap: string; start: Date }>;
  },
): Promise<PostgresSpendDecision> {
  const { projectId, externalId, amount } = input;
  return db.transaction().execute(async (tx) => {
    await sql`SELECT pg_advisory_xact_lock(hashtext(${projectId}), hashtext(${externalId}))`.execute(tx);
    await tx
      .deleteFrom('spend_reservations')
      .where('project_id', '=', projectId)
      .where('external_id', '=', externalId)
      .where('expires_at', '<=', sql<Date>`now()`)
      .execute();
    for (const c of input.caps) {
      const used = await spentAndReserved(tx, projectId, externalId, c.start, { slices: true });
      const spent = new Money(used.charged).plus(used.reserved).plus(used.held);
      if (spent.plus(amount).gt(c.cap))
        return { ok: false, period: c.period, cap: c.cap, spent: spent.toFixed() };
    }
    const reservationId = `spr_${randomToken(12)}`;
    await tx
      .insertInto('spend_reservations')
      .values({
        id: reservationId,
        project_id: projectId,
        external_id: externalId,
        amount,
        expires_at: new Date(Date.now() + RESERVATION_TTL_MS),
      })
      .execute();
    return { ok: true, reservationId };
  });
}

/** A reservation made through Postgres, ended: its request settled (its charge is in the ledger) or was released. */
export async function endReservation(db: Database, reservationId: string): Promise<void> {
  await db.deleteFrom('spend_reservations').where('id', '=', reservationId).execute();
}

export const spendCapsSchema = z.strictObject({
  daily: priceSchema.nullable().optional(),
  monthly: priceSchema.nullable().optional(),
});

/**
 * Sets a user's own spend caps (null or absent: the project's cap applies); both null removes the
 * override. Call `ctx.projects.changed(projectId)` afterwards.
 */
export async function setUserSpendCaps(
  db: Database,
  projectId: string,
  externalId: string,
  input: z.input<typeof spendCapsSchema>,
  opts: { actor?: Actor } = {},
): Promise<SpendCaps> {
  const parsed = parseInput(spendCapsSchema, input, 'spend caps');
  const project = await db.selectFrom('projects').select('id').where('id', '=', projectId).executeTakeFirst();
  if (!project) throw notFound(`No project ${projectId}.`, 'project_not_found');
  const daily = parsed.daily ?? null;
  const monthly = parsed.monthly ?? null;
  if (opts.actor) {
    // One transaction: the caps and their audit entry (with the caps before) commit together.
    const actor = opts.actor;
    return db.transaction().execute(async (tx) => {
      const was = await tx
        .selectFrom('spend_caps')
        .select(['daily', 'monthly'])
        .where('project_id', '=', projectId)
        .where('external_id', '=', externalId)
        .forUpdate()
        .executeTakeFirst();
      const caps = await setUserSpendCaps(tx, projectId, externalId, input);
      const before = { daily: was?.daily ?? null, monthly: was?.monthly ?? null };
      const after = { daily, monthly };
      if (JSON.stringify(before) !== JSON.stringify(after))
        await recordAudit(tx, {
          actor,
          projectId,
          action: 'limits.spend_caps',
          targetType: 'user',
          targetId: externalId,
          before,
          after,
        });
      return caps;
    });
  }
  if (daily === null && monthly === null) {
    await db
      .deleteFrom('spend_caps')
      .where('project_id', '=', projectId)
      .where('external_id', '=', externalId)
      .execute();
    return {};
  }
  await db
    .insertInto('spend_caps')
    .values({ project_id: projectId, external_id: externalId, daily, monthly })
    .onConflict((oc) =>
      oc.columns(['project_id', 'external_id']).doUpdateSet({ daily, monthly, updated_at: new Date() }),
    )
    .execute();
  return { daily: daily ?? undefined, monthly: monthly ?? undefined };
}
