import { sql } from 'kysely';
import { newId } from '../../core/ids.ts';
import { formatForCurrency, Money } from '../../core/money.ts';
import { type CheckoutState, fromMinorUnits, type WebhookAction } from '../provider.ts';
import { saveCard } from '../recharge.ts';
import { findPayment, type PaymentRow } from '../rows.ts';
import { applyMovement, type MovementStep, type WalletPayment, type WebhookScope } from './movement.ts';

/**
 * A checkout's webhooks: paid (credited once, movement key `deposit:<checkout id>`) or failed. A paid
 * checkout that cannot be credited — paid in another currency than the project's, or naming a payment
 * Tollgate does not know — is kept as an `uncredited` payment with the reason, which the payments list
 * shows (and the error is logged), and acknowledged: retrying would not help.
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

/** Credits a paid checkout once (movement key `deposit:<checkout id>`). */
export async function checkoutPaid(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'checkout_paid' }>,
): Promise<string> {
  const { ctx, project } = scope;
  const { checkout, eventId } = action;
  const payment = await findPayment(ctx.db, project.id, {
    id: checkout.reference.paymentId,
    checkoutId: checkout.id,
  });
  if (!payment) {
    await keepUnknown(scope, checkout);
    return 'unknown_payment';
  }
  if (payment.status === 'uncredited' || !payment.user_id) return 'uncredited';
  if (checkout.currency !== project.currency) {
    ctx.log.error(
      { projectId: project.id, checkout: checkout.id, currency: checkout.currency },
      'a checkout paid in another currency than the project’s: not credited',
    );
    await keepUncredited(scope, payment, checkout);
    return 'currency_mismatch';
  }
  const amount = paidAmount(scope, checkout.amountMinor);
  if (!amount) return 'nothing_paid';
  const credited = await credit(scope, payment as WalletPayment, eventId, {
    key: `deposit:${checkout.id}`,
    amount,
    providerPaymentId: checkout.id,
    refs: { checkoutSessionId: checkout.id, paymentIntentId: checkout.paymentIntentId },
    row: {
      checkout_id: checkout.id,
      payment_intent_id: checkout.paymentIntentId,
      charge_id: checkout.chargeId,
      receipt_url: checkout.receiptUrl,
    },
  });
  if (!credited) return 'duplicate';
  if (!checkout.receiptUrl || payment.save_card) await fillReceipt(scope, payment, checkout.id);
  return 'applied';
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

/** The checkout's payment, paid in another currency: `uncredited`, with the reason. */
async function keepUncredited(scope: WebhookScope, payment: PaymentRow, checkout: CheckoutState) {
  const currency = scope.project.currency;
  await scope.ctx.db
    .updateTable('payments')
    .set({
      status: 'uncredited',
      problem: `Paid ${money(checkout.amountMinor, checkout.currency)}, not in the project’s currency (${currency.toUpperCase()}): not credited. Refund it, or credit the user by hand.`,
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

/** The payment of a charge, credited first when its checkout's own event has not arrived yet. */
export async function paidPayment(
  scope: WebhookScope,
  by: { id?: string | undefined; paymentIntentId: string | null },
): Promise<PaymentRow | undefined> {
  const { ctx, project, provider } = scope;
  let payment = await findPayment(ctx.db, project.id, by);
  if (!payment && !by.id && by.paymentIntentId) {
    // A charge event ahead of its checkout's completion: the PaymentIntent carries our reference.
    const reference = await provider.paymentReference(by.paymentIntentId).catch(() => undefined);
    if (reference?.paymentId && reference.projectId === project.id)
      payment = await findPayment(ctx.db, project.id, { id: reference.paymentId });
  }
  if (payment?.status === 'pending' && payment.checkout_id) {
    const state = await provider.retrieveCheckout(payment.checkout_id);
    if (state.paid)
      await checkoutPaid(scope, { type: 'checkout_paid', eventId: 'reconcile', checkout: state });
    payment = await findPayment(ctx.db, project.id, { id: payment.id });
  }
  return payment;
}
