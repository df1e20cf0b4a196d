import type { WebhookAction } from '../provider.ts';
import { failRecharge, rechargeSucceeded } from '../recharge.ts';
import { findPayment } from '../rows.ts';
import { credit, paidAmount } from './checkout.ts';
import type { WalletPayment, WebhookScope } from './movement.ts';

/**
 * An off-session recharge's payment (../recharge.ts): credited once when it succeeded (movement key
 * `deposit:<payment id>`), through the same deposit step as a checkout; failed when it was declined or
 * needs its holder. A payment that is not a recharge (a checkout's own) is left to its checkout's events.
 */

type IntentAction = Extract<WebhookAction, { type: 'intent_succeeded' | 'intent_failed' }>;

/** The recharge of the intent's payment; a string outcome when there is none. */
async function rechargeOf(scope: WebhookScope, action: IntentAction) {
  const { db } = scope.ctx;
  const payment = await findPayment(db, scope.project.id, {
    id: action.reference.paymentId,
    paymentIntentId: action.paymentIntentId,
  });
  if (!payment) return 'unknown_payment';
  const recharge = await db
    .selectFrom('recharges')
    .select('id')
    .where('id', '=', payment.id)
    .executeTakeFirst();
  if (!recharge) return 'not_a_recharge';
  return payment as WalletPayment;
}

export async function rechargePaid(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'intent_succeeded' }>,
): Promise<string> {
  const { ctx, project, provider } = scope;
  const payment = await rechargeOf(scope, action);
  if (typeof payment === 'string') return payment;
  if (action.currency !== project.currency) return 'currency_mismatch';
  const amount = paidAmount(scope, action.amountMinor);
  if (!amount) return 'nothing_paid';
  const credited = await credit(scope, payment, action.eventId, {
    key: `deposit:${action.paymentIntentId}`,
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
