import { sql, type Transaction } from 'kysely';
import { z } from 'zod';
import type { AppContext } from '../app/context.ts';
import { type Actor, recordAudit } from '../audit/index.ts';
import { ensureUser, type LedgerProject, type Trigger } from '../billing/ledger.ts';
import { ApiError, badRequest, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { amountSchema, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { DB, PaymentSettings } from '../db/schema.ts';
import {
  type CheckoutState,
  fromMinorUnits,
  type PaymentProvider,
  PaymentProviderError,
  toMinorUnits,
  type WebhookAction,
  WebhookSignatureError,
} from './provider.ts';
import { failRecharge, rechargeSucceeded, saveCard } from './recharge.ts';
import { keyHint, StripeProvider } from './stripe/index.ts';

/**
 * Payments: a project's connected provider, top-ups through its checkout, and the provider's webhooks
 * applied to the ledger exactly once. Every ledger movement a provider object causes has a movement key
 * (`deposit:<checkout id>`, `refund:<charge id>:<total refunded>`, `dispute:<id>`, `dispute_won:<id>`)
 * inserted in the same transaction as the movement: a replayed, duplicated or concurrent webhook finds
 * the key taken and moves nothing. Refund totals are cumulative and compared under the payment's row
 * lock, so an older event arriving late takes nothing back twice.
 */

export type PaymentsContext = Pick<
  AppContext,
  'db' | 'sealer' | 'billing' | 'events' | 'config' | 'log' | 'publicBaseUrl' | 'projects'
>;

const trigger = (source: string, actorId: string): Trigger => ({
  source,
  actorType: 'payment_provider',
  actorId,
});

// ---- connecting a provider ----

export const autoRechargeSettingsSchema = z.strictObject({
  offered: z.boolean().optional(),
  threshold: z.string().optional(),
  amount: z.string().optional(),
  monthlyCap: z.string().optional(),
});

export const paymentSettingsSchema = z.strictObject({
  presets: z.array(z.string()).max(6).optional(),
  minimum: z.string().optional(),
  maximum: z.string().optional(),
  autoRecharge: autoRechargeSettingsSchema.optional(),
});

export type PaymentSettingsInput = z.infer<typeof paymentSettingsSchema>;

export const connectBody = z
  .strictObject({
    provider: z.literal('stripe').default('stripe'),
    stripeKey: z
      .string()
      .trim()
      .regex(/^(sk|rk)_(test|live)_[A-Za-z0-9_]{8,}$/, {
        message: 'must be a Stripe secret key (sk_…) or restricted key (rk_…)',
      }),
    webhookSecret: z
      .string()
      .trim()
      .regex(/^whsec_[A-Za-z0-9_+/=]{8,}$/, { message: 'must be a webhook signing secret (whsec_…)' })
      .optional(),
    settings: paymentSettingsSchema.optional(),
  })
  .describe('payments connection');

export type ConnectInput = z.input<typeof connectBody>;

/** The project's top-up options in its currency, checked: presets, minimum and maximum. */
export function checkSettings(
  currency: string,
  input: PaymentSettingsInput | PaymentSettings | undefined,
): Required<PaymentSettings> {
  const amount = (param: string, v: string) =>
    parseInput(z.object({ [param]: amountSchema(currency) }), { [param]: v })[param] as string;
  const minimum = amount('settings.minimum', input?.minimum ?? defaultMinimum(currency));
  const maximum = amount('settings.maximum', input?.maximum ?? defaultMaximum(currency));
  if (new Money(maximum).lt(minimum)) throw badRequest('must be at least the minimum', 'settings.maximum');
  const presets = (input?.presets ?? defaultPresets(currency)).map((p, i) => {
    const v = amount(`settings.presets.${i}`, p);
    if (new Money(v).lt(minimum) || new Money(v).gt(maximum))
      throw badRequest('must be between the minimum and the maximum', `settings.presets.${i}`);
    return v;
  });
  // Auto-recharge: off unless offered; one recharge lies within the top-up minimum and maximum.
  const ar = input?.autoRecharge;
  const rechargeAmount = amount('settings.autoRecharge.amount', ar?.amount ?? presets[1] ?? minimum);
  if (new Money(rechargeAmount).lt(minimum) || new Money(rechargeAmount).gt(maximum))
    throw badRequest('must be between the minimum and the maximum', 'settings.autoRecharge.amount');
  const threshold = amount('settings.autoRecharge.threshold', ar?.threshold ?? minimum);
  if (new Money(threshold).gt(maximum))
    throw badRequest('must be at most the maximum', 'settings.autoRecharge.threshold');
  const monthlyCap = amount(
    'settings.autoRecharge.monthlyCap',
    ar?.monthlyCap ?? formatAmount(new Money(rechargeAmount).times(5)),
  );
  if (new Money(monthlyCap).lt(rechargeAmount))
    throw badRequest('must be at least the recharge amount', 'settings.autoRecharge.monthlyCap');
  return {
    presets,
    minimum,
    maximum,
    autoRecharge: { offered: ar?.offered ?? false, threshold, amount: rechargeAmount, monthlyCap },
  };
}

const zeroDecimal = (currency: string) => formatForCurrency('1', currency) === '1';
const defaultMinimum = (c: string) => (zeroDecimal(c) ? '500' : '5');
const defaultMaximum = (c: string) => (zeroDecimal(c) ? '100000' : '1000');
const defaultPresets = (c: string) => (zeroDecimal(c) ? ['500', '1000', '2000'] : ['5', '10', '20']);

export function webhookUrl(ctx: Pick<PaymentsContext, 'publicBaseUrl'>, projectId: string): string {
  return `${ctx.publicBaseUrl}/payments/stripe/${encodeURIComponent(projectId)}/webhook`;
}

export function providerOf(ctx: Pick<PaymentsContext, 'config'>, secretKey: string): PaymentProvider {
  return new StripeProvider(secretKey, ctx.config.STRIPE_API_URL);
}

async function connectionOf(ctx: Pick<PaymentsContext, 'db'>, projectId: string) {
  return ctx.db
    .selectFrom('payment_connections')
    .selectAll()
    .where('project_id', '=', projectId)
    .executeTakeFirst();
}

/** The provider of a project with payments connected, with its settings; undefined otherwise. */
export async function paymentsOf(ctx: PaymentsContext, projectId: string) {
  const connection = await connectionOf(ctx, projectId);
  if (!connection) return undefined;
  let provider: PaymentProvider | undefined;
  return {
    connection,
    /** Opened on first use: a page that only asks whether payments are connected unseals nothing. */
    get provider(): PaymentProvider {
      provider ??= providerOf(ctx, ctx.sealer.open(connection.key_sealed));
      return provider;
    },
    webhookSecret: () => ctx.sealer.open(connection.webhook_secret_sealed),
  };
}

/** What the API shows of a connection: never the key nor the secret. */
export function connectionView(
  ctx: Pick<PaymentsContext, 'publicBaseUrl'>,
  projectId: string,
  connection: Awaited<ReturnType<typeof connectionOf>>,
) {
  if (!connection) return { object: 'payments' as const, projectId, connected: false };
  return {
    object: 'payments' as const,
    projectId,
    connected: true,
    provider: connection.provider,
    keyHint: connection.key_hint,
    livemode: connection.livemode,
    webhook: {
      url: webhookUrl(ctx, projectId),
      endpointId: connection.webhook_endpoint_id,
      managed: connection.webhook_endpoint_id !== null,
    },
    settings: connection.settings,
    createdAt: connection.created_at.toISOString(),
    updatedAt: connection.updated_at.toISOString(),
  };
}

/** A connection as the audit log keeps it: the view without timestamps (no key, no secret). */
function auditedConnection(
  ctx: Pick<PaymentsContext, 'publicBaseUrl'>,
  projectId: string,
  connection: NonNullable<Awaited<ReturnType<typeof connectionOf>>>,
) {
  const {
    createdAt: _c,
    updatedAt: _u,
    ...view
  } = connectionView(ctx, projectId, connection) as ReturnType<typeof connectionView> & {
    createdAt?: string;
    updatedAt?: string;
  };
  return view;
}

export async function showPayments(ctx: PaymentsContext, projectId: string) {
  return connectionView(ctx, projectId, await connectionOf(ctx, projectId));
}

function checkFailed(err: unknown): ApiError {
  const message = err instanceof Error ? err.message : String(err);
  return new ApiError(400, 'invalid_request_error', `Payment provider check failed: ${message}`, {
    param: 'stripeKey',
    code: 'payment_provider_check_failed',
  });
}

/**
 * Connects Stripe to a project: checks the key with a live call, creates the webhook endpoint in the
 * developer's account (or takes the pasted signing secret), and stores both sealed. Connecting again
 * replaces the connection (and deletes the endpoint Tollgate had created).
 */
export async function connectPayments(
  ctx: PaymentsContext,
  projectId: string,
  raw: ConnectInput,
  actor: Actor,
) {
  const input = parseInput(connectBody, raw);
  const project = await ctx.db
    .selectFrom('projects')
    .select(['id', 'currency'])
    .where('id', '=', projectId)
    .executeTakeFirst();
  if (!project) throw notFound(`No project ${projectId}.`, 'project_not_found', 'project');
  const settings = checkSettings(project.currency, input.settings);
  const provider = providerOf(ctx, input.stripeKey);
  let livemode: boolean;
  try {
    ({ livemode } = await provider.verifyKey());
  } catch (err) {
    throw checkFailed(err);
  }
  let endpoint: { id: string | null; secret: string };
  if (input.webhookSecret) endpoint = { id: null, secret: input.webhookSecret };
  else {
    try {
      endpoint = await provider.createWebhookEndpoint(webhookUrl(ctx, projectId));
    } catch (err) {
      throw checkFailed(err);
    }
  }
  const previous = await connectionOf(ctx, projectId);
  const values = {
    provider: 'stripe' as const,
    key_sealed: ctx.sealer.seal(input.stripeKey),
    key_hint: keyHint(input.stripeKey),
    livemode,
    webhook_endpoint_id: endpoint.id,
    webhook_secret_sealed: ctx.sealer.seal(endpoint.secret),
    settings: JSON.stringify(settings),
  };
  const saved = await ctx.db.transaction().execute(async (tx) => {
    const row = await tx
      .insertInto('payment_connections')
      .values({ project_id: projectId, ...values })
      .onConflict((oc) => oc.column('project_id').doUpdateSet({ ...values, updated_at: sql`now()` }))
      .returningAll()
      .executeTakeFirstOrThrow();
    // the key and the signing secret never reach the log: the view has only the key's hint
    await recordAudit(tx, {
      actor,
      projectId,
      action: 'payments.connect',
      targetType: 'payments',
      targetId: 'stripe',
      before: previous ? auditedConnection(ctx, projectId, previous) : null,
      after: auditedConnection(ctx, projectId, row),
    });
    return row;
  });
  if (previous?.webhook_endpoint_id && previous.webhook_endpoint_id !== endpoint.id) {
    await removeEndpoint(ctx, previous);
  }
  return connectionView(ctx, projectId, saved);
}

async function removeEndpoint(
  ctx: PaymentsContext,
  connection: NonNullable<Awaited<ReturnType<typeof connectionOf>>>,
): Promise<boolean> {
  if (!connection.webhook_endpoint_id) return false;
  try {
    await providerOf(ctx, ctx.sealer.open(connection.key_sealed)).deleteWebhookEndpoint(
      connection.webhook_endpoint_id,
    );
    return true;
  } catch (err) {
    ctx.log.warn(
      { err, projectId: connection.project_id, endpoint: connection.webhook_endpoint_id },
      'could not delete the Stripe webhook endpoint; delete it in the Stripe dashboard',
    );
    return false;
  }
}

/** Updates the top-up options of a connected project. */
export async function updatePaymentSettings(
  ctx: PaymentsContext,
  projectId: string,
  input: PaymentSettingsInput,
  actor: Actor,
) {
  const connection = await connectionOf(ctx, projectId);
  if (!connection) throw notConnected(projectId);
  const project = await ctx.db
    .selectFrom('projects')
    .select('currency')
    .where('id', '=', projectId)
    .executeTakeFirstOrThrow();
  const settings = checkSettings(project.currency, {
    ...connection.settings,
    ...input,
    autoRecharge: { ...connection.settings.autoRecharge, ...input.autoRecharge },
  });
  const saved = await ctx.db.transaction().execute(async (tx) => {
    const row = await tx
      .updateTable('payment_connections')
      .set({ settings: JSON.stringify(settings), updated_at: sql`now()` })
      .where('project_id', '=', projectId)
      .returningAll()
      .executeTakeFirstOrThrow();
    await recordAudit(tx, {
      actor,
      projectId,
      action: 'payments.update',
      targetType: 'payments',
      targetId: 'stripe',
      before: { settings: connection.settings },
      after: { settings: row.settings },
    });
    return row;
  });
  // Offering auto-recharge needs the PaymentIntent events: an endpoint Tollgate created before they
  // existed is subscribed to them (one made by hand must be changed in Stripe's dashboard).
  if (
    settings.autoRecharge.offered &&
    !connection.settings.autoRecharge?.offered &&
    saved.webhook_endpoint_id
  ) {
    try {
      await providerOf(ctx, ctx.sealer.open(saved.key_sealed)).updateWebhookEndpoint(
        saved.webhook_endpoint_id,
      );
    } catch (err) {
      ctx.log.warn(
        { err, projectId, endpoint: saved.webhook_endpoint_id },
        'could not subscribe the Stripe webhook endpoint to payment_intent events; add them in the Stripe dashboard',
      );
    }
  }
  return connectionView(ctx, projectId, saved);
}

/** Disconnects: deletes the webhook endpoint Tollgate created, then the connection. */
export async function disconnectPayments(ctx: PaymentsContext, projectId: string, actor: Actor) {
  const connection = await connectionOf(ctx, projectId);
  if (!connection) return { object: 'payments' as const, projectId, connected: false, deleted: false };
  const endpointDeleted = await removeEndpoint(ctx, connection);
  await ctx.db.transaction().execute(async (tx) => {
    const deleted = await tx
      .deleteFrom('payment_connections')
      .where('project_id', '=', projectId)
      .executeTakeFirst();
    if (deleted.numDeletedRows > 0n)
      await recordAudit(tx, {
        actor,
        projectId,
        action: 'payments.disconnect',
        targetType: 'payments',
        targetId: 'stripe',
        before: auditedConnection(ctx, projectId, connection),
        after: null,
      });
  });
  return {
    object: 'payments' as const,
    projectId,
    connected: false,
    deleted: true,
    webhookEndpointDeleted: endpointDeleted,
  };
}

const notConnected = (projectId: string) =>
  new ApiError(409, 'invalid_request_error', `Project ${projectId} has no payment provider connected.`, {
    code: 'payments_not_connected',
  });

// ---- checkout ----

export interface CheckoutRequest {
  project: LedgerProject & { name: string };
  externalId: string;
  amount: string;
  /** Where the provider sends the payer back. */
  successUrl: (paymentId: string) => string;
  cancelUrl: string;
  /** Save the card and turn auto-recharge on once paid (the project must offer it). */
  saveCard?: boolean;
}

/** Creates a pending payment and its checkout; returns the checkout's URL. */
export async function startCheckout(ctx: PaymentsContext, input: CheckoutRequest) {
  const payments = await paymentsOf(ctx, input.project.id);
  if (!payments) throw notConnected(input.project.id);
  const { currency } = input.project;
  const userId = await ensureUser(ctx.db, input.project.id, input.externalId);
  const paymentId = newId('pay');
  await ctx.db
    .insertInto('payments')
    .values({
      id: paymentId,
      project_id: input.project.id,
      user_id: userId,
      external_id: input.externalId,
      provider: payments.connection.provider,
      amount: input.amount,
      currency,
      save_card: input.saveCard ?? false,
    })
    .execute();
  let checkout: { id: string; url: string };
  try {
    checkout = await payments.provider.createCheckout({
      paymentId,
      projectId: input.project.id,
      externalId: input.externalId,
      productName: `${input.project.name} balance top-up`,
      currency,
      amountMinor: toMinorUnits(input.amount, currency),
      successUrl: input.successUrl(paymentId),
      cancelUrl: input.cancelUrl,
      idempotencyKey: `tollgate-checkout-${paymentId}`,
      ...(input.saveCard ? { saveCard: true } : {}),
    });
  } catch (err) {
    await ctx.db
      .updateTable('payments')
      .set({ status: 'failed', updated_at: sql`now()` })
      .where('id', '=', paymentId)
      .execute();
    throw err;
  }
  await ctx.db
    .updateTable('payments')
    .set({ checkout_id: checkout.id, updated_at: sql`now()` })
    .where('id', '=', paymentId)
    .execute();
  return { paymentId, checkoutId: checkout.id, url: checkout.url };
}

// ---- webhooks ----

export type WebhookOutcome =
  | { status: 200; body: { received: true; outcome: string } }
  | { status: 400; body: { error: { message: string; type: string; code: string } } };

const ack = (outcome: string): WebhookOutcome => ({ status: 200, body: { received: true, outcome } });

/**
 * Handles one webhook delivery for a project: verifies the signature against the project's sealed
 * signing secret (400 and nothing written when it fails), then applies the action. An event for an
 * unknown project, payment or user is acknowledged (200) and logged: retrying would not help.
 */
export async function handleWebhook(
  ctx: PaymentsContext,
  projectId: string,
  rawBody: Buffer,
  signature: string | undefined,
): Promise<WebhookOutcome> {
  const payments = await paymentsOf(ctx, projectId);
  if (!payments) {
    ctx.log.warn({ projectId }, 'payment webhook for a project without payments; acknowledged');
    return ack('not_connected');
  }
  let action: WebhookAction;
  try {
    action = await payments.provider.parseWebhook(rawBody, signature, payments.webhookSecret());
  } catch (err) {
    if (err instanceof WebhookSignatureError) {
      return {
        status: 400,
        body: {
          error: {
            message: `Webhook signature verification failed: ${err.message}`,
            type: 'invalid_request_error',
            code: 'invalid_signature',
          },
        },
      };
    }
    throw err;
  }
  const project = await ctx.projects.get(projectId);
  if (!project) return ack('unknown_project');
  const applier = new Applier(ctx, project, payments.provider);
  const outcome = await applier.apply(action);
  if (outcome !== 'applied' && outcome !== 'duplicate')
    ctx.log.info({ projectId, eventId: action.eventId, outcome }, 'payment webhook acknowledged');
  return ack(outcome);
}

type PaymentRow = Awaited<ReturnType<typeof findPayment>>;

async function findPayment(
  db: PaymentsContext['db'],
  projectId: string,
  by: { id?: string | undefined; checkoutId?: string | null; paymentIntentId?: string | null },
) {
  let query = db.selectFrom('payments').selectAll().where('project_id', '=', projectId);
  const ors: Array<[string, string]> = [];
  if (by.id) ors.push(['id', by.id]);
  if (by.checkoutId) ors.push(['checkout_id', by.checkoutId]);
  if (by.paymentIntentId) ors.push(['payment_intent_id', by.paymentIntentId]);
  if (!ors.length) return undefined;
  query = query.where((eb) =>
    eb.or(ors.map(([col, v]) => eb(col as 'id' | 'checkout_id' | 'payment_intent_id', '=', v))),
  );
  return query.executeTakeFirst();
}

class Applier {
  readonly #ctx: PaymentsContext;
  readonly #project: LedgerProject & { name: string };
  readonly #provider: PaymentProvider;

  constructor(ctx: PaymentsContext, project: LedgerProject & { name: string }, provider: PaymentProvider) {
    this.#ctx = ctx;
    this.#project = project;
    this.#provider = provider;
  }

  async apply(action: WebhookAction): Promise<string> {
    switch (action.type) {
      case 'checkout_paid':
        return this.paid(action.checkout, action.eventId);
      case 'checkout_failed': {
        const updated = await this.#ctx.db
          .updateTable('payments')
          .set({ status: 'failed', updated_at: sql`now()` })
          .where('project_id', '=', this.#project.id)
          .where('checkout_id', '=', action.checkoutId)
          .where('status', '=', 'pending')
          .executeTakeFirst();
        return Number(updated.numUpdatedRows) ? 'failed' : 'ignored';
      }
      case 'refunded':
        return this.refunded(action);
      case 'dispute_opened':
      case 'dispute_closed':
        return this.dispute(action);
      case 'intent_succeeded':
        return this.rechargePaid(action);
      case 'intent_failed':
        return this.rechargeFailed(action);
      case 'ignored':
        return `ignored:${action.eventType}`;
    }
  }

  /** Credits a paid checkout once (movement key `deposit:<checkout id>`). */
  async paid(checkout: CheckoutState, eventId: string): Promise<string> {
    const { db } = this.#ctx;
    const project = this.#project;
    const payment = await findPayment(db, project.id, {
      id: checkout.reference.paymentId,
      checkoutId: checkout.id,
    });
    if (!payment) return 'unknown_payment';
    if (checkout.currency !== project.currency) {
      this.#ctx.log.error(
        { projectId: project.id, checkout: checkout.id, currency: checkout.currency },
        'a checkout paid in another currency than the project’s: not credited',
      );
      return 'currency_mismatch';
    }
    const credited = await this.#credit(payment, {
      key: `deposit:${checkout.id}`,
      amountMinor: checkout.amountMinor,
      eventId,
      providerPaymentId: checkout.id,
      metadata: { checkoutSessionId: checkout.id, paymentIntentId: checkout.paymentIntentId },
      row: {
        checkout_id: checkout.id,
        payment_intent_id: checkout.paymentIntentId,
        charge_id: checkout.chargeId,
        receipt_url: checkout.receiptUrl,
      },
    });
    if (credited === 'nothing_paid') return credited;
    if (!credited) return 'duplicate';
    if (!checkout.receiptUrl || payment.save_card) await this.#fillReceipt(payment, checkout.id);
    return 'applied';
  }

  /**
   * Credits an off-session recharge once, when its PaymentIntent succeeded (movement key
   * `deposit:<payment intent id>`), through the same deposit path as a checkout. A PaymentIntent that
   * is not a recharge (a checkout's own) is left to its checkout's events.
   */
  async rechargePaid(action: Extract<WebhookAction, { type: 'intent_succeeded' }>): Promise<string> {
    const project = this.#project;
    const payment = await findPayment(this.#ctx.db, project.id, {
      id: action.reference.paymentId,
      paymentIntentId: action.paymentIntentId,
    });
    if (!payment) return 'unknown_payment';
    const recharge = await this.#ctx.db
      .selectFrom('recharges')
      .select('id')
      .where('id', '=', payment.id)
      .executeTakeFirst();
    if (!recharge) return 'not_a_recharge';
    if (action.currency !== project.currency) return 'currency_mismatch';
    const credited = await this.#credit(payment, {
      key: `deposit:${action.paymentIntentId}`,
      amountMinor: action.amountMinor,
      eventId: action.eventId,
      providerPaymentId: action.paymentIntentId,
      metadata: { paymentIntentId: action.paymentIntentId, recharge: true },
      row: { payment_intent_id: action.paymentIntentId, charge_id: action.chargeId },
      alsoIn: (tx, activityId) =>
        rechargeSucceeded(this.#ctx, tx, project, {
          rechargeId: payment.id,
          paymentIntentId: action.paymentIntentId,
          externalId: payment.external_id,
          activityId,
          eventId: action.eventId,
        }),
    });
    if (credited === 'nothing_paid') return credited;
    return credited ? 'applied' : 'duplicate';
  }

  /** A recharge's PaymentIntent failed (declined, or it needs its holder): see `failRecharge`. */
  async rechargeFailed(action: Extract<WebhookAction, { type: 'intent_failed' }>): Promise<string> {
    const payment = await findPayment(this.#ctx.db, this.#project.id, {
      id: action.reference.paymentId,
      paymentIntentId: action.paymentIntentId,
    });
    if (!payment) return 'unknown_payment';
    const recharge = await this.#ctx.db
      .selectFrom('recharges')
      .select('id')
      .where('id', '=', payment.id)
      .executeTakeFirst();
    if (!recharge) return 'not_a_recharge';
    const failed = await failRecharge(this.#ctx, this.#project, recharge.id, {
      code: action.code,
      message: action.message,
      paymentIntentId: action.paymentIntentId,
      actorId: action.eventId,
    });
    return failed ? 'failed' : 'duplicate';
  }

  /**
   * The deposit of a payment, once: the movement key, the deposit with its events, the payment row and
   * `payment.succeeded`, in one transaction. Undefined when the key was taken (a duplicate).
   */
  async #credit(
    payment: NonNullable<PaymentRow>,
    input: {
      key: string;
      amountMinor: number;
      eventId: string;
      providerPaymentId: string;
      metadata: Record<string, unknown>;
      row: {
        checkout_id?: string;
        payment_intent_id: string | null;
        charge_id: string | null;
        receipt_url?: string | null;
      };
      alsoIn?: (tx: Transaction<DB>, activityId: string) => Promise<void>;
    },
  ): Promise<'nothing_paid' | { id: string } | undefined> {
    const project = this.#project;
    const amount = formatForCurrency(fromMinorUnits(input.amountMinor, project.currency), project.currency);
    if (!new Money(amount).gt(0)) return 'nothing_paid';
    return this.#ctx.billing.transaction(async (tx) => {
      if (!(await this.#claim(tx, input.key, payment.id, 'deposit', amount))) return undefined;
      const deposit = await this.#ctx.billing.deposit(
        {
          project,
          externalId: payment.external_id,
          amount,
          source: 'stripe',
          trigger: trigger('stripe', input.eventId),
          description: `Top-up ${payment.id}`,
          metadata: { paymentId: payment.id, provider: 'stripe', ...input.metadata },
        },
        tx,
      );
      await tx
        .updateTable('payment_movements')
        .set({ entry_id: deposit.entry.id })
        .where('project_id', '=', project.id)
        .where('key', '=', input.key)
        .execute();
      await tx
        .updateTable('payments')
        .set({
          status: sql`CASE WHEN status IN ('pending', 'failed') THEN 'paid' ELSE status END`,
          amount,
          ...input.row,
          paid_at: sql`now()`,
          updated_at: sql`now()`,
        })
        .where('id', '=', payment.id)
        .execute();
      await this.#ctx.events.record(tx, {
        project,
        type: 'payment.succeeded',
        trigger: trigger('stripe', input.eventId),
        subject: { type: 'user', id: payment.user_id, externalId: payment.external_id },
        data: {
          paymentId: payment.id,
          externalUserId: payment.external_id,
          amount: formatForCurrency(amount, project.currency),
          currency: project.currency,
          provider: 'stripe',
          providerPaymentId: input.providerPaymentId,
          activityId: deposit.entry.id,
        },
      });
      if (input.alsoIn) await input.alsoIn(tx, deposit.entry.id);
      this.#ctx.billing.afterCommit(tx, () => this.#ctx.events.wake());
      return { id: deposit.entry.id };
    });
  }

  /**
   * Best effort: the charge and its receipt link, which a completed session's event does not carry, and
   * the card the payer asked to save (its customer and payment method).
   */
  async #fillReceipt(payment: NonNullable<PaymentRow>, checkoutId: string): Promise<void> {
    const paymentId = payment.id;
    try {
      const state = await this.#provider.retrieveCheckout(checkoutId);
      if (payment.save_card && state.customerId)
        await saveCard(this.#ctx, this.#project, payment.user_id, {
          customerId: state.customerId,
          paymentMethodId: state.paymentMethodId,
        });
      await this.#ctx.db
        .updateTable('payments')
        .set({
          receipt_url: state.receiptUrl,
          charge_id: state.chargeId,
          payment_intent_id: sql`coalesce(payment_intent_id, ${state.paymentIntentId})`,
        })
        .where('id', '=', paymentId)
        .execute();
    } catch (err) {
      this.#ctx.log.warn({ err, paymentId }, 'could not read the receipt of a payment');
    }
  }

  /** Inserts a movement key; false when it was taken (the movement happened already). */
  async #claim(
    tx: Transaction<DB>,
    key: string,
    paymentId: string,
    kind: 'deposit' | 'refund' | 'dispute' | 'dispute_won',
    amount: string,
  ): Promise<boolean> {
    const inserted = await tx
      .insertInto('payment_movements')
      .values({ project_id: this.#project.id, key, payment_id: paymentId, kind, amount })
      .onConflict((oc) => oc.columns(['project_id', 'key']).doNothing())
      .returning('key')
      .executeTakeFirst();
    return Boolean(inserted);
  }

  /** The payment of a charge, credited first when its checkout's own event has not arrived yet. */
  async #paidPayment(by: { id?: string | undefined; paymentIntentId: string | null }) {
    const { db } = this.#ctx;
    let payment: PaymentRow = await findPayment(db, this.#project.id, by);
    if (!payment && !by.id && by.paymentIntentId) {
      // A charge event ahead of its checkout's completion: the PaymentIntent carries our reference.
      const reference = await this.#provider.paymentReference(by.paymentIntentId).catch(() => undefined);
      if (reference?.paymentId && reference.projectId === this.#project.id)
        payment = await findPayment(db, this.#project.id, { id: reference.paymentId });
    }
    if (payment?.status === 'pending' && payment.checkout_id) {
      const state = await this.#provider.retrieveCheckout(payment.checkout_id);
      if (state.paid) await this.paid(state, 'reconcile');
      payment = await findPayment(db, this.#project.id, { id: payment.id });
    }
    return payment;
  }

  async refunded(action: Extract<WebhookAction, { type: 'refunded' }>): Promise<string> {
    const found = await this.#paidPayment({
      id: action.reference.paymentId,
      paymentIntentId: action.paymentIntentId,
    });
    if (!found) return 'unknown_payment';
    if (found.status === 'pending') return 'not_paid';
    const project = this.#project;
    const total = fromMinorUnits(action.refundedMinor, project.currency);
    const done = await this.#ctx.billing.transaction(async (tx) => {
      const payment = await this.#lock(tx, found.id);
      const delta = new Money(total).minus(payment.refunded);
      if (delta.lte(0)) return undefined;
      const amount = formatForCurrency(delta, project.currency);
      if (
        !(await this.#claim(
          tx,
          `refund:${action.chargeId}:${action.refundedMinor}`,
          payment.id,
          'refund',
          amount,
        ))
      )
        return undefined;
      const reversed = await this.#reverse(
        tx,
        payment,
        amount,
        action.eventId,
        `Refund of top-up ${payment.id}`,
        {
          chargeId: action.chargeId,
        },
      );
      const fully = new Money(total).gte(payment.amount);
      await tx
        .updateTable('payments')
        .set({
          refunded: total,
          uncollected: sql`uncollected + ${reversed.uncollected}::numeric`,
          status: fully ? 'refunded' : payment.status,
          charge_id: sql`coalesce(charge_id, ${action.chargeId})`,
          receipt_url: sql`coalesce(receipt_url, ${action.receiptUrl})`,
          updated_at: sql`now()`,
        })
        .where('id', '=', payment.id)
        .execute();
      await this.#ctx.events.record(tx, {
        project,
        type: 'payment.refunded',
        trigger: trigger('stripe', action.eventId),
        subject: { type: 'user', id: payment.user_id, externalId: payment.external_id },
        data: {
          paymentId: payment.id,
          externalUserId: payment.external_id,
          amount: formatForCurrency(amount, project.currency),
          refunded: formatForCurrency(total, project.currency),
          uncollected: formatForCurrency(reversed.uncollected, project.currency),
          currency: project.currency,
          activityId: reversed.entry?.id ?? null,
        },
      });
      this.#ctx.billing.afterCommit(tx, () => this.#ctx.events.wake());
      return reversed;
    });
    return done ? 'applied' : 'duplicate';
  }

  async dispute(
    action: Extract<WebhookAction, { type: 'dispute_opened' | 'dispute_closed' }>,
  ): Promise<string> {
    const found = await this.#paidPayment({ paymentIntentId: action.paymentIntentId });
    if (!found) return 'unknown_payment';
    if (found.status === 'pending') return 'not_paid';
    const project = this.#project;
    const amount = formatForCurrency(fromMinorUnits(action.amountMinor, project.currency), project.currency);
    const won = action.type === 'dispute_closed' && action.status === 'won';
    const done = await this.#ctx.billing.transaction(async (tx) => {
      const payment = await this.#lock(tx, found.id);
      let changed = false;
      // A dispute opened (or closed lost before its opening arrived) takes the amount back once.
      const opened = await tx
        .selectFrom('payment_movements')
        .select(['amount', 'entry_id'])
        .where('project_id', '=', project.id)
        .where('key', '=', `dispute:${action.disputeId}`)
        .executeTakeFirst();
      let debited = opened ? opened.amount : '0';
      if (!opened && !won) {
        await this.#claim(tx, `dispute:${action.disputeId}`, payment.id, 'dispute', amount);
        const reversed = await this.#reverse(
          tx,
          payment,
          amount,
          action.eventId,
          `Dispute of top-up ${payment.id}`,
          {
            disputeId: action.disputeId,
          },
        );
        debited = reversed.debited;
        await tx
          .updateTable('payment_movements')
          .set({ amount: reversed.debited, entry_id: reversed.entry?.id ?? null })
          .where('project_id', '=', project.id)
          .where('key', '=', `dispute:${action.disputeId}`)
          .execute();
        await tx
          .updateTable('payments')
          .set({
            disputed: sql`disputed + ${amount}::numeric`,
            uncollected: sql`uncollected + ${reversed.uncollected}::numeric`,
            status: 'disputed',
            updated_at: sql`now()`,
          })
          .where('id', '=', payment.id)
          .execute();
        await this.#ctx.events.record(tx, {
          project,
          type: 'payment.disputed',
          trigger: trigger('stripe', action.eventId),
          subject: { type: 'user', id: payment.user_id, externalId: payment.external_id },
          data: {
            paymentId: payment.id,
            externalUserId: payment.external_id,
            disputeId: action.disputeId,
            amount: formatForCurrency(amount, project.currency),
            uncollected: formatForCurrency(reversed.uncollected, project.currency),
            currency: project.currency,
            activityId: reversed.entry?.id ?? null,
          },
        });
        changed = true;
      } else if (!opened && won) {
        // Won before its opening arrived: nothing was taken, and the late opening must take nothing.
        await this.#claim(tx, `dispute:${action.disputeId}`, payment.id, 'dispute', '0');
      }
      if (action.type === 'dispute_closed') {
        const restore = won ? debited : '0';
        if (await this.#claim(tx, `dispute_closed:${action.disputeId}`, payment.id, 'dispute_won', restore)) {
          let entryId: string | null = null;
          if (won && new Money(restore).gt(0)) {
            const credit = await this.#ctx.billing.deposit(
              {
                project,
                externalId: payment.external_id,
                amount: restore,
                source: 'stripe',
                trigger: trigger('stripe', action.eventId),
                description: `Dispute won for top-up ${payment.id}`,
                metadata: { paymentId: payment.id, provider: 'stripe', disputeId: action.disputeId },
              },
              tx,
            );
            entryId = credit.entry.id;
          }
          if (won && opened) {
            const uncollectedPart = Money.max(new Money(amount).minus(debited), 0);
            await tx
              .updateTable('payments')
              .set({
                disputed: sql`greatest(disputed - ${amount}::numeric, 0)`,
                uncollected: sql`greatest(uncollected - ${formatAmount(uncollectedPart)}::numeric, 0)`,
                status: sql`CASE WHEN refunded >= amount THEN 'refunded' ELSE 'paid' END`,
                updated_at: sql`now()`,
              })
              .where('id', '=', payment.id)
              .execute();
          }
          await this.#ctx.events.record(tx, {
            project,
            type: 'payment.dispute.closed',
            trigger: trigger('stripe', action.eventId),
            subject: { type: 'user', id: payment.user_id, externalId: payment.external_id },
            data: {
              paymentId: payment.id,
              externalUserId: payment.external_id,
              disputeId: action.disputeId,
              status: action.status,
              amount: formatForCurrency(restore, project.currency),
              currency: project.currency,
              activityId: entryId,
            },
          });
          changed = true;
        }
      }
      if (changed) this.#ctx.billing.afterCommit(tx, () => this.#ctx.events.wake());
      return changed;
    });
    return done ? 'applied' : 'duplicate';
  }

  async #lock(tx: Transaction<DB>, paymentId: string) {
    return tx
      .selectFrom('payments')
      .selectAll()
      .where('id', '=', paymentId)
      .forUpdate()
      .executeTakeFirstOrThrow();
  }

  #reverse(
    tx: Transaction<DB>,
    payment: NonNullable<PaymentRow>,
    amount: string,
    eventId: string,
    description: string,
    refs: Record<string, string>,
  ) {
    return this.#ctx.billing.reverse(
      {
        project: this.#project,
        externalId: payment.external_id,
        amount,
        source: 'stripe',
        trigger: trigger('stripe', eventId),
        description,
        metadata: { paymentId: payment.id, provider: 'stripe', ...refs },
      },
      tx,
    );
  }
}

// ---- refunds asked by the developer, and lists ----

export const refundBody = z.strictObject({ amount: z.string().optional() }).default({});

/**
 * Asks the provider to refund (part of) a paid top-up; the refund's webhook does the ledger work, so a
 * refund made in Stripe's own dashboard is handled the same way.
 */
export async function refundPayment(
  ctx: PaymentsContext,
  projectId: string,
  paymentId: string,
  input: { amount?: string | undefined },
  actor: Actor,
) {
  const payments = await paymentsOf(ctx, projectId);
  if (!payments) throw notConnected(projectId);
  const payment = await findPayment(ctx.db, projectId, { id: paymentId });
  if (!payment) throw notFound(`No payment ${paymentId}.`, 'payment_not_found', 'paymentId');
  if (payment.status === 'pending' || payment.status === 'failed' || !payment.payment_intent_id)
    throw new ApiError(409, 'invalid_request_error', `Payment ${paymentId} was not paid.`, {
      code: 'payment_not_paid',
    });
  const left = new Money(payment.amount).minus(payment.refunded);
  const amount = input.amount
    ? parseInput(z.object({ amount: amountSchema(payment.currency) }), { amount: input.amount }).amount
    : formatAmount(left);
  if (new Money(amount).gt(left) || !new Money(amount).gt(0))
    throw badRequest(`must be at most what is left to refund (${formatAmount(left)})`, 'amount');
  let refund: Awaited<ReturnType<PaymentProvider['refund']>>;
  try {
    refund = await payments.provider.refund({
      paymentIntentId: payment.payment_intent_id,
      amountMinor: toMinorUnits(amount, payment.currency),
      idempotencyKey: `tollgate-refund-${payment.id}-${toMinorUnits(payment.refunded, payment.currency)}-${toMinorUnits(amount, payment.currency)}`,
    });
  } catch (err) {
    const status = err instanceof PaymentProviderError ? err.status : undefined;
    throw new ApiError(
      status && status < 500 ? 400 : 502,
      status && status < 500 ? 'invalid_request_error' : 'upstream_error',
      (err as Error).message,
      { code: 'payment_provider_error' },
    );
  }
  // The refund is Stripe's; its webhook moves the money. The entry records who asked for it.
  await recordAudit(ctx.db, {
    actor,
    projectId,
    action: 'payments.refund',
    targetType: 'payment',
    targetId: payment.id,
    before: { refunded: formatAmount(payment.refunded) },
    after: {
      refund: refund.id,
      amount,
      currency: payment.currency,
      status: refund.status,
      user: payment.external_id,
    },
  });
  return {
    object: 'refund' as const,
    id: refund.id,
    paymentId: payment.id,
    amount: formatForCurrency(fromMinorUnits(refund.amountMinor, payment.currency), payment.currency),
    currency: payment.currency,
    status: refund.status,
  };
}

export function paymentView(p: {
  id: string;
  external_id: string;
  status: string;
  amount: string;
  currency: string;
  refunded: string;
  disputed: string;
  uncollected: string;
  checkout_id: string | null;
  payment_intent_id: string | null;
  receipt_url: string | null;
  created_at: Date;
  paid_at: Date | null;
}) {
  const money = (v: string) => formatForCurrency(v, p.currency);
  return {
    id: p.id,
    object: 'payment' as const,
    user: p.external_id,
    status: p.status,
    amount: money(p.amount),
    refunded: money(p.refunded),
    disputed: money(p.disputed),
    uncollected: money(p.uncollected),
    currency: p.currency,
    provider: 'stripe',
    checkoutId: p.checkout_id,
    paymentIntentId: p.payment_intent_id,
    receiptUrl: p.receipt_url,
    createdAt: p.created_at.toISOString(),
    paidAt: p.paid_at?.toISOString() ?? null,
  };
}

export async function listPayments(
  ctx: Pick<PaymentsContext, 'db'>,
  projectId: string,
  filter: { user?: string | undefined; limit: number; startingAfter?: string | undefined },
) {
  let query = ctx.db
    .selectFrom('payments')
    .selectAll()
    .where('project_id', '=', projectId)
    .orderBy('id', 'desc')
    .limit(filter.limit + 1);
  if (filter.user) query = query.where('external_id', '=', filter.user);
  if (filter.startingAfter) query = query.where('id', '<', filter.startingAfter);
  const rows = await query.execute();
  return {
    object: 'list' as const,
    data: rows.slice(0, filter.limit).map(paymentView),
    has_more: rows.length > filter.limit,
  };
}
