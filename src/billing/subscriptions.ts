import { sql, type Transaction } from 'kysely';
import { formatAmount, Money } from '../core/money.ts';
import type { Database } from '../db/index.ts';
import type { DB, ModelRow } from '../db/schema.ts';
import type { ChargeInput, ChargeResult, LedgerProject, PaywallRefusal, Trigger } from './ledger.ts';

/** What a subscription's fee needs of the billing service (service.ts, which passes itself). */
export interface FeeBilling {
  withRoom<T>(work: () => Promise<T>): Promise<T>;
  transaction<T>(fn: (tx: Transaction<DB>) => Promise<T>): Promise<T>;
  charge(input: ChargeInput & { model?: string }, within?: Transaction<DB>): Promise<ChargeResult>;
}

export type SubscriptionAccess =
  | { ok: true; userId: string; renewal?: { charged: string; entryId: string | undefined; periodEnd: Date } }
  | PaywallRefusal;

/**
 * Subscription pricing: a connected user with a current period of the model is served free; otherwise a
 * new period starts by charging its fee from the balance (a top-up link when it cannot be paid). The
 * renewal locks the user's row, so concurrent first requests charge one fee.
 */
export async function subscriptionAccess(
  billing: FeeBilling,
  db: Database,
  input: {
    project: LedgerProject;
    model: ModelRow;
    externalId: string;
    pricing: { fee: string; periodSeconds: number };
    trigger: Trigger;
  },
): Promise<SubscriptionAccess> {
  const { project, model, externalId, pricing, trigger } = input;
  const current = await db
    .selectFrom('end_users as e')
    .leftJoin('model_subscriptions as s', (join) =>
      join.onRef('s.user_id', '=', 'e.id').on('s.model_id', '=', model.id),
    )
    .select(['e.id', 'e.connected', sql<boolean>`coalesce(s.period_end > now(), false)`.as('active')])
    .where('e.project_id', '=', project.id)
    .where('e.external_id', '=', externalId)
    .executeTakeFirst();
  if (!current?.connected) return { ok: false, reason: 'not_connected', wallet: undefined };
  if (current.active) return { ok: true, userId: current.id };

  // (withRoom: pods give their slices of the wallet back when they stand in the fee's way)
  return billing.withRoom(() =>
    billing.transaction(async (tx): Promise<SubscriptionAccess> => {
      const user = await tx
        .selectFrom('end_users')
        .select(['id', 'connected'])
        .where('id', '=', current.id)
        .forUpdate()
        .executeTakeFirstOrThrow();
      if (!user.connected) return { ok: false, reason: 'not_connected', wallet: undefined };
      const period = await tx
        .selectFrom('model_subscriptions')
        .select(sql<boolean>`period_end > now()`.as('active'))
        .where('user_id', '=', user.id)
        .where('model_id', '=', model.id)
        .executeTakeFirst();
      if (period?.active) return { ok: true, userId: user.id }; // renewed meanwhile by a concurrent request
      let entryId: string | undefined;
      if (new Money(pricing.fee).gt(0)) {
        const charged = await billing.charge(
          {
            project,
            externalId,
            amount: pricing.fee,
            source: 'subscription',
            trigger,
            description: `subscription to ${model.id} (${model.period ?? `${pricing.periodSeconds}s`})`,
            metadata: { model: model.id, period: model.period },
            model: model.id,
          },
          tx,
        );
        if (!charged.ok) return charged;
        entryId = charged.entry.id;
      }
      const interval = sql`make_interval(secs => ${pricing.periodSeconds})`;
      const row = await tx
        .insertInto('model_subscriptions')
        .values({
          project_id: project.id,
          user_id: user.id,
          model_id: model.id,
          fee: pricing.fee,
          period_start: sql`now()`,
          period_end: sql`now() + ${interval}`,
          charge_entry_id: entryId ?? null,
        })
        .onConflict((oc) =>
          oc.columns(['user_id', 'model_id']).doUpdateSet({
            fee: pricing.fee,
            period_start: sql`now()`,
            period_end: sql`now() + ${interval}`,
            charge_entry_id: entryId ?? null,
            periods: sql`model_subscriptions.periods + 1`,
            updated_at: sql`now()`,
          }),
        )
        .returning('period_end')
        .executeTakeFirstOrThrow();
      return {
        ok: true,
        userId: user.id,
        renewal: { charged: formatAmount(pricing.fee), entryId, periodEnd: row.period_end },
      };
    }),
  );
}
