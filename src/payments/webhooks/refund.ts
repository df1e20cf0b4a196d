import { sql } from 'kysely';
import { formatForCurrency, Money } from '../../core/money.ts';
import { fromMinorUnits, type WebhookAction } from '../provider.ts';
import { paidPayment } from './checkout.ts';
import { applyMovement, lockPayment, reversal, type WebhookScope } from './movement.ts';

/**
 * A refund of a paid top-up (made through Tollgate or in the provider's dashboard): what was refunded
 * since the last event is debited as a reversal, once (movement key `refund:<charge id>:<total>`).
 * Refund totals are cumulative and compared under the payment's row lock, so an older event arriving
 * late takes nothing back twice.
 */
export async function refunded(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'refunded' }>,
): Promise<string> {
  const found = await paidPayment(scope, {
    id: action.reference.paymentId,
    paymentIntentId: action.paymentIntentId,
  });
  if (!found) return 'unknown_payment';
  if (found.status === 'pending' || found.status === 'uncredited') return 'not_paid';
  const { ctx, project } = scope;
  const { currency } = project;
  const total = fromMinorUnits(action.refundedMinor, currency);
  const done = await ctx.billing.transaction(async (tx) => {
    const payment = await lockPayment(tx, found.id);
    const delta = new Money(total).minus(payment.refunded);
    if (delta.lte(0)) return undefined;
    const amount = formatForCurrency(delta, currency);
    const key = `refund:${action.chargeId}:${action.refundedMinor}`;
    return applyMovement(scope, tx, payment, action.eventId, {
      ...reversal(key, 'refund', amount, `Refund of top-up ${payment.id}`, { chargeId: action.chargeId }),
      row: (moved) => ({
        refunded: total,
        uncollected: sql`uncollected + ${moved.uncollected}::numeric`,
        status: new Money(total).gte(payment.amount) ? 'refunded' : payment.status,
        charge_id: sql`coalesce(charge_id, ${action.chargeId})`,
        receipt_url: sql`coalesce(receipt_url, ${action.receiptUrl})`,
      }),
      event: {
        type: 'payment.refunded',
        data: (moved) => ({
          amount: formatForCurrency(amount, currency),
          refunded: formatForCurrency(total, currency),
          uncollected: formatForCurrency(moved.uncollected, currency),
          currency,
          activityId: moved.entryId,
        }),
      },
    });
  });
  return done ? 'applied' : 'duplicate';
}
