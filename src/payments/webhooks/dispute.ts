import { sql, type Transaction } from 'kysely';
import { formatAmount, formatForCurrency, Money } from '../../core/money.ts';
import type { DB } from '../../db/schema.ts';
import { fromMinorUnits, type WebhookAction } from '../provider.ts';
import { paidPayment } from './checkout.ts';
import {
  applyMovement,
  claimMovement,
  lockPayment,
  reversal,
  reversible,
  type WalletPayment,
  type WebhookScope,
} from './movement.ts';

/**
 * Disputes (chargebacks) of a paid top-up. Opening one debits the disputed amount as a reversal, once
 * (movement key `dispute:<id>`), never more than the payment's amount less its earlier reversals
 * (`reversible`: refunds and other disputes; a dispute larger than its payment takes the payment back,
 * no more; its share is kept on the movement as `reversed`). Closing it (`dispute_closed:<id>`, once)
 * credits back what was debited when it was won, and gives its share back to the payment. A dispute won
 * before its opening arrived took nothing, and its late opening takes nothing either.
 */
type DisputeAction = Extract<WebhookAction, { type: 'dispute_opened' | 'dispute_closed' }>;

export async function dispute(scope: WebhookScope, action: DisputeAction): Promise<string> {
  const found = await paidPayment(scope, action.paymentIntentId);
  if (!found) return 'unknown_payment';
  if (found.status === 'pending' || found.status === 'uncredited') return 'not_paid';
  const { ctx, project } = scope;
  const asked = fromMinorUnits(action.amountMinor, project.currency);
  const won = action.type === 'dispute_closed' && action.status === 'won';
  const key = `dispute:${action.disputeId}`;
  const done = await ctx.billing.transaction(async (tx) => {
    const payment = await lockPayment(tx, found.id);
    const opened = await tx
      .selectFrom('payment_movements')
      .select(['amount', 'reversed'])
      .where('project_id', '=', project.id)
      .where('key', '=', key)
      .executeTakeFirst();
    let state = { debited: opened?.amount ?? '0', reversed: opened?.reversed ?? '0' };
    let changed = false;
    // Never more than what is left of the payment after its earlier reversals.
    const take = formatForCurrency(Money.min(asked, reversible(payment)), project.currency);
    if (!opened && !won && new Money(take).gt(0)) {
      // A dispute opened (or closed lost before its opening arrived) takes the amount back once.
      const moved = await open(scope, tx, payment, action, take);
      state = { debited: moved?.debited ?? '0', reversed: moved ? take : '0' };
      changed = Boolean(moved);
    } else if (!opened) {
      // Won before its opening arrived, or nothing left to take: the (late) opening takes nothing.
      await claimMovement(scope, tx, payment, { key, kind: 'dispute', amount: '0' });
    }
    if (action.type === 'dispute_closed' && (await close(scope, tx, payment, action, state))) changed = true;
    return changed;
  });
  return done ? 'applied' : 'duplicate';
}

function open(
  scope: WebhookScope,
  tx: Transaction<DB>,
  payment: WalletPayment,
  action: DisputeAction,
  amount: string,
) {
  const { currency } = scope.project;
  const key = `dispute:${action.disputeId}`;
  return applyMovement(scope, tx, payment, action.eventId, {
    ...reversal(key, 'dispute', amount, `Dispute of top-up ${payment.id}`, { disputeId: action.disputeId }),
    row: (moved) => ({
      disputed: sql`disputed + ${amount}::numeric`,
      reversed: sql`reversed + ${amount}::numeric`,
      uncollected: sql`uncollected + ${moved.uncollected}::numeric`,
      status: 'disputed',
    }),
    event: {
      type: 'payment.disputed',
      data: (moved) => ({
        disputeId: action.disputeId,
        amount: formatForCurrency(amount, currency),
        uncollected: formatForCurrency(moved.uncollected, currency),
        currency,
        activityId: moved.entryId,
      }),
    },
  });
}

/** The closing, once: a won dispute credits back what its opening debited. */
async function close(
  scope: WebhookScope,
  tx: Transaction<DB>,
  payment: WalletPayment,
  action: DisputeAction,
  state: { debited: string; reversed: string },
): Promise<boolean> {
  const { currency } = scope.project;
  const won = action.status === 'won';
  const restore = won ? state.debited : '0';
  const credit = won && new Money(restore).gt(0);
  const moved = await applyMovement(scope, tx, payment, action.eventId, {
    key: `dispute_closed:${action.disputeId}`,
    kind: 'dispute_won',
    amount: restore,
    ...(credit
      ? {
          ledger: {
            type: 'deposit' as const,
            amount: restore,
            description: `Dispute won for top-up ${payment.id}`,
            refs: { disputeId: action.disputeId },
          },
        }
      : {}),
    row: () => {
      if (!won || !new Money(state.reversed).gt(0)) return undefined;
      const uncollectedPart = Money.max(new Money(state.reversed).minus(state.debited), 0);
      return {
        disputed: sql`greatest(disputed - ${state.reversed}::numeric, 0)`,
        reversed: sql`greatest(reversed - ${state.reversed}::numeric, 0)`,
        uncollected: sql`greatest(uncollected - ${formatAmount(uncollectedPart)}::numeric, 0)`,
        status: sql`CASE WHEN refunded >= amount THEN 'refunded' ELSE 'paid' END`,
      };
    },
    event: {
      type: 'payment.dispute.closed',
      data: (m) => ({
        disputeId: action.disputeId,
        status: action.status,
        amount: formatForCurrency(restore, currency),
        currency,
        activityId: m.entryId,
      }),
    },
  });
  return Boolean(moved);
}
