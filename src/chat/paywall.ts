import { sql } from 'kysely';
import type { AppContext } from '../app/context.ts';
import { charge, type PaywallRefusal, type Trigger } from '../billing/ledger.ts';
import { currencyDecimals, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { connectReply, topupReply } from '../users/links.ts';
import type { ChunkMeta } from './sse.ts';

/**
 * The paywall's two refusals, as ordinary assistant messages: a user who is not connected gets a
 * connect link, a connected user whose balance cannot cover the request gets a top-up link. Links are
 * signed and expire (../users/links.ts); the message text is the project's template.
 */
/** `spend_cap_reached`: the user is at a spend cap (src/limits); the message says when it resets. */
export type PaywallDecision = 'connect_required' | 'topup_required' | 'spend_cap_reached';

export interface LinkReply {
  decision: PaywallDecision;
  url: string;
  message: string;
  /** Top-up links: what the request needs and what the wallet has available. */
  required?: string;
  available?: string;
}

export function linkReply(
  ctx: AppContext,
  project: ProjectContext,
  externalId: string,
  refusal: PaywallRefusal,
): LinkReply {
  const input = {
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
    project,
    externalId,
  };
  if (refusal.reason === 'not_connected') return { decision: 'connect_required', ...connectReply(input) };
  // What a top-up must bring, in the currency's minor unit (a deposit cannot carry finer amounts).
  const required = formatForCurrency(
    new Money(refusal.required).toDecimalPlaces(currencyDecimals(project.currency), Money.ROUND_UP),
    project.currency,
  );
  const available = formatForCurrency(refusal.wallet.available, project.currency);
  return {
    decision: 'topup_required',
    ...topupReply({ ...input, required, available }),
    required,
    available,
  };
}

/** A non-streaming completion whose assistant message carries the link (plus `paywall` for programs). */
export function linkCompletion(meta: ChunkMeta, link: LinkReply) {
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: link.message, refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 },
    paywall: {
      decision: link.decision,
      url: link.url,
      ...(link.required ? { required: link.required, available: link.available } : {}),
    },
  };
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
  ctx: AppContext,
  project: ProjectContext,
  model: ModelRow,
  externalId: string,
  pricing: { fee: string; periodSeconds: number },
  trigger: Trigger,
): Promise<SubscriptionAccess> {
  const current = await ctx.db
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

  const result = await ctx.db.transaction().execute(async (tx): Promise<SubscriptionAccess> => {
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
      const charged = await charge(tx, ctx.events, {
        project,
        externalId,
        amount: pricing.fee,
        source: 'subscription',
        trigger,
        description: `subscription to ${model.id} (${model.period ?? `${pricing.periodSeconds}s`})`,
        metadata: { model: model.id, period: model.period },
      });
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
  });
  if (result.ok && result.renewal?.entryId) ctx.events.wake();
  return result;
}
