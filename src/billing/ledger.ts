import { type Kysely, sql, type Transaction } from 'kysely';
import { newId } from '../core/ids.ts';
import { difference, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import type { CreditGrant, DB, EndUser, LedgerEntry, Project } from '../db/schema.ts';
import type { EventEnvelope, EventRecorder } from '../events/outbox.ts';
import { type ChargeFacts, recordBalanceEvents } from './balance-events.ts';

/**
 * The ledger's statements for deposits and charges, and the wallet reads. Only the billing service
 * (service.ts) calls them: it owns every movement of money and the effects after each commit.
 *
 * Every deposit and charge is an append-only ledger entry written in the same transaction as the change
 * of the wallet's cached `balance`, so `balance = sum(amount)` over a user's entries always holds. A
 * hold moves no money: it is a row of `holds` (statements.ts), and `held = sum(amount)` over the
 * wallet's open holds. Every hold and every charge of this file is conditional on `balance - held`
 * covering it, so concurrent requests are never admitted beyond the wallet's available balance. The
 * one movement that may take a wallet below zero is a metered settle whose provider-reported cost
 * exceeds its hold and the balance (statements.ts): that shortfall is a debt, recorded as the negative
 * balance of the charge's entry, and the wallet is refused until a deposit covers it.
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
  /** What the wallet can spend: paid money and unspent credit grants. */
  balance: string;
  /**
   * What the wallet's requests in flight reserved (`end_users.reserved`). The pods' slices of the wallet
   * (escrow.ts, `end_users.held`) are an implementation detail nobody outside a pod sees.
   */
  held: string;
  /** balance − held */
  available: string;
  /** The credit grants' part of the balance. */
  granted: string;
  /** The paid part of the balance (balance − granted; below zero in debt). */
  paid: string;
}

export type PaywallRefusal =
  | { ok: false; reason: 'not_connected'; wallet: WalletState | undefined }
  | { ok: false; reason: 'insufficient_balance'; wallet: WalletState; required: string };

export function walletOf(
  row: Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'reserved' | 'granted'>,
): WalletState {
  return {
    userId: row.id,
    externalId: row.external_id,
    connected: row.connected,
    balance: formatAmount(row.balance),
    held: formatAmount(row.reserved),
    available: difference(row.balance, row.reserved),
    granted: formatAmount(row.granted),
    paid: difference(row.balance, row.granted),
  };
}

/** The wallet columns `walletOf` reads. */
export const WALLET_COLUMNS = ['id', 'external_id', 'connected', 'balance', 'reserved', 'granted'] as const;

/**
 * The columns a movement's update returns: the wallet, its slices' `held` (the charge's condition) and
 * its entry number (`entries`, incremented by the same update: the new entry's `seq`).
 */
const MOVED_COLUMNS = [...WALLET_COLUMNS, 'held', 'entries'] as const;

/** The update of a movement that writes one ledger entry: the wallet's next entry number. */
const NEXT_ENTRY = { entries: sql<string>`entries + 1`, updated_at: sql<Date>`now()` };

export async function findWallet(
  db: Kysely<DB>,
  projectId: string,
  externalId: string,
): Promise<WalletState | undefined> {
  const row = await db
    .selectFrom('end_users')
    .select(WALLET_COLUMNS)
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

/** A movement of money of one wallet: a deposit, a charge or a reversal. */
export interface MoneyInput {
  project: LedgerProject;
  externalId: string;
  amount: string;
  source: string;
  trigger: Trigger;
  metadata?: Record<string, unknown> | undefined;
  description?: string | undefined;
}

export type DepositInput = MoneyInput;

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
  const { amount, user } = await credit(tx, input, 'deposit');
  const entry = await writeEntry(tx, input, user, 'deposit', input.amount);
  const wallet = walletOf(user);
  const subject = { type: 'user', id: user.id, externalId: user.external_id };
  const event = await events.record(tx, {
    project: input.project,
    type: 'balance.deposit.created',
    trigger: input.trigger,
    subject,
    data: moneyEventData(input.project, wallet, input.amount, input.source, entry.id),
    metadata: input.metadata,
  });
  // A deposit that brings a wallet in debt back to zero or above pays the debt off.
  const before = new Money(user.balance).minus(amount);
  const cleared =
    before.lt(0) && new Money(user.balance).gte(0)
      ? await events.record(tx, {
          project: input.project,
          type: 'balance.debt.cleared',
          trigger: input.trigger,
          subject,
          data: {
            ...moneyEventData(input.project, wallet, formatAmount(before.neg()), input.source, entry.id),
            balance: wallet.balance,
          },
          metadata: input.metadata,
        })
      : undefined;
  return { entry, wallet, event: event ?? cleared };
}

/**
 * Adds a positive amount to a wallet (creating the user when unknown): to the balance, and for a grant to
 * its granted part too. The one credit step of deposits and grants.
 */
async function credit(
  tx: Transaction<DB>,
  input: Pick<DepositInput, 'project' | 'externalId' | 'amount'>,
  kind: 'deposit' | 'grant',
) {
  const amount = new Money(input.amount);
  if (!amount.isFinite() || amount.lte(0))
    throw new Error(`${kind} amount must be positive, got ${input.amount}`);
  const userId = await ensureUser(tx, input.project.id, input.externalId);
  const user = await tx
    .updateTable('end_users')
    .set({
      balance: sql`balance + ${input.amount}::numeric`,
      ...(kind === 'grant' ? { granted: sql`granted + ${input.amount}::numeric` } : {}),
      ...NEXT_ENTRY,
    })
    .where('id', '=', userId)
    .returning(MOVED_COLUMNS)
    .executeTakeFirstOrThrow();
  return { amount, user };
}

export interface ChargeInput extends MoneyInput {
  /** The project's `lowBalanceThreshold` (a user's own threshold overrides it). */
  lowBalanceThreshold?: string | undefined;
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
    .set({ balance: sql`balance - ${input.amount}::numeric`, ...NEXT_ENTRY })
    .where('project_id', '=', input.project.id)
    .where('external_id', '=', input.externalId)
    .where('connected', '=', true)
    .where(sql<boolean>`balance - held >= ${input.amount}::numeric`)
    .returning([...MOVED_COLUMNS, 'low_balance_threshold'])
    .executeTakeFirst();
  if (!user) return refusal(tx, input.project.id, input.externalId, input.amount);
  // Credit grants are spent first (the wallet's row is locked by the update above).
  let grants: Array<{ grant: string; amount: string }> = [];
  if (new Money(user.granted).gt(0)) {
    grants = await drawGrants(tx, user.id, input.amount);
    const drawn = grants.reduce((sum, d) => sum.plus(d.amount), new Money(0));
    if (drawn.gt(0)) {
      const after = await tx
        .updateTable('end_users')
        .set({ granted: sql`granted - ${formatAmount(drawn)}::numeric` })
        .where('id', '=', user.id)
        .returning('granted')
        .executeTakeFirstOrThrow();
      user.granted = after.granted;
    }
  }
  const entry = await writeEntry(
    tx,
    grants.length ? { ...input, metadata: { ...input.metadata, grants } } : input,
    user,
    'charge',
    formatAmount(new Money(input.amount).neg()),
  );
  const event = await recordBalanceEvents(
    tx,
    events,
    chargeFacts(input, user, input.amount, entry.id),
    {
      charged: input.amount,
      balance: user.balance,
      reserved: user.reserved,
      threshold: user.low_balance_threshold ?? input.lowBalanceThreshold,
    },
    'charge',
  );
  return { ok: true, entry, wallet: walletOf(user), event };
}

/** The facts of a charge or reversal's balance events (balance-events.ts). */
function chargeFacts(
  input: MoneyInput,
  user: Pick<EndUser, 'id' | 'external_id'>,
  amount: string,
  activityId: string,
): ChargeFacts {
  return {
    project: input.project,
    userId: user.id,
    externalId: user.external_id,
    amount,
    source: input.source,
    activityId,
    holdAmount: '0',
    trigger: input.trigger,
    metadata: input.metadata,
  };
}

/** Draws `amount` from the user's grants (the caller holds the wallet's row lock); returns the draws. */
async function drawGrants(
  tx: Transaction<DB>,
  userId: string,
  amount: string,
): Promise<Array<{ grant: string; amount: string }>> {
  const { rows } = await sql<{ draws: Array<{ grant: string; amount: string }> }>`
    SELECT tollgate_draw_grants(${userId}, ${amount}::numeric) AS draws`.execute(tx);
  return rows[0]?.draws ?? [];
}

// ---- credit grants ----

export interface GrantInput {
  project: LedgerProject;
  externalId: string;
  amount: string;
  /** `promo`, `trial`, `goodwill`, … */
  reason: string;
  /** Spent first: higher first; default 0. */
  priority?: number | undefined;
  expiresAt?: Date | undefined;
  source: string;
  trigger: Trigger;
  metadata?: Record<string, unknown> | undefined;
}

export interface GrantResult {
  grant: CreditGrant;
  entry: LedgerEntry;
  wallet: WalletState;
  event: EventEnvelope | undefined;
}

/** Grants credit to a wallet (creating the user when unknown): a `grant` entry and `balance.credit.granted`. */
export async function grant(
  tx: Transaction<DB>,
  events: EventRecorder,
  input: GrantInput,
): Promise<GrantResult> {
  const { amount, user } = await credit(tx, input, 'grant');
  const userId = user.id;
  const grantId = newId('grant');
  const entry = await writeEntry(
    tx,
    {
      ...input,
      metadata: { ...input.metadata, grant: grantId, reason: input.reason },
      description: `${input.reason} credit${input.expiresAt ? `, expires ${input.expiresAt.toISOString()}` : ''}`,
    },
    user,
    'grant',
    formatAmount(amount),
  );
  const row = await tx
    .insertInto('credit_grants')
    .values({
      id: grantId,
      project_id: input.project.id,
      user_id: userId,
      amount: formatAmount(amount),
      remaining: formatAmount(amount),
      priority: input.priority ?? 0,
      reason: input.reason,
      expires_at: input.expiresAt ?? null,
      entry_id: entry.id,
      metadata: JSON.stringify(input.metadata ?? {}),
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  const wallet = walletOf(user);
  const event = await events.record(tx, {
    project: input.project,
    type: 'balance.credit.granted',
    trigger: input.trigger,
    subject: { type: 'user', id: user.id, externalId: user.external_id },
    data: {
      ...moneyEventData(input.project, wallet, formatAmount(amount), input.source, entry.id),
      grantId,
      reason: input.reason,
      priority: row.priority,
      expiresAt: row.expires_at ? row.expires_at.toISOString() : null,
      balance: wallet.balance,
    },
    metadata: input.metadata,
  });
  return { grant: row, entry, wallet, event };
}

export interface ExpiredGrant {
  grantId: string;
  projectId: string;
  userId: string;
  amount: string;
}

/**
 * Takes the unspent rest of expired grants off their wallets, each as a `grant_expiry` entry with
 * `balance.credit.expired` — at most `limit` grants, in one transaction. Wallets are locked (in id
 * order) before their grants are read, as a charge locks them before drawing, so an expiry never takes
 * what a concurrent charge already spent. A wallet with open holds is left for a later run (its
 * requests may be drawing on the grant); holds are settled or swept within `HOLD_TTL_SECONDS`.
 */
export async function expireGrants(
  tx: Transaction<DB>,
  events: EventRecorder,
  limit: number,
  trigger: Trigger,
): Promise<ExpiredGrant[]> {
  const due = await tx
    .selectFrom('credit_grants')
    .select('user_id')
    .where('remaining', '>', '0')
    .where('expires_at', '<=', sql<Date>`now()`)
    .orderBy('expires_at')
    .limit(limit)
    .execute();
  if (!due.length) return [];
  const wallets = await tx
    .selectFrom('end_users')
    .select(['id', 'project_id'])
    .where('id', 'in', [...new Set(due.map((d) => d.user_id))])
    .where('held', '=', '0')
    .orderBy('id')
    .forNoKeyUpdate()
    .execute();
  if (!wallets.length) return [];
  // With the wallets locked, this statement sees every charge that committed before it.
  const expired = await tx
    .updateTable('credit_grants')
    .set({ expired_amount: sql`remaining`, remaining: '0', expired_at: sql`now()` })
    .where(
      'user_id',
      'in',
      wallets.map((w) => w.id),
    )
    .where('remaining', '>', '0')
    .where('expires_at', '<=', sql<Date>`now()`)
    .returning(['id', 'project_id', 'user_id', 'expired_amount', 'reason'])
    .execute();
  const out: ExpiredGrant[] = [];
  for (const g of expired.sort((a, b) => (a.user_id < b.user_id ? -1 : a.user_id > b.user_id ? 1 : 0))) {
    const amount = formatAmount(g.expired_amount ?? '0');
    const user = await tx
      .updateTable('end_users')
      .set({
        balance: sql`balance - ${amount}::numeric`,
        granted: sql`granted - ${amount}::numeric`,
        ...NEXT_ENTRY,
      })
      .where('id', '=', g.user_id)
      .returning([...MOVED_COLUMNS, 'project_id'])
      .executeTakeFirstOrThrow();
    const project = await tx
      .selectFrom('projects')
      .select(['id', 'owner_user_id', 'currency'])
      .where('id', '=', g.project_id)
      .executeTakeFirstOrThrow();
    const entry = await writeEntry(
      tx,
      {
        project,
        externalId: user.external_id,
        amount,
        source: 'expiry',
        trigger,
        metadata: { grant: g.id, reason: g.reason },
        description: `${g.reason} credit expired`,
      },
      user,
      'grant_expiry',
      formatAmount(new Money(amount).neg()),
    );
    const wallet = walletOf(user);
    await events.record(tx, {
      project,
      type: 'balance.credit.expired',
      trigger,
      subject: { type: 'user', id: user.id, externalId: user.external_id },
      data: {
        ...moneyEventData(project, wallet, amount, 'expiry', entry.id),
        grantId: g.id,
        reason: g.reason,
        balance: wallet.balance,
      },
    });
    out.push({ grantId: g.id, projectId: g.project_id, userId: g.user_id, amount });
  }
  return out;
}

/**
 * Appends the ledger entry of a deposit or charge, with the wallet's values after it and its number
 * (`entries`, from the update that moved the money).
 */
function writeEntry(
  tx: Transaction<DB>,
  input: MoneyInput,
  user: Pick<EndUser, 'id' | 'balance' | 'reserved' | 'entries'>,
  kind: 'deposit' | 'charge' | 'grant' | 'grant_expiry',
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
      held_after: user.reserved,
      seq: user.entries,
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

/** A reversal: `amount` is what the provider took back (a refund or a dispute). */
export type ReverseInput = MoneyInput;

export interface ReverseResult {
  /** What the wallet gave back: the whole amount (below zero when the balance cannot cover it). */
  debited: string;
  /** Always '0': a reversal is debited whole (recorded for payments made before debts existed). */
  uncollected: string;
  entry: LedgerEntry | undefined;
  wallet: WalletState | undefined;
  event: EventEnvelope | undefined;
}

/**
 * Takes back money a provider returned to the payer (refund, dispute), connected or not, as a `charge`
 * entry of the whole amount: from the paid part of the balance (credit grants are not refundable
 * money), into debt when the balance cannot cover it (`balance.debt.created`; the user is then refused
 * until a deposit covers it).
 *
 * Unconditional, so it comes after the pods' slices of the wallet are taken back: with the wallet's row
 * locked, `retire` (Escrow.retire) stops every pod admitting requests from a slice the balance may no
 * longer cover, before the debit commits.
 */
export async function reverse(
  tx: Transaction<DB>,
  events: EventRecorder,
  input: ReverseInput,
  retire: (wallet: { userId: string; externalId: string }) => Promise<void>,
): Promise<ReverseResult> {
  const wanted = new Money(input.amount);
  const current = await tx
    .selectFrom('end_users')
    .select(['id', 'balance', 'held'])
    .where('project_id', '=', input.project.id)
    .where('external_id', '=', input.externalId)
    .forUpdate()
    .executeTakeFirst();
  if (!current || wanted.lte(0))
    return { debited: '0', uncollected: '0', entry: undefined, wallet: undefined, event: undefined };
  if (new Money(current.held).gt(0)) await retire({ userId: current.id, externalId: input.externalId });
  const amount = formatForCurrency(wanted, input.project.currency);
  const user = await tx
    .updateTable('end_users')
    .set({ balance: sql`balance - ${amount}::numeric`, ...NEXT_ENTRY })
    .where('id', '=', current.id)
    .returning(MOVED_COLUMNS)
    .executeTakeFirstOrThrow();
  const entry = await writeEntry(tx, input, user, 'charge', formatAmount(wanted.neg()));
  const event = await recordBalanceEvents(
    tx,
    events,
    chargeFacts(input, user, amount, entry.id),
    { charged: wanted, balance: user.balance, reserved: user.reserved, threshold: null },
    'reversal',
  );
  return { debited: amount, uncollected: '0', entry, wallet: walletOf(user), event };
}
