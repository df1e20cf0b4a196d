import { formatAmount, Money } from '../core/money.ts';
import type { EventEnvelope, EventRecorder } from '../events/outbox.ts';

/**
 * The balance events of a charge: one table (`BALANCE_EVENTS`) says which events a charge emits, when,
 * and what each one's `data` holds. Both places that write them are generated from it:
 * - the settle statement (statements.ts `applySlices`), which decides them in SQL once the wallet is
 *   locked: the service builds an envelope of each wanted type with what it knows before the
 *   statement (the facts), and the statement keeps those whose condition holds and fills in the
 *   amounts (`balanceEventConditionSql`, `balanceEventDataSql`);
 * - the charges and reversals of ledger.ts, which decide them in TypeScript after their update
 *   (`recordBalanceEvents`).
 *
 * A condition and an amount are written over the wallet after the charge (`Quantity`): every quantity
 * has one SQL expression (over the statement's row) and one TypeScript computation, and a comparison
 * with an unknown quantity (no threshold) is false in both.
 */

/** The amounts a charge's events are decided on and filled with, known once the charge is applied. */
export type Quantity = 'charged' | 'balance' | 'before' | 'available' | 'threshold' | 'debt' | 'uncovered';

/** What is known of a charge before it is applied: the rest of its events' `data`. */
export type Fact =
  | 'projectId'
  | 'ownerUserId'
  | 'walletUserId'
  | 'externalUserId'
  | 'currency'
  | 'amount'
  | 'source'
  | 'activityId'
  | 'holdAmount';

/** `balance < threshold`, `charged > 0`, …: typed, and read by both the SQL and the TypeScript side. */
type Comparison = `${Quantity} ${'<' | '<=' | '>' | '>='} ${Quantity | 0}`;

interface BalanceEventRule {
  /** Written when every comparison holds. */
  when: readonly Comparison[];
  /** Each field of `data`, in order, and where its value comes from. */
  data: Readonly<Record<string, Fact | Quantity>>;
  /** Carries the charge's metadata. */
  metadata: boolean;
  /** A reversal (a refund or dispute taken back, ledger.ts `reverse`) writes it too. */
  reversals: boolean;
}

/** Who the event is about: the project and the wallet. */
const WALLET = {
  paywallId: 'projectId',
  ownerUserId: 'ownerUserId',
  walletUserId: 'walletUserId',
  externalUserId: 'externalUserId',
} as const;

/** The events that describe the charge: with its metadata, also for a reversal. */
const OF_CHARGE = { metadata: true, reversals: true } as const;
/** The wallet's alerts: without the charge's metadata, not for a reversal. */
const ALERT = { metadata: false, reversals: false } as const;

/**
 * Which balance events a charge emits, in the order they are written (see the event catalog for the
 * meaning of each field).
 */
export const BALANCE_EVENTS = {
  'balance.charge.created': {
    when: ['charged > 0'],
    data: {
      ...WALLET,
      amount: 'amount',
      currency: 'currency',
      source: 'source',
      activityId: 'activityId',
      balance: 'balance',
    },
    ...OF_CHARGE,
  },
  /** The charge left the balance below zero: `amount` is the part of it the balance did not cover. */
  'balance.debt.created': {
    when: ['charged > 0', 'balance < 0'],
    data: {
      ...WALLET,
      amount: 'uncovered',
      currency: 'currency',
      source: 'source',
      activityId: 'activityId',
      charged: 'amount',
      holdAmount: 'holdAmount',
      debt: 'debt',
      balance: 'balance',
    },
    ...OF_CHARGE,
  },
  /** Once per crossing: only a charge from at or above the threshold (the user's own, else the project's). */
  'balance.low': {
    when: ['balance < threshold', 'before >= threshold'],
    data: {
      ...WALLET,
      balance: 'balance',
      available: 'available',
      threshold: 'threshold',
      currency: 'currency',
    },
    ...ALERT,
  },
  'balance.depleted': {
    when: ['balance <= 0', 'before > 0'],
    data: { ...WALLET, balance: 'balance', available: 'available', currency: 'currency' },
    ...ALERT,
  },
} as const satisfies Record<string, BalanceEventRule>;

export type BalanceEventType = keyof typeof BALANCE_EVENTS;

const RULES = Object.entries(BALANCE_EVENTS) as Array<[BalanceEventType, BalanceEventRule]>;

/** A comparison's quantity, operator and quantity (or 0). */
function parts(comparison: Comparison): [Quantity, '<' | '<=' | '>' | '>=', Quantity | 0] {
  const [a, op, b] = comparison.split(' ') as [Quantity, '<' | '<=' | '>' | '>=', string];
  return [a, op, b === '0' ? 0 : (b as Quantity)];
}

// ---- SQL: over a row of the settle statement (statements.ts `applySlices`) ----

/**
 * Each quantity over the statement's row `u` (the wallet after the charge: `balance`, `reserved` — what
 * its requests in flight reserved, the held amount users see — the `charged` amount and the low-balance `threshold` that applies, or null).
 */
const QUANTITY_SQL: Record<Quantity, string> = {
  charged: 'u.charged',
  balance: 'u.balance',
  before: '(u.balance + u.charged)',
  available: '(u.balance - u.reserved)',
  threshold: 'u.threshold',
  debt: '(-u.balance)',
  uncovered: 'least(u.charged, -u.balance)',
};

const isQuantity = (source: string): source is Quantity => source in QUANTITY_SQL;

/**
 * A condition on the envelope `j` over the row `u`: true for the balance events whose rule holds (a
 * comparison with a null threshold is null: not written), and for any other event.
 */
export function balanceEventConditionSql(): string {
  const whens = RULES.map(
    ([type, rule]) =>
      `WHEN '${type}' THEN ${rule.when
        .map(parts)
        .map(([a, op, b]) => `${QUANTITY_SQL[a]} ${op} ${b === 0 ? '0' : QUANTITY_SQL[b]}`)
        .join(' AND ')}`,
  );
  return `CASE j->>'type'\n${whens.map((w) => `               ${w}\n`).join('')}               ELSE true END`;
}

/** The envelope `j` with the quantities of its `data` filled in from the row `u` (other events as they are). */
export function balanceEventDataSql(): string {
  const whens = RULES.map(([type, rule]) => {
    const fields = Object.entries(rule.data)
      .filter(([, source]) => isQuantity(source))
      .map(([field, source]) => `'${field}', trim_scale(${QUANTITY_SQL[source as Quantity]})::text`);
    return `WHEN '${type}' THEN jsonb_set(j, '{data}', (j->'data') || jsonb_build_object(${fields.join(', ')}))`;
  });
  return `CASE j->>'type'\n${whens.map((w) => `               ${w}\n`).join('')}               ELSE j END`;
}

// ---- TypeScript ----

/** A charge's facts: what its events carry besides the amounts. */
export interface ChargeFacts {
  project: { id: string; owner_user_id: string; currency: string };
  userId: string;
  externalId: string;
  /** The amount charged, as its events show it. */
  amount: string;
  source: string;
  /** The charge's ledger entry. */
  activityId: string;
  /** What the request's hold had reserved ('0' for a charge without a hold). */
  holdAmount: string;
  trigger: EventEnvelope['trigger'];
  metadata?: Record<string, unknown> | undefined;
}

/** The wallet after a charge: what its events are decided on. */
export interface ChargeOutcome {
  charged: Money | string;
  balance: Money | string;
  /** What the wallet's requests in flight reserved (the held amount users see). */
  reserved: Money | string;
  /** The low-balance threshold that applies (the user's own, else the project's), if any. */
  threshold: string | null | undefined;
}

function factOf(facts: ChargeFacts, fact: Fact): string {
  switch (fact) {
    case 'projectId':
      return facts.project.id;
    case 'ownerUserId':
      return facts.project.owner_user_id;
    case 'walletUserId':
      return facts.userId;
    case 'externalUserId':
      return facts.externalId;
    case 'currency':
      return facts.project.currency;
    default:
      return facts[fact];
  }
}

function quantities(outcome: ChargeOutcome): Record<Quantity, Money | null> {
  const charged = new Money(outcome.charged);
  const balance = new Money(outcome.balance);
  return {
    charged,
    balance,
    before: balance.plus(charged),
    available: balance.minus(outcome.reserved),
    threshold: outcome.threshold == null ? null : new Money(outcome.threshold),
    debt: balance.neg(),
    uncovered: Money.min(charged, balance.neg()),
  };
}

function holds(q: Record<Quantity, Money | null>, comparison: Comparison): boolean {
  const [a, op, b] = parts(comparison);
  const left = q[a];
  const right = b === 0 ? new Money(0) : q[b];
  if (left === null || right === null) return false;
  const c = left.cmp(right);
  return op === '<' ? c < 0 : op === '<=' ? c <= 0 : op === '>' ? c > 0 : c >= 0;
}

/** The `data` of an event: its facts, and its quantities when the outcome is known. */
function dataOf(
  rule: BalanceEventRule,
  facts: ChargeFacts,
  q: Record<Quantity, Money | null> | undefined,
): Record<string, string> {
  const data: Record<string, string> = {};
  for (const field in rule.data) {
    const source = rule.data[field] as Fact | Quantity;
    if (!isQuantity(source)) data[field] = factOf(facts, source);
    else if (q) data[field] = formatAmount(q[source] ?? 0);
  }
  return data;
}

const subjectOf = (facts: ChargeFacts) => ({ type: 'user', id: facts.userId, externalId: facts.externalId });

/**
 * The envelopes of a metered charge's balance events that the project wants, with their facts only:
 * the settle statement keeps those whose rule holds and fills in their amounts.
 */
export function balanceEventEnvelopes(
  events: EventRecorder,
  facts: ChargeFacts,
  into: EventEnvelope[],
): void {
  const subject = subjectOf(facts);
  for (const [type, rule] of RULES) {
    if (!events.wants(facts.project.id, type)) continue;
    into.push(
      events.build({
        project: facts.project,
        type,
        trigger: facts.trigger,
        subject,
        data: dataOf(rule, facts, undefined),
        metadata: rule.metadata ? facts.metadata : undefined,
      }),
    );
  }
}

/**
 * Records, in `tx`, the balance events a charge (or a reversal) emits now that it is applied; returns
 * its `balance.charge.created` envelope when written.
 */
export async function recordBalanceEvents(
  tx: Parameters<EventRecorder['record']>[0],
  events: EventRecorder,
  facts: ChargeFacts,
  outcome: ChargeOutcome,
  kind: 'charge' | 'reversal',
): Promise<EventEnvelope | undefined> {
  const q = quantities(outcome);
  const subject = subjectOf(facts);
  let created: EventEnvelope | undefined;
  for (const [type, rule] of RULES) {
    if ((kind === 'reversal' && !rule.reversals) || !rule.when.every((c) => holds(q, c))) continue;
    const envelope = await events.record(tx, {
      project: facts.project,
      type,
      trigger: facts.trigger,
      subject,
      data: dataOf(rule, facts, q),
      metadata: rule.metadata ? facts.metadata : undefined,
    });
    if (type === 'balance.charge.created') created = envelope;
  }
  return created;
}
