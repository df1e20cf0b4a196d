import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAudit } from '../audit/index.ts';
import { ensureUser, type LedgerProject } from '../billing/ledger.ts';
import { ApiError, badRequest, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { amountSchema, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import {
  type ConnectionRow,
  connectionClient,
  connectionOf,
  notConnected,
  openConnection,
  type PaymentsContext,
  webhookUrl,
} from './connection.ts';
import { fromMinorUnits, type PaymentProvider, PaymentProviderError, toMinorUnits } from './provider.ts';
import { providerKind } from './providers.ts';
import { findPayment } from './rows.ts';
import { checkSettings, type PaymentSettingsInput, paymentSettingsSchema } from './settings.ts';
import { stripeKeySchema, stripeWebhookSecretSchema } from './stripe/index.ts';
import { newTestAccountKey } from './test-provider/index.ts';

/**
 * Payments as the developer runs them (the admin API, the dashboard and the CLI call these): connecting a
 * project's provider, its top-up options, disconnecting; a top-up's checkout; refunds; the list of
 * payments. The provider's webhooks are applied by ./webhooks; auto-recharge is ./recharge.ts.
 */

export type { PaymentsContext } from './connection.ts';
export { listPayments, paymentView } from './rows.ts';
export { paymentSettingsSchema };

// ---- connecting a provider ----

/** What the API shows of a connection: never the key nor the secret. */
export function connectionView(
  ctx: Pick<PaymentsContext, 'publicBaseUrl'>,
  projectId: string,
  connection: ConnectionRow | undefined,
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
      url: webhookUrl(ctx, connection.provider, projectId),
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
  connection: ConnectionRow,
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

export const connectBody = z
  .strictObject({
    /** `test`: the test provider (only where test payments are on; never in production). */
    provider: z.enum(['stripe', 'test']).default('stripe'),
    stripeKey: stripeKeySchema.optional(),
    webhookSecret: stripeWebhookSecretSchema.optional(),
    settings: paymentSettingsSchema.optional(),
  })
  .superRefine((v, issues) => {
    if (v.provider === 'stripe' && !v.stripeKey)
      issues.addIssue({ code: 'custom', path: ['stripeKey'], message: 'is required to connect Stripe' });
    if (v.provider === 'test' && (v.stripeKey || v.webhookSecret))
      issues.addIssue({ code: 'custom', path: ['stripeKey'], message: 'the test provider takes no key' });
  })
  .describe('payments connection');

export type ConnectInput = z.input<typeof connectBody>;

function checkFailed(err: unknown): ApiError {
  const message = err instanceof Error ? err.message : String(err);
  return new ApiError(400, 'invalid_request_error', `Payment provider check failed: ${message}`, {
    param: 'stripeKey',
    code: 'payment_provider_check_failed',
  });
}

/**
 * Connects a provider to a project: checks the key with a live call, creates the webhook endpoint in
 * the developer's account (or takes the pasted signing secret), and stores both sealed. Connecting
 * again replaces the connection (and deletes the endpoint Tollgate had created). The test provider takes
 * no key: a new test account is made for the project (refused where test payments are not allowed).
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
  const kind = providerKind(input.provider, ctx.config);
  if (!kind)
    throw new ApiError(
      400,
      'invalid_request_error',
      'Test payments are off in this configuration (TOLLGATE_TEST_PAYMENTS; never in production).',
      { param: 'provider', code: 'payment_provider_unavailable' },
    );
  const key = input.stripeKey ?? newTestAccountKey();
  const provider = kind.create(key, ctx);
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
      endpoint = await provider.createWebhookEndpoint(webhookUrl(ctx, kind.name, projectId));
    } catch (err) {
      throw checkFailed(err);
    }
  }
  const previous = await connectionOf(ctx, projectId);
  const values = {
    provider: input.provider,
    key_sealed: ctx.sealer.seal(key),
    key_hint: kind.keyHint(key),
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
      targetId: input.provider,
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

async function removeEndpoint(ctx: PaymentsContext, connection: ConnectionRow): Promise<boolean> {
  if (!connection.webhook_endpoint_id) return false;
  try {
    await connectionClient(ctx, connection).deleteWebhookEndpoint(connection.webhook_endpoint_id);
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
      targetId: connection.provider,
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
      await connectionClient(ctx, saved).updateWebhookEndpoint(saved.webhook_endpoint_id);
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
        targetId: connection.provider,
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
  const payments = await openConnection(ctx, input.project.id);
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
  const payments = await openConnection(ctx, projectId);
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
