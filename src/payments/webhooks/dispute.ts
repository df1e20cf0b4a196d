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
  type WalletPayment,
  type WebhookScope,
} from './movement.ts';

/**
 * Disputes (chargebacks) of a paid top-up. Opening one debits the disputed amount as a reversal, once
 * (movement key `dispute:<id>`); closing it (`dispute_closed:<id>`, once) credits back what was debited
 * when it was won. A dispute won before its opening arrived took nothing, and its late opening takes
 * nothing either.
 */
type DisputeAction = Extract<WebhookAction, { type: 'dispute_opened' | 'dispute_closed' }>;

export async function dispute(scope: WebhookScope, action: DisputeAction): Promise<string> {
  const found = await paidPayment(scope, { paymentIntentId: action.paymentIntentId });
  if (!found) return 'unknown_payment';
  if (found.status === 'pending' || found.status === 'uncredited') return 'not_paid';
  const { ctx, project } = scope;
  const amount = formatForCurrency(fromMinorUnits(action.amountMinor, project.currency), project.currency);
  const won = action.type === 'dispute_closed' && action.status === 'won';
  const done = await ctx.billing.transaction(async (tx) => {
    const payment = await lockPayment(tx, found.id);
    const opened = await tx
      .selectFrom('payment_movements')
      .select(['amount', 'entry_id'])
      .where('project_id', '=', project.id)
      .where('key', '=', `dispute:${action.disputeId}`)
      .executeTakeFirst();
    let debited = opened ? opened.amount : '0';
    let changed = false;
    if (!opened && !won) {
      // A dispute opened (or closed lost before its opening arrived) takes the amount back once.
      const moved = await open(scope, tx, payment, action, amount);
      debited = moved?.debited ?? '0';
      changed = Boolean(moved);
    } else if (!opened && won) {
      // Won before its opening arrived: nothing was taken, and the late opening must take nothing.
      const key = `dispute:${action.disputeId}`;
      await claimMovement(scope, tx, payment, { key, kind: 'dispute', amount: '0' });
    }
    if (
      action.type === 'dispute_closed' &&
      (await close(scope, tx, payment, action, { amount, debited, opened: Boolean(opened) }))
    )
      changed = true;
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
  state: { amount: string; debited: string; opened: boolean },
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
      if (!won || !state.opened) return undefined;
      const uncollectedPart = Money.max(new Money(state.amount).minus(state.debited), 0);
      return {
        disputed: sql`greatest(disputed - ${state.amount}::numeric, 0)`,
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
