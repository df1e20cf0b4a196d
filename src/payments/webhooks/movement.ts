import { sql, type Transaction, type UpdateObject } from 'kysely';
import type { LedgerProject, Trigger } from '../../billing/ledger.ts';
import { Money } from '../../core/money.ts';
import type { DB } from '../../db/schema.ts';
import type { EventType } from '../../events/catalog.ts';
import type { PaymentsContext } from '../connection.ts';
import type { PaymentProvider } from '../provider.ts';
import type { PaymentRow } from '../rows.ts';

/**
 * The one step every webhook that moves money takes, in the money's transaction: the movement key
 * (`deposit:<checkout or payment id>`, `refund:<charge id>:<total refunded>`, `dispute:<id>`,
 * `dispute_closed:<id>`) is claimed first — taken, and nothing happens: a replayed, duplicated or
 * concurrent webhook moves nothing — then the ledger entry (a deposit or a reversal of the payer's
 * wallet), the payment row's change and the payment's event.
 */

/** One webhook delivery of one project: what its handlers work with. */
export interface WebhookScope {
  ctx: PaymentsContext;
  project: LedgerProject & { name: string };
  provider: PaymentProvider;
}

/** A payment with a wallet (every payment but an uncredited one of an unknown user). */
export type WalletPayment = PaymentRow & { user_id: string };

/** The provider's event as the actor of a ledger movement or an event. */
export const providerTrigger = (provider: string, eventId: string): Trigger => ({
  source: provider,
  actorType: 'payment_provider',
  actorId: eventId,
});

/** What the ledger did: its entry, what it debited and what it could not collect. */
export interface Moved {
  entryId: string | null;
  debited: string;
  uncollected: string;
}

export interface MovementStep {
  key: string;
  kind: 'deposit' | 'refund' | 'dispute' | 'dispute_won';
  /** The amount the key records (replaced by what was debited, for a reversal). */
  amount: string;
  /** What a reversal takes back of its payment (debited and uncollected), kept on the movement. */
  reversed?: string;
  /** The ledger entry; none: the key, the row and the event only. */
  ledger?: {
    type: 'deposit' | 'reverse';
    amount: string;
    description: string;
    refs: Record<string, unknown>;
  };
  /** The payment row's change once the ledger moved; none: the row stays. */
  row?: (moved: Moved) => UpdateObject<DB, 'payments'> | undefined;
  /** The event: its type and its data (after `paymentId` and `externalUserId`); none: no event. */
  event?: { type: EventType; data: (moved: Moved) => Record<string, unknown> };
  /** More work in the same transaction, after the event (a recharge's own state and event). */
  also?: (tx: Transaction<DB>, moved: Moved) => Promise<void>;
}

/** The key and ledger entry of a reversal: what a refund or a dispute takes back from the wallet. */
export function reversal(
  key: string,
  kind: 'refund' | 'dispute',
  amount: string,
  description: string,
  refs: Record<string, unknown>,
): Pick<MovementStep, 'key' | 'kind' | 'amount' | 'reversed' | 'ledger'> {
  return { key, kind, amount, reversed: amount, ledger: { type: 'reverse', amount, description, refs } };
}

/** Inserts a movement key; false when it was taken (the movement happened already). */
export async function claimMovement(
  scope: WebhookScope,
  tx: Transaction<DB>,
  payment: Pick<PaymentRow, 'id'>,
  step: Pick<MovementStep, 'key' | 'kind' | 'amount' | 'reversed'>,
): Promise<boolean> {
  const inserted = await tx
    .insertInto('payment_movements')
    .values({
      project_id: scope.project.id,
      key: step.key,
      payment_id: payment.id,
      kind: step.kind,
      amount: step.amount,
      ...(step.reversed ? { reversed: step.reversed } : {}),
    })
    .onConflict((oc) => oc.columns(['project_id', 'key']).doNothing())
    .returning('key')
    .executeTakeFirst();
  return Boolean(inserted);
}

/** The step, once; undefined when its key was taken. */
export async function applyMovement(
  scope: WebhookScope,
  tx: Transaction<DB>,
  payment: WalletPayment,
  eventId: string,
  step: MovementStep,
): Promise<Moved | undefined> {
  const { ctx, project, provider } = scope;
  if (!(await claimMovement(scope, tx, payment, step))) return undefined;
  const trigger = providerTrigger(provider.name, eventId);
  let moved: Moved = { entryId: null, debited: '0', uncollected: '0' };
  if (step.ledger) {
    const input = {
      project,
      externalId: payment.external_id,
      amount: step.ledger.amount,
      source: provider.name,
      trigger,
      description: step.ledger.description,
      metadata: { paymentId: payment.id, provider: provider.name, ...step.ledger.refs },
    };
    if (step.ledger.type === 'deposit') {
      const deposit = await ctx.billing.deposit(input, tx);
      moved = { entryId: deposit.entry.id, debited: '0', uncollected: '0' };
    } else {
      const reversed = await ctx.billing.reverse(input, tx);
      moved = {
        entryId: reversed.entry?.id ?? null,
        debited: reversed.debited,
        uncollected: reversed.uncollected,
      };
    }
    await tx
      .updateTable('payment_movements')
      .set({
        entry_id: moved.entryId,
        ...(step.ledger.type === 'reverse' ? { amount: moved.debited } : {}),
      })
      .where('project_id', '=', project.id)
      .where('key', '=', step.key)
      .execute();
  }
  const row = step.row?.(moved);
  if (row)
    await tx
      .updateTable('payments')
      .set({ ...row, updated_at: sql`now()` })
      .where('id', '=', payment.id)
      .execute();
  if (step.event) {
    await ctx.events.record(tx, {
      project,
      type: step.event.type,
      trigger,
      subject: { type: 'user', id: payment.user_id, externalId: payment.external_id },
      data: { paymentId: payment.id, externalUserId: payment.external_id, ...step.event.data(moved) },
    });
  }
  if (step.also) await step.also(tx, moved);
  if (step.event) ctx.billing.afterCommit(tx, () => ctx.events.wake());
  return moved;
}

/** What refunds and disputes may still take back of a payment: its amount less earlier reversals. */
export function reversible(payment: Pick<PaymentRow, 'amount' | 'reversed'>): Money {
  return Money.max(new Money(payment.amount).minus(payment.reversed), 0);
}

/** The payment's row, locked for the movement (refund totals are compared under it). */
export async function lockPayment(tx: Transaction<DB>, paymentId: string): Promise<WalletPayment> {
  return (await tx
    .selectFrom('payments')
    .selectAll()
    .where('id', '=', paymentId)
    .forUpdate()
    .executeTakeFirstOrThrow()) as WalletPayment;
}
