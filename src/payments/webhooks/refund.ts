import { sql } from 'kysely';
import { formatAmount, formatForCurrency, Money } from '../../core/money.ts';
import { fromMinorUnits, type WebhookAction } from '../provider.ts';
import { paidPayment } from './checkout.ts';
import { applyMovement, lockPayment, reversal, reversible, type WebhookScope } from './movement.ts';

/**
 * A refund of a paid top-up (made through Tollgate or in the provider's dashboard): what was refunded
 * since the last event is debited as a reversal, once (movement key `refund:<charge id>:<total>`), and
 * never more than the payment's amount less its earlier reversals (`reversible`): a refund reported
 * larger than its payment takes back the payment, no more. Refund totals are cumulative and compared
 * under the payment's row lock, so an older event arriving late takes nothing back twice.
 */
export async function refunded(
  scope: WebhookScope,
  action: Extract<WebhookAction, { type: 'refunded' }>,
): Promise<string> {
  const found = await paidPayment(scope, action.paymentIntentId);
  if (!found) return 'unknown_payment';
  if (found.status === 'pending' || found.status === 'uncredited') return 'not_paid';
  const { ctx, project } = scope;
  const { currency } = project;
  const total = fromMinorUnits(action.refundedMinor, currency);
  return ctx.billing.transaction(async (tx) => {
    const payment = await lockPayment(tx, found.id);
    const delta = new Money(total).minus(payment.refunded);
    if (delta.lte(0)) return 'duplicate';
    const take = Money.min(delta, reversible(payment));
    const status = new Money(total).gte(payment.amount) ? 'refunded' : payment.status;
    if (take.lte(0)) {
      // Nothing left to take back: the provider's total is kept, nothing moves.
      await tx
        .updateTable('payments')
        .set({ refunded: total, status, updated_at: sql`now()` })
        .where('id', '=', payment.id)
        .execute();
      ctx.log.warn({ paymentId: payment.id, total }, 'a refund beyond its payment: nothing left to reverse');
      return 'capped';
    }
    const amount = formatForCurrency(take, currency);
    const key = `refund:${action.chargeId}:${action.refundedMinor}`;
    const moved = await applyMovement(scope, tx, payment, action.eventId, {
      ...reversal(key, 'refund', amount, `Refund of top-up ${payment.id}`, { chargeId: action.chargeId }),
      row: (m) => ({
        refunded: total,
        reversed: sql`reversed + ${formatAmount(take)}::numeric`,
        uncollected: sql`uncollected + ${m.uncollected}::numeric`,
        status,
        charge_id: sql`coalesce(charge_id, ${action.chargeId})`,
        receipt_url: sql`coalesce(receipt_url, ${action.receiptUrl})`,
      }),
      event: {
        type: 'payment.refunded',
        data: (m) => ({
          amount,
          refunded: formatForCurrency(Money.min(total, payment.amount), currency),
          uncollected: formatForCurrency(m.uncollected, currency),
          currency,
          activityId: m.entryId,
        }),
      },
    });
    return moved ? 'applied' : 'duplicate';
  });
}
