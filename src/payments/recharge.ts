import { sql, type Transaction } from 'kysely';
import type { WalletDebit } from '../billing/service.ts';
import { newId } from '../core/ids.ts';
import { amountSchema, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import type { AutoRechargeSettings, DB } from '../db/schema.ts';
import type { EventType } from '../events/catalog.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { openConnection, type PaymentsContext } from './connection.ts';
import { PaymentProviderError, toMinorUnits } from './provider.ts';
import { checkSettings } from './settings.ts';

/**
 * Auto-recharge (issue 25): a user who saved their card at checkout has it charged off session for the
 * recharge amount when their available balance falls below the threshold.
 *
 * - Never on the request path: the billing service tells `RechargeService` of every committed debit
 *   (`onDebit`), which starts a recharge in the background; a job (`scan`) catches wallets below the
 *   threshold that nobody saw (another pod's restart) and retries creations that never reached Stripe.
 * - At most one recharge in flight per wallet, and the monthly cap, on any number of pods: `reserve`
 *   locks the wallet's and the saved card's rows, then checks there is no `pending` recharge and that the month's recharges
 *   (pending and succeeded) plus this one stay within the cap, and inserts the recharge and its payment in
 *   the same transaction; the partial unique index `recharges_one_pending` backs the first rule.
 * - Credited only by the payment's webhook (`payment_intent.succeeded`, ./webhooks), once, through the
 *   same deposit path and movement key table as a checkout.
 * - A declined card, or one that needs its holder (`authentication_required`), fails the recharge, turns
 *   auto-recharge off for the user with the reason (the portal shows it) and emits
 *   `payment.recharge.failed` — from the create call's error or from `payment_intent.payment_failed`,
 *   whichever comes first, once.
 */

type RechargeRow = { id: string; project_id: string; user_id: string; amount: string; currency: string };

/** What auto-recharge uses of the process (no public address: it makes no links). */
export type RechargeContext = PaymentsContext;

/** A recharge's event (`payment.recharge.succeeded` or `.failed`), its provider's as the actor. */
async function recordRecharge(
  events: RechargeContext['events'],
  tx: Transaction<DB>,
  input: {
    project: Pick<ProjectContext, 'id' | 'owner_user_id'>;
    type: EventType;
    provider: string;
    actorId: string;
    recharge: { id: string; user_id: string; amount: string; currency: string };
    externalId: string;
    data: Record<string, unknown>;
  },
): Promise<void> {
  const { recharge } = input;
  await events.record(tx, {
    project: input.project,
    type: input.type,
    trigger: { source: input.provider, actorType: 'payment_provider', actorId: input.actorId },
    subject: { type: 'user', id: recharge.user_id, externalId: input.externalId },
    data: {
      paymentId: recharge.id,
      externalUserId: input.externalId,
      amount: formatForCurrency(recharge.amount, recharge.currency),
      currency: recharge.currency,
      ...input.data,
    },
  });
}

/** The project's auto-recharge settings, when payments are connected and it is offered. */
export async function rechargeSettingsOf(
  ctx: Pick<PaymentsContext, 'db'>,
  projectId: string,
  currency: string,
): Promise<AutoRechargeSettings | undefined> {
  const connection = await ctx.db
    .selectFrom('payment_connections')
    .select('settings')
    .where('project_id', '=', projectId)
    .executeTakeFirst();
  if (!connection) return undefined;
  const settings = checkSettings(currency, connection.settings).autoRecharge;
  return settings.offered ? settings : undefined;
}

/** Keeps a user's card after a checkout where they ticked "save this card and recharge automatically". */
export async function saveCard(
  ctx: Pick<RechargeContext, 'db'>,
  project: { id: string; currency: string },
  userId: string,
  card: { provider: string; customerId: string; paymentMethodId: string | null },
): Promise<void> {
  const offered = await rechargeSettingsOf(ctx, project.id, project.currency);
  const values = {
    provider: card.provider,
    customer_id: card.customerId,
    payment_method_id: card.paymentMethodId,
    auto_recharge: Boolean(offered && card.paymentMethodId),
    failure_reason: null,
    failed_at: null,
  };
  await ctx.db
    .insertInto('payment_customers')
    .values({ user_id: userId, project_id: project.id, ...values })
    .onConflict((oc) => oc.column('user_id').doUpdateSet({ ...values, updated_at: sql`now()` }))
    .execute();
}

/** What the portal shows and edits: the saved card, the user's choice, the project's limits. */
export async function autoRechargeOf(
  ctx: Pick<RechargeContext, 'db'>,
  project: ProjectContext,
  userId: string | undefined,
) {
  const settings = await rechargeSettingsOf(ctx, project.id, project.currency);
  if (!settings) return undefined;
  const card = userId
    ? await ctx.db
        .selectFrom('payment_customers')
        .selectAll()
        .where('user_id', '=', userId)
        .executeTakeFirst()
    : undefined;
  const connection = await ctx.db
    .selectFrom('payment_connections')
    .select('settings')
    .where('project_id', '=', project.id)
    .executeTakeFirst();
  const limits = checkSettings(project.currency, connection?.settings);
  return {
    settings,
    minimum: limits.minimum,
    maximum: limits.maximum,
    saved: Boolean(card?.payment_method_id),
    on: Boolean(card?.auto_recharge),
    threshold: card?.threshold ?? settings.threshold,
    amount: card?.amount ?? settings.amount,
    failureReason: card?.failure_reason ?? null,
    failedAt: card?.failed_at ?? null,
  };
}

/** The portal's form: on/off, the user's own threshold and amount within the project's limits. */
export async function setAutoRecharge(
  ctx: Pick<RechargeContext, 'db'>,
  project: ProjectContext,
  userId: string,
  input: { on: boolean; threshold: string; amount: string },
): Promise<{ ok: true } | { ok: false; error: string }> {
  const view = await autoRechargeOf(ctx, project, userId);
  if (!view) return { ok: false, error: 'Automatic recharge is not offered.' };
  if (!view.saved) return { ok: false, error: 'Save a card first: tick “save this card” when you top up.' };
  const currency = project.currency;
  const m = (v: string) => `${formatForCurrency(v, currency)} ${currency.toUpperCase()}`;
  const amount = amountSchema(currency).safeParse(input.amount.trim());
  if (!amount.success || new Money(amount.data).lt(view.minimum) || new Money(amount.data).gt(view.maximum))
    return { ok: false, error: `Choose a recharge amount from ${m(view.minimum)} to ${m(view.maximum)}.` };
  const threshold = amountSchema(currency).safeParse(input.threshold.trim());
  if (!threshold.success || new Money(threshold.data).gt(view.maximum))
    return { ok: false, error: `Choose a threshold from ${m('0')} to ${m(view.maximum)}.` };
  await ctx.db
    .updateTable('payment_customers')
    .set({
      auto_recharge: input.on,
      threshold: threshold.data,
      amount: amount.data,
      ...(input.on ? { failure_reason: null, failed_at: null } : {}),
      updated_at: sql`now()`,
    })
    .where('user_id', '=', userId)
    .execute();
  return { ok: true };
}

/**
 * Fails a pending recharge once: its payment fails, auto-recharge is turned off for the user with the
 * reason, and `payment.recharge.failed` is recorded. False when it was no longer pending.
 */
export async function failRecharge(
  ctx: Pick<RechargeContext, 'billing' | 'events' | 'log'>,
  project: Pick<ProjectContext, 'id' | 'owner_user_id'>,
  rechargeId: string,
  failure: { code: string | null; message: string; paymentIntentId: string | null; actorId: string },
): Promise<boolean> {
  const failed = await ctx.billing.transaction(async (tx) => {
    const recharge = await tx
      .updateTable('recharges')
      .set({
        status: 'failed',
        failure_code: failure.code,
        failure_reason: failure.message,
        payment_intent_id: sql`coalesce(payment_intent_id, ${failure.paymentIntentId})`,
        updated_at: sql`now()`,
      })
      .where('id', '=', rechargeId)
      .where('status', '=', 'pending')
      .returningAll()
      .executeTakeFirst();
    if (!recharge) return false;
    const payment = await tx
      .updateTable('payments')
      .set({ status: 'failed', updated_at: sql`now()` })
      .where('id', '=', recharge.id)
      .returning(['external_id', 'provider'])
      .executeTakeFirstOrThrow();
    await tx
      .updateTable('payment_customers')
      .set({
        auto_recharge: false,
        failure_reason: failure.message,
        failed_at: sql`now()`,
        updated_at: sql`now()`,
      })
      .where('user_id', '=', recharge.user_id)
      .execute();
    await recordRecharge(ctx.events, tx, {
      project,
      type: 'payment.recharge.failed',
      provider: payment.provider,
      actorId: failure.actorId,
      recharge,
      externalId: payment.external_id,
      data: {
        providerPaymentId: recharge.payment_intent_id,
        code: failure.code,
        reason: failure.message,
        autoRecharge: 'off',
      },
    });
    ctx.billing.afterCommit(tx, () => ctx.events.wake());
    return true;
  });
  if (failed)
    ctx.log.info(
      { projectId: project.id, rechargeId, code: failure.code },
      'auto-recharge failed; turned off',
    );
  return failed;
}

/** Marks a recharge succeeded and records `payment.recharge.succeeded`, in the deposit's transaction. */
export async function rechargeSucceeded(
  ctx: Pick<RechargeContext, 'events'>,
  tx: Transaction<DB>,
  project: Pick<ProjectContext, 'id' | 'owner_user_id'>,
  input: {
    provider: string;
    rechargeId: string;
    paymentIntentId: string;
    externalId: string;
    activityId: string;
    eventId: string;
  },
): Promise<void> {
  const recharge = await tx
    .updateTable('recharges')
    .set({ status: 'succeeded', payment_intent_id: input.paymentIntentId, updated_at: sql`now()` })
    .where('id', '=', input.rechargeId)
    .returningAll()
    .executeTakeFirstOrThrow();
  const month = await monthTotal(tx, recharge.user_id);
  await recordRecharge(ctx.events, tx, {
    project,
    type: 'payment.recharge.succeeded',
    provider: input.provider,
    actorId: input.eventId,
    recharge,
    externalId: input.externalId,
    data: {
      providerPaymentId: input.paymentIntentId,
      activityId: input.activityId,
      rechargedThisMonth: formatForCurrency(month, recharge.currency),
    },
  });
}

/** The month's recharges (pending and succeeded) of a user: what the cap counts. */
async function monthTotal(tx: Transaction<DB>, userId: string): Promise<string> {
  const row = await tx
    .selectFrom('recharges')
    .select(sql<string>`coalesce(sum(amount), 0)`.as('total'))
    .where('user_id', '=', userId)
    .where('status', 'in', ['pending', 'succeeded'])
    .where('created_at', '>=', sql<Date>`date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`)
    .executeTakeFirstOrThrow();
  return formatAmount(row.total);
}

/** Runs recharges in the background of one process; see the module's comment. */
export class RechargeService {
  readonly #ctx: RechargeContext;
  readonly #running = new Set<Promise<unknown>>();
  /** Wallets this process is looking at now (a burst of debits starts one look, not one each). */
  readonly #looking = new Set<string>();
  readonly #again = new Set<string>();
  /** Projects that offer auto-recharge, read at most every few seconds (the debit path asks often). */
  readonly #offered = new Map<string, { offered: { maximum: string } | undefined; until: number }>();

  constructor(ctx: RechargeContext) {
    this.#ctx = ctx;
  }

  /** The billing service's debit listener: starts a look at the wallet in the background. */
  readonly onDebit = (debit: WalletDebit): void => {
    this.#background(this.#onDebit(debit));
  };

  /** Resolves when no recharge work of this process is running (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.#running.size) await Promise.allSettled([...this.#running]);
  }

  /**
   * The job: starts a recharge for every wallet below its threshold with auto-recharge on, and retries
   * the creation of pending recharges that have no payment yet (a process died between the reservation
   * and Stripe's answer; the idempotency key makes the retry safe), and fails pending recharges whose
   * payment failed at Stripe without a webhook arriving within an hour. Returns how many wallets and
   * recharges it looked at (a wallet at its monthly cap is looked at, and left alone).
   */
  async scan(limit = 200): Promise<number> {
    const { db } = this.#ctx;
    const below = await db
      .selectFrom('payment_customers as c')
      .innerJoin('end_users as e', 'e.id', 'c.user_id')
      .innerJoin('payment_connections as p', 'p.project_id', 'c.project_id')
      .select(['c.user_id', 'c.project_id', 'e.external_id'])
      .where('c.auto_recharge', '=', true)
      .where(
        sql<boolean>`e.balance - e.reserved < coalesce(c.threshold, (p.settings->'autoRecharge'->>'threshold')::numeric)`,
      )
      .where(
        sql<boolean>`NOT EXISTS (SELECT 1 FROM recharges r WHERE r.user_id = c.user_id AND r.status = 'pending')`,
      )
      .limit(limit)
      .execute();
    const stuck = await db
      .selectFrom('recharges')
      .select(['id', 'project_id'])
      .where('status', '=', 'pending')
      .where('payment_intent_id', 'is', null)
      .where('created_at', '<', sql<Date>`now() - interval '1 minute'`)
      .limit(limit)
      .execute();
    // Created but unheard of for an hour (an endpoint without the payment_intent events, a lost
    // delivery): a payment that failed at Stripe fails here too, so the wallet is not blocked forever.
    const silent = await db
      .selectFrom('recharges')
      .select(['id', 'project_id', 'payment_intent_id'])
      .where('status', '=', 'pending')
      .where('payment_intent_id', 'is not', null)
      .where('updated_at', '<', sql<Date>`now() - interval '1 hour'`)
      .limit(limit)
      .execute();
    const work: Array<Promise<unknown>> = [];
    for (const w of below) work.push(this.#background(this.#look(w.project_id, w.user_id)));
    for (const r of stuck) work.push(this.#background(this.#retry(r.id, r.project_id)));
    for (const r of silent)
      work.push(this.#background(this.#reconcile(r.id, r.project_id, r.payment_intent_id!)));
    await Promise.allSettled(work);
    return below.length + stuck.length + silent.length;
  }

  #background<T>(work: Promise<T>): Promise<T | undefined> {
    const run = work
      .catch((err) => {
        this.#ctx.log.warn({ err }, 'auto-recharge: a background step failed; the job retries');
        return undefined;
      })
      .finally(() => this.#running.delete(run));
    this.#running.add(run);
    return run;
  }

  async #onDebit(debit: WalletDebit): Promise<void> {
    const offered = await this.#projectOffers(debit.projectId);
    // No threshold (the project's or a user's own) lies above the project's maximum top-up.
    if (!offered || new Money(debit.available).gte(offered.maximum)) return;
    await this.#look(debit.projectId, debit.userId);
  }

  /** The project's auto-recharge limits when it offers it, read at most every 5 seconds per project. */
  async #projectOffers(projectId: string): Promise<{ maximum: string } | undefined> {
    const cached = this.#offered.get(projectId);
    if (cached && cached.until > Date.now()) return cached.offered;
    const row = await this.#ctx.db
      .selectFrom('payment_connections')
      .select([
        sql<boolean>`coalesce((settings->'autoRecharge'->>'offered')::boolean, false)`.as('offered'),
        sql<string | null>`settings->>'maximum'`.as('maximum'),
      ])
      .where('project_id', '=', projectId)
      .executeTakeFirst();
    const offered = row?.offered && row.maximum ? { maximum: row.maximum } : undefined;
    this.#offered.set(projectId, { offered, until: Date.now() + 5_000 });
    return offered;
  }

  /** Reserves a recharge for the wallet when it is due, then charges the card. */
  async #look(projectId: string, userId: string): Promise<void> {
    // A debit during a look may have read a newer balance than the look did: it asks for one more.
    if (this.#looking.has(userId)) {
      this.#again.add(userId);
      return;
    }
    this.#looking.add(userId);
    let recharge: RechargeRow | undefined;
    let project: ProjectContext | undefined;
    try {
      project = await this.#ctx.projects.get(projectId);
      if (!project) return;
      const settings = await rechargeSettingsOf(this.#ctx, projectId, project.currency);
      if (!settings) return;
      recharge = await this.#reserve(project, userId, settings);
    } finally {
      this.#looking.delete(userId);
    }
    if (recharge && project) await this.#charge(project, recharge);
    else if (this.#again.delete(userId)) await this.#look(projectId, userId);
    this.#again.delete(userId);
  }

  /**
   * In one transaction under the wallet's and the saved card's row locks: the wallet is below its threshold, no recharge
   * of it is pending, and the month's recharges plus this one stay within the cap — then the recharge
   * and its payment are inserted. Undefined when any of this does not hold.
   */
  async #reserve(
    project: ProjectContext,
    userId: string,
    settings: AutoRechargeSettings,
  ): Promise<RechargeRow | undefined> {
    const { db } = this.#ctx;
    // Most debits below the threshold find a recharge pending already, or the month's cap reached: a
    // plain read says so, without taking the wallet's lock on the hot path's row.
    const quick = await sql<{ due: boolean }>`
      SELECT (e.balance - e.reserved < coalesce(c.threshold, ${settings.threshold}::numeric)
              AND NOT EXISTS (SELECT 1 FROM recharges r WHERE r.user_id = e.id AND r.status = 'pending')
              AND (SELECT coalesce(sum(r.amount), 0) FROM recharges r
                   WHERE r.user_id = e.id AND r.status IN ('pending', 'succeeded')
                     AND r.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
                  + coalesce(c.amount, ${settings.amount}::numeric) <= ${settings.monthlyCap}::numeric) AS due
      FROM end_users e JOIN payment_customers c ON c.user_id = e.id
      WHERE e.id = ${userId} AND c.auto_recharge`.execute(db);
    if (!quick.rows[0]?.due) return undefined;
    return db.transaction().execute(async (tx) => {
      // The wallet's row first, as holds and settles lock it (a key-share lock from the inserts' foreign
      // keys beside their updates would make Postgres queue them into a deadlock), then the saved card.
      await tx.selectFrom('end_users').select('id').where('id', '=', userId).forNoKeyUpdate().execute();
      const card = await tx
        .selectFrom('payment_customers')
        .selectAll()
        .where('user_id', '=', userId)
        .where('project_id', '=', project.id)
        .forUpdate()
        .executeTakeFirst();
      if (!card?.auto_recharge || !card.payment_method_id) return undefined;
      const threshold = card.threshold ?? settings.threshold;
      const amount = card.amount ?? settings.amount;
      const id = newId('pay');
      // One statement: due, none pending, within the month's cap; the payment row comes with it.
      const reserved = await sql<RechargeRow>`
        WITH due AS (
          SELECT e.id, e.external_id FROM end_users e
          WHERE e.id = ${userId} AND e.balance - e.reserved < ${threshold}::numeric
            AND NOT EXISTS (SELECT 1 FROM recharges r WHERE r.user_id = e.id AND r.status = 'pending')
            AND (SELECT coalesce(sum(r.amount), 0) FROM recharges r
                 WHERE r.user_id = e.id AND r.status IN ('pending', 'succeeded')
                   AND r.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
                + ${amount}::numeric <= ${settings.monthlyCap}::numeric
        ), p AS (
          INSERT INTO payments (id, project_id, user_id, external_id, provider, amount, currency)
          SELECT ${id}, ${project.id}, id, external_id, ${card.provider}, ${amount}::numeric, ${project.currency} FROM due
          RETURNING id
        )
        INSERT INTO recharges (id, project_id, user_id, amount, currency)
        SELECT p.id, ${project.id}, ${userId}, ${amount}::numeric, ${project.currency} FROM p
        ON CONFLICT (user_id) WHERE status IN ('pending') DO NOTHING
        RETURNING id, project_id, user_id, amount, currency`.execute(tx);
      const row = reserved.rows[0];
      if (!row) {
        // Nothing inserted into recharges (a pending one raced in): the payment row must not stay.
        await tx
          .deleteFrom('payments')
          .where('id', '=', id)
          .where('id', 'not in', tx.selectFrom('recharges').select('id'))
          .execute();
      }
      return row;
    });
  }

  async #retry(rechargeId: string, projectId: string): Promise<void> {
    const project = await this.#ctx.projects.get(projectId);
    if (!project) return;
    const recharge = await this.#ctx.db
      .selectFrom('recharges')
      .select(['id', 'project_id', 'user_id', 'amount', 'currency'])
      .where('id', '=', rechargeId)
      .where('status', '=', 'pending')
      .executeTakeFirst();
    if (recharge) await this.#charge(project, recharge);
  }

  /** A pending recharge whose webhook never came: failed at Stripe → failed here (never credited here). */
  async #reconcile(rechargeId: string, projectId: string, paymentIntentId: string): Promise<void> {
    const project = await this.#ctx.projects.get(projectId);
    const payments = project && (await openConnection(this.#ctx, projectId));
    if (!project || !payments) return;
    const state = await payments.provider.paymentState(paymentIntentId);
    if (['requires_payment_method', 'requires_action', 'canceled'].includes(state.status)) {
      await failRecharge(this.#ctx, project, rechargeId, {
        code: state.code ?? state.status,
        message: state.message ?? `The payment was not completed (${state.status}).`,
        paymentIntentId,
        actorId: rechargeId,
      });
    } else if (state.status === 'succeeded') {
      this.#ctx.log.warn(
        { projectId, rechargeId, paymentIntentId },
        'a recharge succeeded at Stripe but its payment_intent.succeeded webhook has not arrived; it is credited when it does (check the endpoint’s events)',
      );
    }
  }

  /** Charges the saved card off session (idempotency key: the recharge); the webhook credits it. */
  async #charge(project: ProjectContext, recharge: RechargeRow): Promise<void> {
    const { db } = this.#ctx;
    const payments = await openConnection(this.#ctx, project.id);
    const card = await db
      .selectFrom('payment_customers')
      .selectAll()
      .where('user_id', '=', recharge.user_id)
      .executeTakeFirst();
    const externalId = (
      await db
        .selectFrom('payments')
        .select('external_id')
        .where('id', '=', recharge.id)
        .executeTakeFirstOrThrow()
    ).external_id;
    if (!payments || !card) {
      await failRecharge(this.#ctx, project, recharge.id, {
        code: 'no_saved_card',
        message: 'There is no saved card (or payments were disconnected).',
        paymentIntentId: null,
        actorId: recharge.id,
      });
      return;
    }
    try {
      const intent = await payments.provider.chargeSavedCard({
        paymentId: recharge.id,
        projectId: project.id,
        externalId,
        customerId: card.customer_id,
        paymentMethodId: card.payment_method_id,
        currency: recharge.currency,
        amountMinor: toMinorUnits(formatAmount(recharge.amount), recharge.currency),
        description: `${project.name} automatic recharge`,
        idempotencyKey: `tollgate-recharge-${recharge.id}`,
      });
      await db
        .updateTable('recharges')
        .set({ payment_intent_id: intent.id, updated_at: sql`now()` })
        .where('id', '=', recharge.id)
        .execute();
      await db
        .updateTable('payments')
        .set({ payment_intent_id: sql`coalesce(payment_intent_id, ${intent.id})`, updated_at: sql`now()` })
        .where('id', '=', recharge.id)
        .execute();
    } catch (err) {
      if (err instanceof PaymentProviderError && err.declined) {
        await failRecharge(this.#ctx, project, recharge.id, {
          code: err.code ?? 'card_declined',
          message: err.detail,
          paymentIntentId: null,
          actorId: recharge.id,
        });
        return;
      }
      // A network or provider failure: the recharge stays pending; the job retries it with the same key.
      throw err;
    }
  }
}
