import { formatForCurrency } from '../core/money.ts';
import type { Database } from '../db/index.ts';

/**
 * The payments table: a payment found by any of its ids, and what the API shows of payments (the admin
 * API, the dashboard and the CLI list them).
 */

export type PaymentRow = NonNullable<Awaited<ReturnType<typeof findPayment>>>;

/** The payment of a project with any of these ids (its own, its checkout's, its payment's). */
export async function findPayment(
  db: Database,
  projectId: string,
  by: { id?: string | undefined; checkoutId?: string | null; paymentIntentId?: string | null },
) {
  let query = db.selectFrom('payments').selectAll().where('project_id', '=', projectId);
  const ors: Array<[string, string]> = [];
  if (by.id) ors.push(['id', by.id]);
  if (by.checkoutId) ors.push(['checkout_id', by.checkoutId]);
  if (by.paymentIntentId) ors.push(['payment_intent_id', by.paymentIntentId]);
  if (!ors.length) return undefined;
  query = query.where((eb) =>
    eb.or(ors.map(([col, v]) => eb(col as 'id' | 'checkout_id' | 'payment_intent_id', '=', v))),
  );
  return query.executeTakeFirst();
}

/** What the API shows of a payment; `problem` only on one that could not be credited. */
export function paymentView(p: {
  id: string;
  external_id: string;
  provider: string;
  problem: string | null;
  status: string;
  amount: string;
  currency: string;
  refunded: string;
  disputed: string;
  uncollected: string;
  checkout_id: string | null;
  payment_intent_id: string | null;
  receipt_url: string | null;
  created_at: Date;
  paid_at: Date | null;
}) {
  const money = (v: string) => formatForCurrency(v, p.currency);
  return {
    id: p.id,
    object: 'payment' as const,
    user: p.external_id,
    status: p.status,
    amount: money(p.amount),
    refunded: money(p.refunded),
    disputed: money(p.disputed),
    uncollected: money(p.uncollected),
    currency: p.currency,
    provider: p.provider,
    checkoutId: p.checkout_id,
    paymentIntentId: p.payment_intent_id,
    receiptUrl: p.receipt_url,
    createdAt: p.created_at.toISOString(),
    paidAt: p.paid_at?.toISOString() ?? null,
    ...(p.problem ? { problem: p.problem } : {}),
  };
}

/** A project's payments, newest first (of one user, when asked); `startingAfter` pages on. */
export async function listPayments(
  ctx: { db: Database },
  projectId: string,
  filter: { user?: string | undefined; limit: number; startingAfter?: string | undefined },
) {
  const { user, limit, startingAfter } = filter;
  const rows = await ctx.db
    .selectFrom('payments')
    .selectAll()
    .where('project_id', '=', projectId)
    .$if(user !== undefined && user !== '', (q) => q.where('external_id', '=', user!))
    .$if(startingAfter !== undefined && startingAfter !== '', (q) => q.where('id', '<', startingAfter!))
    .orderBy('id', 'desc')
    .limit(limit + 1)
    .execute();
  return {
    object: 'list' as const,
    data: rows.slice(0, limit).map(paymentView),
    has_more: rows.length > limit,
  };
}
