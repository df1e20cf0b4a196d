import { sql } from 'kysely';
import { newId } from '../../core/ids.ts';
import { formatAmount, formatForCurrency, Money } from '../../core/money.ts';
import { type CheckoutState, fromMinorUnits, toMinorUnits, type WebhookAction } from '../provider.ts';
import { saveCard } from '../recharge.ts';
import { findPayment, type PaymentRow } from '../rows.ts';
import { applyMovement, type MovementStep, type WalletPayment, type WebhookScope } from './movement.ts';

/**
 * A checkout's webhooks: paid (credited once per payment, movement key `deposit:<payment id>`) or
 * failed. Only the session Tollgate created for a payment (stored as its `checkout_id`) credits it, and
 * only with the payment's amount and currency. A paid checkout that cannot be credited — another amount
 * or currency, a session Tollgate did not create that names one of its payments, or a payment Tollgate
 * does not know — is kept as an `uncredited` payment with the reason, which the payments list shows (and
 * the error is logged), and acknowledged: retrying would not help.
 */

/** A deposit of a payment: the movement key, the deposit, the payment row and `payment.succeeded`. */
function depositStep(
  scope: WebhookScope,
  payment: WalletPayment,
  input: {
    key: string;
    amount: string;
    providerPaymentId: string;
    refs: Record<string, unknown>;
    row: {
      checkout_id?: string;
      payment_intent_id: string | null;
      charge_id: string | null;
      receipt_url?: string | null;
    };
    also?: MovementStep['also'];
  },
): MovementStep {
  const { currency } = scope.project;
  return {
    key: input.key,
    kind: 'deposit',
    amount: input.amount,
    ledger: { type: 'deposit', amount: input.amount, description: `Top-up ${payment.id}`, refs: input.refs },
    row: () => ({
      status: sql`CASE WHEN status IN ('pending', 'failed') THEN 'paid' ELSE status END`,
      amount: input.amount,
      ...input.row,
      paid_at: sql`now()`,
    }),
    event: {
      type: 'payment.succeeded',
      data: (moved) => ({
        amount: formatForCurrency(input.amount, currency),
        currency,
        provider: scope.provider.name,
        providerPaymentId: input.providerPaymentId,
        activityId: moved.entryId,
      }),
    },
    ...(input.also ? { also: input.also } : {}),
  };
}

/** Credits a payment once, in its own transaction; undefined when it was credited already. */
export function credit(
  scope: WebhookScope,
  payment: WalletPayment,
  eventId: string,
  input: Parameters<typeof depositStep>[2],
) {
  return scope.ctx.billing.transaction((tx) =>
    applyMovement(scope, tx, payment, eventId, depositStep(scope, payment, input)),
  );
}

/** The amount of a provider's payment in the project's currency; undefined when it is nothing. */
export function paidAmount(scope: WebhookScope, amountMinor: number): string | undefined {
  const { currency } = scope.project;
  const amount = formatForCurrency(fromMinorUnits(amountMinor, currency), currency);
  return new Money(amount).gt(0) ? amount : undefined;
}

/**
 * Credits a paid checkout once (movement key `deposit:<payment id>`): only the session Tollgate created
 * for the payment (its stored `checkout_id`), paid in the payment's amount and currency. A session naming
 * a payment it was not created for (a payment link's `client_reference_id`, a second session) is kept as
 * an `uncredited` payment with the reason and credits nothing.
 */
export async function checkoutPaid(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'checkout_paid' }>,
): Promise<string> {
  const { ctx, project } = scope;
  const { checkout, eventId } = action;
  const payment = await findPayment(ctx.db, project.id, { checkoutId: checkout.id });
  if (!payment) return keepNotOurs(scope, checkout);
  if (payment.status === 'uncredited' || !payment.user_id) return 'uncredited';
  const mismatch = checkoutMismatch(scope, payment, checkout);
  if (mismatch) {
    ctx.log.error(
      { projectId: project.id, checkout: checkout.id, paymentId: payment.id, mismatch },
      'a checkout paid in another amount or currency than its payment’s: not credited',
    );
    await keepUncredited(scope, payment, checkout, mismatch);
    return `${mismatch}_mismatch`;
  }
  const amount = paidAmount(scope, checkout.amountMinor);
  if (!amount) return 'nothing_paid';
  const credited = await credit(scope, payment as WalletPayment, eventId, {
    key: `deposit:${payment.id}`,
    amount,
    providerPaymentId: checkout.id,
    refs: { checkoutSessionId: checkout.id, paymentIntentId: checkout.paymentIntentId },
    row: {
      payment_intent_id: checkout.paymentIntentId,
      charge_id: checkout.chargeId,
      receipt_url: checkout.receiptUrl,
    },
  });
  if (!credited) return 'duplicate';
  if (!checkout.receiptUrl || payment.save_card) await fillReceipt(scope, payment, checkout.id);
  return 'applied';
}

/** Why the checkout Tollgate created is not what its payment asked for: `currency`, `amount`, or none. */
function checkoutMismatch(
  scope: WebhookScope,
  payment: PaymentRow,
  checkout: CheckoutState,
): 'currency' | 'amount' | undefined {
  const { currency } = scope.project;
  if (checkout.currency !== currency || payment.currency !== currency) return 'currency';
  if (checkout.amountMinor !== toMinorUnits(formatAmount(payment.amount), currency)) return 'amount';
  return undefined;
}

/**
 * A paid checkout Tollgate did not create for a payment: one naming a payment of this project (kept as
 * an `uncredited` payment of that payment's user, once per checkout), else `keepUnknown`. A payment
 * created in the last minute whose checkout id is not stored yet may be this very checkout's: the event
 * fails (500) and the provider delivers it again.
 */
async function keepNotOurs(scope: WebhookScope, checkout: CheckoutState): Promise<string> {
  const { ctx, project } = scope;
  const named = checkout.reference.paymentId
    ? await findPayment(ctx.db, project.id, { id: checkout.reference.paymentId })
    : undefined;
  if (!named) {
    await keepUnknown(scope, checkout);
    return 'unknown_payment';
  }
  if (!(checkout.amountMinor > 0)) return 'not_ours';
  if (named.status === 'pending' && !named.checkout_id && Date.now() - named.created_at.getTime() < 60_000) {
    // Its checkout is being created (its id is stored right after): the provider retries this event.
    throw new Error(`payment ${named.id} has no checkout stored yet; retry`);
  }
  ctx.log.error(
    { projectId: project.id, checkout: checkout.id, paymentId: named.id },
    'a checkout Tollgate did not create names one of its payments: not credited',
  );
  await keepForeign(scope, named, {
    amountMinor: checkout.amountMinor,
    currency: checkout.currency,
    checkoutId: checkout.id,
    paymentIntentId: checkout.paymentIntentId,
    chargeId: checkout.chargeId,
    receiptUrl: checkout.receiptUrl,
    what: `checkout ${checkout.id}`,
  });
  return 'not_ours';
}

/**
 * A provider's payment naming one of this project's payments that it was not created for: kept once as
 * an `uncredited` payment of the named payment's user, with the reason (the developer sees it in the
 * payments list and can refund it); nothing is credited.
 */
export async function keepForeign(
  scope: WebhookScope,
  named: PaymentRow,
  paid: {
    amountMinor: number;
    currency: string;
    checkoutId: string | null;
    paymentIntentId: string | null;
    chargeId: string | null;
    receiptUrl: string | null;
    what: string;
  },
): Promise<void> {
  const { ctx, project, provider } = scope;
  await ctx.db
    .insertInto('payments')
    .values({
      id: newId('pay'),
      project_id: project.id,
      user_id: named.user_id,
      external_id: named.external_id,
      provider: provider.name,
      status: 'uncredited',
      problem: `Paid ${money(paid.amountMinor, paid.currency)} through ${paid.what}, which names payment ${named.id} but is not the one Tollgate created for it: not credited. Refund it, or credit the user by hand.`,
      amount: fromMinorUnits(paid.amountMinor, paid.currency),
      currency: paid.currency,
      checkout_id: paid.checkoutId,
      payment_intent_id: paid.paymentIntentId,
      charge_id: paid.chargeId,
      receipt_url: paid.receiptUrl,
      paid_at: sql`now()`,
    })
    .onConflict((oc) => oc.doNothing())
    .execute();
}

/** An expired checkout, or one whose delayed payment failed: its pending payment fails. */
export async function checkoutFailed(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'checkout_failed' }>,
): Promise<string> {
  const updated = await scope.ctx.db
    .updateTable('payments')
    .set({ status: 'failed', updated_at: sql`now()` })
    .where('project_id', '=', scope.project.id)
    .where('checkout_id', '=', action.checkoutId)
    .where('status', '=', 'pending')
    .executeTakeFirst();
  return Number(updated.numUpdatedRows) ? 'failed' : 'ignored';
}

const money = (minor: number, currency: string) =>
  `${formatForCurrency(fromMinorUnits(minor, currency), currency)} ${currency.toUpperCase()}`;

/** The checkout's payment, paid in another amount or currency: `uncredited`, with the reason. */
async function keepUncredited(
  scope: WebhookScope,
  payment: PaymentRow,
  checkout: CheckoutState,
  mismatch: 'currency' | 'amount',
) {
  const currency = scope.project.currency;
  const asked = `${formatForCurrency(payment.amount, payment.currency)} ${payment.currency.toUpperCase()}`;
  const why =
    mismatch === 'currency'
      ? `not in the project’s currency (${currency.toUpperCase()})`
      : `not the ${asked} its payment asked for`;
  await scope.ctx.db
    .updateTable('payments')
    .set({
      status: 'uncredited',
      problem: `Paid ${money(checkout.amountMinor, checkout.currency)}, ${why}: not credited. Refund it, or credit the user by hand.`,
      checkout_id: checkout.id,
      payment_intent_id: checkout.paymentIntentId,
      charge_id: checkout.chargeId,
      receipt_url: checkout.receiptUrl,
      paid_at: sql`coalesce(paid_at, now())`,
      updated_at: sql`now()`,
    })
    .where('id', '=', payment.id)
    .where('status', 'in', ['pending', 'failed'])
    .execute();
}

/**
 * A paid checkout of this project (its reference names the project and a user) whose payment Tollgate
 * does not know: kept as an `uncredited` payment (its user's wallet when the user is known), once per
 * checkout. A checkout of something else in the developer's account (no reference) is not Tollgate's.
 */
async function keepUnknown(scope: WebhookScope, checkout: CheckoutState): Promise<void> {
  const { ctx, project, provider } = scope;
  const { reference } = checkout;
  if (reference.projectId !== project.id || !reference.externalId || !(checkout.amountMinor > 0)) return;
  ctx.log.error(
    { projectId: project.id, checkout: checkout.id, paymentId: reference.paymentId },
    'a checkout paid for a payment this project does not know: not credited',
  );
  const user = await ctx.db
    .selectFrom('end_users')
    .select('id')
    .where('project_id', '=', project.id)
    .where('external_id', '=', reference.externalId)
    .executeTakeFirst();
  const what = reference.paymentId ? `payment ${reference.paymentId}` : 'payment';
  await ctx.db
    .insertInto('payments')
    .values({
      id: newId('pay'),
      project_id: project.id,
      user_id: user?.id ?? null,
      external_id: reference.externalId,
      provider: provider.name,
      status: 'uncredited',
      problem: `Paid ${money(checkout.amountMinor, checkout.currency)} for a ${what} Tollgate does not know${user ? '' : ', by a user it does not know'}: not credited. Refund it, or credit the user by hand.`,
      amount: fromMinorUnits(checkout.amountMinor, checkout.currency),
      currency: checkout.currency,
      checkout_id: checkout.id,
      payment_intent_id: checkout.paymentIntentId,
      charge_id: checkout.chargeId,
      receipt_url: checkout.receiptUrl,
      paid_at: sql`now()`,
    })
    .onConflict((oc) => oc.column('checkout_id').doNothing())
    .execute();
}

/**
 * Best effort: the charge and its receipt link, which a completed session's event does not carry, and
 * the card the payer asked to save (its customer and payment method).
 */
async function fillReceipt(scope: WebhookScope, payment: PaymentRow, checkoutId: string): Promise<void> {
  const { ctx, project, provider } = scope;
  const paymentId = payment.id;
  try {
    const state = await provider.retrieveCheckout(checkoutId);
    if (payment.save_card && state.customerId && payment.user_id)
      await saveCard(ctx, project, payment.user_id, {
        provider: provider.name,
        customerId: state.customerId,
        paymentMethodId: state.paymentMethodId,
      });
    await ctx.db
      .updateTable('payments')
      .set({
        receipt_url: state.receiptUrl,
        charge_id: state.chargeId,
        payment_intent_id: sql`coalesce(payment_intent_id, ${state.paymentIntentId})`,
      })
      .where('id', '=', paymentId)
      .execute();
  } catch (err) {
    ctx.log.warn({ err, paymentId }, 'could not read the receipt of a payment');
  }
}

/**
 * The payment of a charge (by its PaymentIntent: the one stored when the payment was credited), credited
 * first when its checkout's own event has not arrived yet. A charge whose PaymentIntent is not the one
 * Tollgate stored for the payment its reference names has no payment here: it moves nothing.
 */
export async function paidPayment(
  scope: WebhookScope,
  paymentIntentId: string | null,
): Promise<PaymentRow | undefined> {
  const { ctx, project, provider } = scope;
  if (!paymentIntentId) return undefined;
  let payment = await findPayment(ctx.db, project.id, { paymentIntentId });
  if (payment) return payment;
  // A charge event ahead of its checkout's completion: the PaymentIntent carries our reference.
  const reference = await provider.paymentReference(paymentIntentId).catch(() => undefined);
  if (!reference?.paymentId || reference.projectId !== project.id) return undefined;
  payment = await findPayment(ctx.db, project.id, { id: reference.paymentId });
  if (payment?.status === 'pending' && payment.checkout_id) {
    const state = await provider.retrieveCheckout(payment.checkout_id);
    if (state.paid)
      await checkoutPaid(scope, { type: 'checkout_paid', eventId: 'reconcile', checkout: state });
    payment = await findPayment(ctx.db, project.id, { id: payment.id });
  }
  return payment?.payment_intent_id === paymentIntentId ? payment : undefined;
}
