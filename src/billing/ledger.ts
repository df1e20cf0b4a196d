import { type Kysely, sql, type Transaction } from 'kysely';
import { newId } from '../core/ids.ts';
import { formatAmount, Money } from '../core/money.ts';
import type { DB, EndUser, Hold, LedgerEntry, Project } from '../db/schema.ts';
import type { EventEnvelope, EventRecorder } from '../events/outbox.ts';

/**
 * Where money moves. Every deposit, charge, hold and release is an append-only ledger entry written in
 * the same statement or transaction as the change of the wallet's cached `balance` and `held` columns,
 * so `balance = sum(amount)` and `held = sum(held_delta)` over a user's entries always hold.
 *
 * The database enforces the no-overspend rule itself (`CHECK (balance >= held AND held >= 0)`), and
 * every debit is conditional on `balance - held` covering it, so concurrent requests can never spend
 * more than the wallet holds.
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

function walletOf(row: Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'held'>): WalletState {
  return {
    userId: row.id,
    externalId: row.external_id,
    connected: row.connected,
    balance: formatAmount(row.balance),
    held: formatAmount(row.held),
    available: formatAmount(new Money(row.balance).minus(row.held)),
  };
}

/** Runs fn in the given transaction, or in a new one when db is not a transaction. */
async function inTransaction<T>(db: Kysely<DB>, fn: (tx: Transaction<DB>) => Promise<T>): Promise<T> {
  if (db.isTransaction) return fn(db as Transaction<DB>);
  return db.transaction().execute(fn);
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

function moneyEventData(
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

/**
 * Credits a wallet (creating the user when unknown) and records `balance.deposit.created`.
 * When db is an outer transaction, the caller calls `events.wake()` after committing it.
 */
export async function deposit(
  db: Kysely<DB>,
  events: EventRecorder,
  input: DepositInput,
): Promise<DepositResult> {
  const amount = new Money(input.amount);
  if (!amount.isFinite() || amount.lte(0))
    throw new Error(`deposit amount must be positive, got ${input.amount}`);
  const result = await inTransaction(db, async (tx) => {
    const userId = await ensureUser(tx, input.project.id, input.externalId);
    const user = await tx
      .updateTable('end_users')
      .set({ balance: sql`balance + ${input.amount}::numeric`, updated_at: sql`now()` })
      .where('id', '=', userId)
      .returning(['id', 'external_id', 'connected', 'balance', 'held'])
      .executeTakeFirstOrThrow();
    const entry = await tx
      .insertInto('ledger_entries')
      .values({
        id: newId('act'),
        project_id: input.project.id,
        user_id: user.id,
        kind: 'deposit',
        amount: input.amount,
        held_delta: '0',
        balance_after: user.balance,
        held_after: user.held,
        source: input.source,
        description: input.description ?? null,
        metadata: JSON.stringify(input.metadata ?? {}),
      })
      .returningAll()
      .executeTakeFirstOrThrow();
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
  });
  if (!db.isTransaction && result.event) events.wake();
  return result;
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
 * `balance.charge.created`. Refuses with `not_connected` or `insufficient_balance` otherwise.
 */
export async function charge(
  db: Kysely<DB>,
  events: EventRecorder,
  input: ChargeInput,
): Promise<ChargeResult> {
  const result = await inTransaction(db, async (tx): Promise<ChargeResult> => {
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
    const entry = await tx
      .insertInto('ledger_entries')
      .values({
        id: newId('act'),
        project_id: input.project.id,
        user_id: user.id,
        kind: 'charge',
        amount: formatAmount(new Money(input.amount).neg()),
        held_delta: '0',
        balance_after: user.balance,
        held_after: user.held,
        source: input.source,
        description: input.description ?? null,
        metadata: JSON.stringify(input.metadata ?? {}),
      })
      .returningAll()
      .executeTakeFirstOrThrow();
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
  });
  if (!db.isTransaction && result.ok && result.event) events.wake();
  return result;
}

/** Works out why a debit was refused: unknown or disconnected user, or not enough available balance. */
async function refusal(
  db: Kysely<DB>,
  projectId: string,
  externalId: string,
  required: string,
): Promise<PaywallRefusal> {
  const wallet = await findWallet(db, projectId, externalId);
  if (!wallet?.connected) return { ok: false, reason: 'not_connected', wallet };
  return { ok: false, reason: 'insufficient_balance', wallet, required: formatAmount(required) };
}

export interface HoldInput {
  projectId: string;
  externalId: string;
  amount: string;
  purpose: string;
  ttlSeconds: number;
}

export type HoldResult =
  | { ok: true; hold: { id: string; amount: string; userId: string }; wallet: WalletState }
  | PaywallRefusal;

/**
 * Reserves `amount` of a connected wallet's available balance, in one statement (one round trip on the
 * request's hot path): the wallet update, the hold row and the `hold` ledger entry commit together.
 */
export async function placeHold(db: Kysely<DB>, input: HoldInput): Promise<HoldResult> {
  const holdId = newId('hold');
  const entryId = newId('act');
  const amount = formatAmount(input.amount);
  const { rows } = await sql<Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'held'>>`
    WITH u AS (
      UPDATE end_users SET held = held + ${amount}::numeric, updated_at = now()
      WHERE project_id = ${input.projectId} AND external_id = ${input.externalId}
        AND connected AND balance - held >= ${amount}::numeric
      RETURNING id, external_id, connected, balance, held
    ), h AS (
      INSERT INTO holds (id, project_id, user_id, amount, status, purpose, expires_at)
      SELECT ${holdId}, ${input.projectId}, u.id, ${amount}::numeric, 'open', ${input.purpose},
             now() + make_interval(secs => ${input.ttlSeconds})
      FROM u
    ), l AS (
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, held_delta, balance_after, held_after, hold_id, source)
      SELECT ${entryId}, ${input.projectId}, u.id, 'hold', 0, ${amount}::numeric, u.balance, u.held, ${holdId}, ${input.purpose}
      FROM u
    )
    SELECT id, external_id, connected, balance, held FROM u
  `.execute(db);
  const user = rows[0];
  if (!user) return refusal(db, input.projectId, input.externalId, amount);
  return { ok: true, hold: { id: holdId, amount, userId: user.id }, wallet: walletOf(user) };
}

export interface SettleInput {
  project: LedgerProject;
  hold: { id: string; amount: string };
  /** The real cost; a cost above the hold is capped at the hold (never spend more than was reserved). */
  cost: string;
  source: string;
  trigger: Trigger;
  subjectExternalId: string;
  metadata?: Record<string, unknown> | undefined;
  description?: string | undefined;
}

export interface SettleResult {
  /** Amount actually charged (cost capped at the hold). */
  charged: string;
  entry: { id: string } | undefined;
  wallet: WalletState | undefined;
  event: EventEnvelope | undefined;
}

/**
 * Closes an open hold: charges the real cost (capped at the hold) and releases the rest, in one
 * statement. A zero cost is a plain release. Settling a hold that is no longer open (already settled or
 * expired by the sweeper) changes nothing and returns `entry: undefined`.
 */
export async function settleHold(
  db: Kysely<DB>,
  events: EventRecorder,
  input: SettleInput,
): Promise<SettleResult> {
  const cost = Money.min(new Money(input.cost), new Money(input.hold.amount));
  if (cost.lte(0)) {
    const wallet = await releaseHold(db, input.hold.id, 'released');
    return { charged: '0', entry: undefined, wallet, event: undefined };
  }
  const charged = formatAmount(cost);
  const entryId = newId('act');
  const wantsEvent = events.wants(input.project.id, 'balance.charge.created');
  const event = wantsEvent
    ? events.build({
        project: input.project,
        type: 'balance.charge.created',
        trigger: input.trigger,
        subject: { type: 'user', id: '', externalId: input.subjectExternalId },
        data: {},
        metadata: input.metadata,
      })
    : undefined;
  const { rows } = await sql<Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'held'>>`
    WITH h AS (
      UPDATE holds SET status = 'settled', closed_at = now()
      WHERE id = ${input.hold.id} AND status = 'open'
      RETURNING id, user_id, amount
    ), u AS (
      UPDATE end_users e SET balance = e.balance - ${charged}::numeric, held = e.held - h.amount, updated_at = now()
      FROM h WHERE e.id = h.user_id
      RETURNING e.id, e.external_id, e.connected, e.balance, e.held, h.amount AS hold_amount
    ), l AS (
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, held_delta, balance_after, held_after, hold_id, source, description, metadata)
      SELECT ${entryId}, ${input.project.id}, u.id, 'charge', -${charged}::numeric, -u.hold_amount, u.balance, u.held,
             ${input.hold.id}, ${input.source}, ${input.description ?? null}, ${JSON.stringify(input.metadata ?? {})}::jsonb
      FROM u
    ), ev AS (
      INSERT INTO events (id, project_id, type, version, envelope, created_at)
      SELECT ${event?.id ?? ''}, ${input.project.id}, 'balance.charge.created', ${event?.version ?? ''},
             jsonb_set(jsonb_set(${JSON.stringify(event ?? {})}::jsonb, '{subject,id}', to_jsonb(u.id)), '{data}',
               jsonb_build_object(
                 'paywallId', ${input.project.id}::text, 'ownerUserId', ${input.project.owner_user_id}::text,
                 'walletUserId', u.id, 'externalUserId', u.external_id, 'amount', ${charged}::text,
                 'currency', ${input.project.currency}::text, 'source', ${input.source}::text,
                 'activityId', ${entryId}::text, 'balance', trim_scale(u.balance)::text)),
             ${event?.createdAt ?? new Date().toISOString()}::timestamptz
      FROM u WHERE ${wantsEvent}
    )
    SELECT id, external_id, connected, balance, held FROM u
  `.execute(db);
  const user = rows[0];
  if (!user) return { charged: '0', entry: undefined, wallet: undefined, event: undefined };
  if (event) events.wake();
  return { charged, entry: { id: entryId }, wallet: walletOf(user), event };
}

/**
 * Releases an open hold in full (`released` by its request, `expired` by the sweeper). Returns the
 * wallet after the release, or undefined when the hold was not open any more.
 */
export async function releaseHold(
  db: Kysely<DB>,
  holdId: string,
  status: 'released' | 'expired',
): Promise<WalletState | undefined> {
  const entryId = newId('act');
  const { rows } = await sql<Pick<EndUser, 'id' | 'external_id' | 'connected' | 'balance' | 'held'>>`
    WITH h AS (
      UPDATE holds SET status = ${status}, closed_at = now()
      WHERE id = ${holdId} AND status = 'open'
      RETURNING id, project_id, user_id, amount, purpose
    ), u AS (
      UPDATE end_users e SET held = e.held - h.amount, updated_at = now()
      FROM h WHERE e.id = h.user_id
      RETURNING e.id, e.external_id, e.connected, e.balance, e.held, h.amount AS hold_amount, h.project_id, h.purpose
    ), l AS (
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, held_delta, balance_after, held_after, hold_id, source, description)
      SELECT ${entryId}, u.project_id, u.id, 'release', 0, -u.hold_amount, u.balance, u.held, ${holdId}, u.purpose, ${status}
      FROM u
    )
    SELECT id, external_id, connected, balance, held FROM u
  `.execute(db);
  const user = rows[0];
  return user ? walletOf(user) : undefined;
}

/** Releases every open hold past its expiry (their request's process died). Returns how many. */
export async function sweepExpiredHolds(db: Kysely<DB>, limit = 500): Promise<number> {
  const expired = await db
    .selectFrom('holds')
    .select('id')
    .where('status', '=', 'open')
    .where('expires_at', '<', sql<Date>`now()`)
    .orderBy('expires_at')
    .limit(limit)
    .execute();
  let released = 0;
  for (const { id } of expired) {
    if (await releaseHold(db, id, 'expired')) released++;
  }
  return released;
}

export type { Hold };
