import { formatAmount } from '../../core/money.ts';
import { toMinorUnits, type WebhookAction } from '../provider.ts';
import { failRecharge, rechargeSucceeded } from '../recharge.ts';
import { findPayment, type PaymentRow } from '../rows.ts';
import { credit, keepForeign, paidAmount } from './checkout.ts';
import type { WalletPayment, WebhookScope } from './movement.ts';

/**
 * An off-session recharge's payment (../recharge.ts): credited once when it succeeded (movement key
 * `deposit:<payment id>`), through the same deposit step as a checkout; failed when it was declined or
 * needs its holder. Only the PaymentIntent Tollgate made for the recharge counts: the one stored on the
 * payment, or — when its webhook comes before Tollgate stored it — one charging the saved card's
 * customer; with the recharge's amount and currency. Any other PaymentIntent naming a recharge is kept
 * as an `uncredited` payment and moves nothing. A payment that is not a recharge (a checkout's own) is
 * left to its checkout's events.
 */

type IntentAction = Extract<WebhookAction, { type: 'intent_succeeded' | 'intent_failed' }>;

/** The recharge of the intent's payment; a string outcome when there is none, or it is not this intent's. */
async function rechargeOf(scope: WebhookScope, action: IntentAction): Promise<WalletPayment | string> {
  const { db } = scope.ctx;
  const projectId = scope.project.id;
  let payment = await findPayment(db, projectId, { paymentIntentId: action.paymentIntentId });
  payment ??= await findPayment(db, projectId, { id: action.reference.paymentId });
  if (!payment) return 'unknown_payment';
  // (read once more by its id: Tollgate may have stored the intent between the two reads)
  const stored = payment.payment_intent_id === action.paymentIntentId;
  const recharge = await db
    .selectFrom('recharges')
    .select('id')
    .where('id', '=', payment.id)
    .executeTakeFirst();
  if (!recharge) return 'not_a_recharge';
  if (stored || (await madeForRecharge(scope, payment, action))) return payment as WalletPayment;
  if (action.type === 'intent_succeeded') {
    scope.ctx.log.error(
      { projectId, paymentIntentId: action.paymentIntentId, paymentId: payment.id },
      'a PaymentIntent Tollgate did not make names a recharge: not credited',
    );
    await keepForeign(scope, payment, {
      amountMinor: action.amountMinor,
      currency: action.currency,
      checkoutId: null,
      paymentIntentId: action.paymentIntentId,
      chargeId: action.chargeId,
      receiptUrl: null,
      what: `PaymentIntent ${action.paymentIntentId}`,
    });
  }
  return 'not_ours';
}

/**
 * The intent is the recharge's own although not stored yet (its webhook came first): the recharge has
 * no PaymentIntent stored, and the intent charges the customer of the user's saved card.
 */
async function madeForRecharge(scope: WebhookScope, payment: PaymentRow, action: IntentAction) {
  if (payment.payment_intent_id || !payment.user_id || !action.customerId) return false;
  const card = await scope.ctx.db
    .selectFrom('payment_customers')
    .select('customer_id')
    .where('user_id', '=', payment.user_id)
    .executeTakeFirst();
  return card?.customer_id === action.customerId;
}

export async function rechargePaid(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'intent_succeeded' }>,
): Promise<string> {
  const { ctx, project, provider } = scope;
  const payment = await rechargeOf(scope, action);
  if (typeof payment === 'string') return payment;
  if (action.currency !== project.currency || payment.currency !== project.currency) {
    ctx.log.error({ paymentId: payment.id }, 'a recharge paid in another currency: not credited');
    return 'currency_mismatch';
  }
  if (action.amountMinor !== toMinorUnits(formatAmount(payment.amount), payment.currency)) {
    ctx.log.error({ paymentId: payment.id }, 'a recharge paid another amount than asked: not credited');
    return 'amount_mismatch';
  }
  const amount = paidAmount(scope, action.amountMinor);
  if (!amount) return 'nothing_paid';
  const credited = await credit(scope, payment, action.eventId, {
    key: `deposit:${payment.id}`,
    amount,
    providerPaymentId: action.paymentIntentId,
    refs: { paymentIntentId: action.paymentIntentId, recharge: true },
    row: { payment_intent_id: action.paymentIntentId, charge_id: action.chargeId },
    also: (tx, moved) =>
      rechargeSucceeded(ctx, tx, project, {
        provider: provider.name,
        rechargeId: payment.id,
        paymentIntentId: action.paymentIntentId,
        externalId: payment.external_id,
        activityId: moved.entryId!,
        eventId: action.eventId,
      }),
  });
  return credited ? 'applied' : 'duplicate';
}

/** A recharge's payment failed (declined, or it needs its holder): see `failRecharge`. */
export async function rechargeFailed(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'intent_failed' }>,
): Promise<string> {
  const payment = await rechargeOf(scope, action);
  if (typeof payment === 'string') return payment;
  const failed = await failRecharge(scope.ctx, scope.project, payment.id, {
    code: action.code,
    message: action.message,
    paymentIntentId: action.paymentIntentId,
    actorId: action.eventId,
  });
  return failed ? 'failed' : 'duplicate';
}
