import { type Kysely, sql, type Transaction } from 'kysely';
import { newId } from '../core/ids.ts';
import { formatAmount, formatForCurrency, Money } from '../core/money.ts';
import type { DB, EndUser, LedgerEntry, Project } from '../db/schema.ts';
import type { EventEnvelope, EventRecorder } from '../events/outbox.ts';

/**
 * The ledger's statements for deposits and charges, and the wallet reads. Only the billing service
 * (service.ts) calls them: it owns every movement of money and the effects after each commit.
 *
 * Every deposit and charge is an append-only ledger entry written in the same transaction as the change
 * of the wallet's cached `balance`, so `balance = sum(amount)` over a user's entries always holds. A
 * hold moves no money: it is a row of `holds` (statements.ts), and `held = sum(amount)` over the
 * wallet's open holds. The database enforces the no-overspend rule itself (`CHECK (balance >= held AND
 * held >= 0)`), and every debit is conditional on `balance - held` covering it, so concurrent requests
 * can never spend more than the wallet holds.
 */

export type LedgerProject = Pick<Project, 'id' | 'owner_user_id' | 'currency'>;

export interface Trigger {
  source: string;
  actorType: string;
  actorId: string;
}

export interface WalletState {
  userId: string;
  externalId: string;
  connected: boolean;
  balance: string;
  held: string;
  /** balance − held */
  available: string;
}

export type PaywallRefusal =
  | { ok: false; reason: 'not_connected'; wallet: WalletState | undefined }
  | { ok: false; reason: 'insufficient_balance'; wallet: WalletState; required: string };

export function walletOf(
  row: Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'held'>,
): WalletState {
  return {
    userId: row.id,
    externalId: row.external_id,
    connected: row.connected,
    balance: formatAmount(row.balance),
    held: formatAmount(row.held),
    available: formatAmount(new Money(row.balance).minus(row.held)),
  };
}

export async function findWallet(
  db: Kysely<DB>,
  projectId: string,
  externalId: string,
): Promise<WalletState | undefined> {
  const row = await db
    .selectFrom('end_users')
    .select(['id', 'external_id', 'connected', 'balance', 'held'])
    .where('project_id', '=', projectId)
    .where('external_id', '=', externalId)
    .executeTakeFirst();
  return row ? walletOf(row) : undefined;
}

/** Returns the user's id, creating a disconnected user with an empty wallet when unknown. */
export async function ensureUser(db: Kysely<DB>, projectId: string, externalId: string): Promise<string> {
  const inserted = await db
    .insertInto('end_users')
    .values({ id: newId('usr'), project_id: projectId, external_id: externalId })
    .onConflict((oc) => oc.columns(['project_id', 'external_id']).doNothing())
    .returning('id')
    .executeTakeFirst();
  if (inserted) return inserted.id;
  const existing = await db
    .selectFrom('end_users')
    .select('id')
    .where('project_id', '=', projectId)
    .where('external_id', '=', externalId)
    .executeTakeFirstOrThrow();
  return existing.id;
}

export function moneyEventData(
  project: LedgerProject,
  wallet: { userId: string; externalId: string },
  amount: string,
  source: string,
  activityId: string,
): Record<string, string> {
  return {
    paywallId: project.id,
    ownerUserId: project.owner_user_id,
    walletUserId: wallet.userId,
    externalUserId: wallet.externalId,
    amount,
    currency: project.currency,
    source,
    activityId,
  };
}

export interface DepositInput {
  project: LedgerProject;
  externalId: string;
  amount: string;
  source: string;
  trigger: Trigger;
  metadata?: Record<string, unknown> | undefined;
  description?: string | undefined;
}

export interface DepositResult {
  entry: LedgerEntry;
  wallet: WalletState;
  event: EventEnvelope | undefined;
}

/** Credits a wallet (creating the user when unknown) and records `balance.deposit.created`, in `tx`. */
export async function deposit(
  tx: Transaction<DB>,
  events: EventRecorder,
  input: DepositInput,
): Promise<DepositResult> {
  const amount = new Money(input.amount);
  if (!amount.isFinite() || amount.lte(0))
    throw new Error(`deposit amount must be positive, got ${input.amount}`);
  const userId = await ensureUser(tx, input.project.id, input.externalId);
  const user = await tx
    .updateTable('end_users')
    .set({ balance: sql`balance + ${input.amount}::numeric`, updated_at: sql`now()` })
    .where('id', '=', userId)
    .returning(['id', 'external_id', 'connected', 'balance', 'held'])
    .executeTakeFirstOrThrow();
  const entry = await writeEntry(tx, input, user, 'deposit', input.amount);
  const wallet = walletOf(user);
  const event = await events.record(tx, {
    project: input.project,
    type: 'balance.deposit.created',
    trigger: input.trigger,
    subject: { type: 'user', id: user.id, externalId: user.external_id },
    data: moneyEventData(input.project, wallet, input.amount, input.source, entry.id),
    metadata: input.metadata,
  });
  return { entry, wallet, event };
}

export interface ChargeInput {
  project: LedgerProject;
  externalId: string;
  amount: string;
  source: string;
  trigger: Trigger;
  metadata?: Record<string, unknown> | undefined;
  description?: string | undefined;
}

export type ChargeResult =
  | { ok: true; entry: LedgerEntry; wallet: WalletState; event: EventEnvelope | undefined }
  | PaywallRefusal;

/**
 * Debits a connected wallet when its available balance (balance − held) covers the amount, and records
 * `balance.charge.created`, in `tx`. Refuses with `not_connected` or `insufficient_balance` otherwise.
 */
export async function charge(
  tx: Transaction<DB>,
  events: EventRecorder,
  input: ChargeInput,
): Promise<ChargeResult> {
  const user = await tx
    .updateTable('end_users')
    .set({ balance: sql`balance - ${input.amount}::numeric`, updated_at: sql`now()` })
    .where('project_id', '=', input.project.id)
    .where('external_id', '=', input.externalId)
    .where('connected', '=', true)
    .where(sql<boolean>`balance - held >= ${input.amount}::numeric`)
    .returning(['id', 'external_id', 'connected', 'balance', 'held'])
    .executeTakeFirst();
  if (!user) return refusal(tx, input.project.id, input.externalId, input.amount);
  const entry = await writeEntry(tx, input, user, 'charge', formatAmount(new Money(input.amount).neg()));
  const wallet = walletOf(user);
  const event = await events.record(tx, {
    project: input.project,
    type: 'balance.charge.created',
    trigger: input.trigger,
    subject: { type: 'user', id: user.id, externalId: user.external_id },
    data: {
      ...moneyEventData(input.project, wallet, input.amount, input.source, entry.id),
      balance: wallet.balance,
    },
    metadata: input.metadata,
  });
  return { ok: true, entry, wallet, event };
}

/** Appends the ledger entry of a deposit or charge, with the wallet's values after it. */
function writeEntry(
  tx: Transaction<DB>,
  input: DepositInput | ChargeInput,
  user: Pick<EndUser, 'id' | 'balance' | 'held'>,
  kind: 'deposit' | 'charge',
  amount: string,
): Promise<LedgerEntry> {
  return tx
    .insertInto('ledger_entries')
    .values({
      id: newId('act'),
      project_id: input.project.id,
      user_id: user.id,
      kind,
      amount,
      held_delta: '0',
      balance_after: user.balance,
      held_after: user.held,
      source: input.source,
      description: input.description ?? null,
      metadata: JSON.stringify(input.metadata ?? {}),
    })
    .returningAll()
    .executeTakeFirstOrThrow();
}

/** Works out why a debit was refused: unknown or disconnected user, or not enough available balance. */
export async function refusal(
  db: Kysely<DB>,
  projectId: string,
  externalId: string,
  required: string,
): Promise<PaywallRefusal> {
  const wallet = await findWallet(db, projectId, externalId);
  if (!wallet?.connected) return { ok: false, reason: 'not_connected', wallet };
  return { ok: false, reason: 'insufficient_balance', wallet, required: formatAmount(required) };
}

export interface ReverseInput {
  project: LedgerProject;
  externalId: string;
  /** What the provider took back (a refund or a dispute). */
  amount: string;
  source: string;
  trigger: Trigger;
  metadata?: Record<string, unknown> | undefined;
  description?: string | undefined;
}

export interface ReverseResult {
  /** What the wallet gave back: the amount, or the available balance when that is less. */
  debited: string;
  /** The rest, which the balance could not cover (the no-overspend rule keeps balance ≥ held). */
  uncollected: string;
  entry: LedgerEntry | undefined;
  wallet: WalletState | undefined;
  event: EventEnvelope | undefined;
}

/**
 * Takes back money a provider returned to the payer (refund, dispute), connected or not, as a `charge`
 * entry. Until negative balances ("debt") exist, at most the available balance is debited and the rest
 * is reported as uncollected, for the caller to record.
 */
export async function reverse(
  tx: Transaction<DB>,
  events: EventRecorder,
  input: ReverseInput,
): Promise<ReverseResult> {
  const wanted = new Money(input.amount);
  const current = await tx
    .selectFrom('end_users')
    .select(['id', 'balance', 'held'])
    .where('project_id', '=', input.project.id)
    .where('external_id', '=', input.externalId)
    .forUpdate()
    .executeTakeFirst();
  const available = current ? Money.max(new Money(current.balance).minus(current.held), 0) : new Money(0);
  const debit = Money.min(wanted, available);
  const uncollected = formatAmount(wanted.minus(debit));
  if (!current || debit.lte(0))
    return { debited: '0', uncollected, entry: undefined, wallet: undefined, event: undefined };
  const amount = formatForCurrency(debit, input.project.currency);
  const user = await tx
    .updateTable('end_users')
    .set({ balance: sql`balance - ${amount}::numeric`, updated_at: sql`now()` })
    .where('id', '=', current.id)
    .returning(['id', 'external_id', 'connected', 'balance', 'held'])
    .executeTakeFirstOrThrow();
  const entry = await writeEntry(tx, input, user, 'charge', formatAmount(debit.neg()));
  const wallet = walletOf(user);
  const event = await events.record(tx, {
    project: input.project,
    type: 'balance.charge.created',
    trigger: input.trigger,
    subject: { type: 'user', id: user.id, externalId: user.external_id },
    data: {
      ...moneyEventData(input.project, wallet, amount, input.source, entry.id),
      balance: wallet.balance,
    },
    metadata: input.metadata,
  });
  return { debited: amount, uncollected, entry, wallet, event };
}
