import { type Kysely, sql, type Transaction } from 'kysely';
import { type Actor, recordAudit } from '../audit/index.ts';
import {
  ensureUser,
  findWallet,
  grant,
  type LedgerProject,
  type Trigger,
  type WalletState,
} from '../billing/ledger.ts';
import type { BillingService } from '../billing/service.ts';
import { formatForCurrency } from '../core/money.ts';
import type { Database, DB } from '../db/index.ts';
import type { CreditGrant, LedgerEntry } from '../db/schema.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { connectReply, type LinkSettings, topupReply } from './links.ts';

/** A project as connecting needs it: its trial grant (`settings.trial`) when it has one. */
export type ProjectRef = Pick<ProjectContext, 'id' | 'owner_user_id'> &
  Partial<Pick<ProjectContext, 'currency' | 'settings'>>;

export interface ConnectionChange {
  wallet: WalletState;
  /** False when the user already was in the requested state (nothing changed, no event). */
  changed: boolean;
}

type ConnectionSetter = (
  db: Kysely<DB>,
  events: EventRecorder,
  project: ProjectRef,
  externalId: string,
  trigger: Trigger,
) => Promise<ConnectionChange>;

/**
 * Connects a user to the paywall (creating the user when unknown); emits `user.connected` on a change.
 * When db is an outer transaction, the caller calls `events.wake()` after committing it.
 */
export const connectUser: ConnectionSetter = (db, events, project, externalId, trigger) =>
  setConnected(db, events, project, externalId, true, trigger);

/** Disconnects a user; emits `user.disconnected` on a change. The wallet keeps its balance. */
export const disconnectUser: ConnectionSetter = (db, events, project, externalId, trigger) =>
  setConnected(db, events, project, externalId, false, trigger);

async function inTransaction<T>(db: Kysely<DB>, fn: (tx: Transaction<DB>) => Promise<T>): Promise<T> {
  if (db.isTransaction) return fn(db as Transaction<DB>);
  return db.transaction().execute(fn);
}

/**
 * The project's trial grant, given once per end user, ever: on their first connect (a user who
 * disconnects and connects again gets none). In the connect's transaction.
 */
async function giveTrial(
  tx: Transaction<DB>,
  events: EventRecorder,
  project: ProjectRef,
  userId: string,
  externalId: string,
  trigger: Trigger,
): Promise<void> {
  const trial = project.settings?.trial;
  if (!trial || !project.currency) return;
  const first = await tx
    .updateTable('end_users')
    .set({ trial_granted_at: sql`now()` })
    .where('id', '=', userId)
    .where('trial_granted_at', 'is', null)
    .returning('id')
    .executeTakeFirst();
  if (!first) return;
  await grant(tx, events, {
    project: { id: project.id, owner_user_id: project.owner_user_id, currency: project.currency },
    externalId,
    amount: trial.amount,
    reason: 'trial',
    expiresAt: trial.expiresInDays ? new Date(Date.now() + trial.expiresInDays * 86_400_000) : undefined,
    source: 'trial',
    trigger,
  });
}

async function setConnected(
  db: Kysely<DB>,
  events: EventRecorder,
  project: ProjectRef,
  externalId: string,
  connected: boolean,
  trigger: Trigger,
): Promise<ConnectionChange> {
  const result = await inTransaction(db, async (tx) => {
    const userId = await ensureUser(tx, project.id, externalId);
    const updated = await tx
      .updateTable('end_users')
      .set({ connected, connected_at: connected ? sql`now()` : null, updated_at: sql`now()` })
      .where('id', '=', userId)
      .where('connected', '=', !connected)
      .returning('id')
      .executeTakeFirst();
    if (updated) {
      await events.record(tx, {
        project,
        type: connected ? 'user.connected' : 'user.disconnected',
        trigger,
        subject: { type: 'user', id: userId, externalId },
        data: { walletUserId: userId, externalUserId: externalId },
      });
      if (connected) await giveTrial(tx, events, project, userId, externalId, trigger);
    }
    const wallet = (await findWallet(tx, project.id, externalId))!;
    return { wallet, changed: Boolean(updated) };
  });
  if (result.changed && !db.isTransaction) events.wake();
  return result;
}

// ---- what the API returns ----

type ApiProject = Pick<ProjectContext, 'id' | 'name' | 'owner_user_id' | 'currency' | 'settings'>;

/** The balance of a user as the API shows it; an unknown user is a disconnected one with nothing. */
export function balanceView(
  project: Pick<ProjectContext, 'currency'>,
  externalId: string,
  wallet?: WalletState,
) {
  const money = (v: string) => formatForCurrency(v, project.currency);
  return {
    object: 'user.balance' as const,
    user: externalId,
    connected: wallet?.connected ?? false,
    balance: money(wallet?.balance ?? '0'),
    held: money(wallet?.held ?? '0'),
    available: money(wallet?.available ?? '0'),
    /** The paid part of the balance, and the credit grants' part. */
    paid: money(wallet?.paid ?? '0'),
    credits: money(wallet?.granted ?? '0'),
    currency: project.currency,
  };
}

// ---- credit grants ----

export interface GrantRequest {
  user: string;
  amount: string;
  reason: string;
  priority?: number | undefined;
  expiresAt?: string | undefined;
  metadata?: Record<string, unknown> | undefined;
}

/** One credit grant as the API shows it. */
export function grantView(project: Pick<ProjectContext, 'currency'>, externalId: string, g: CreditGrant) {
  const money = (v: string) => formatForCurrency(v, project.currency);
  return {
    id: g.id,
    object: 'credit_grant' as const,
    user: externalId,
    amount: money(g.amount),
    remaining: money(g.remaining),
    reason: g.reason,
    priority: g.priority,
    expiresAt: g.expires_at?.toISOString() ?? null,
    expired: g.expired_at !== null,
    expiredAmount: g.expired_amount === null ? null : money(g.expired_amount),
    currency: project.currency,
    metadata: g.metadata,
    createdAt: g.created_at.toISOString(),
  };
}

/**
 * Grants credit from the API (`POST /v1/user/credits`, the admin API, the CLI) inside the caller's
 * billing transaction; the response body.
 */
export async function grantFromApi(
  tx: Transaction<DB>,
  billing: BillingService,
  project: ApiProject,
  input: GrantRequest,
  source: string,
  trigger: Trigger,
  actor: Actor,
) {
  const result = await billing.grant(
    {
      ...moneyMove(project, input, source, trigger),
      reason: input.reason,
      priority: input.priority,
      expiresAt: input.expiresAt === undefined ? undefined : new Date(input.expiresAt),
    },
    tx,
  );
  await auditMove(tx, actor, project, 'credit.grant', input.user, {
    grant: result.grant.id,
    amount: input.amount,
    reason: input.reason,
    priority: input.priority ?? 0,
    expiresAt: input.expiresAt ?? null,
    metadata: input.metadata ?? {},
  });
  return {
    ...grantView(project, input.user, result.grant),
    balance: formatForCurrency(result.wallet.balance, project.currency),
  };
}

/**
 * A user's own low-balance threshold (`balance.low` when a charge takes the balance below it), over the
 * project's `lowBalanceThreshold`; `null` goes back to the project's. Creates the user when unknown.
 */
export async function setLowBalanceThreshold(
  db: Database,
  project: ApiProject,
  externalId: string,
  threshold: string | null,
) {
  const userId = await ensureUser(db, project.id, externalId);
  await db
    .updateTable('end_users')
    .set({ low_balance_threshold: threshold, updated_at: sql`now()` })
    .where('id', '=', userId)
    .execute();
  return getAlerts(db, project, externalId);
}

/** The low-balance threshold in force for a user: their own, else the project's, else none. */
export async function getAlerts(db: Database, project: ApiProject, externalId: string) {
  const row = await db
    .selectFrom('end_users')
    .select('low_balance_threshold')
    .where('project_id', '=', project.id)
    .where('external_id', '=', externalId)
    .executeTakeFirst();
  const own = row?.low_balance_threshold ?? null;
  const threshold = own ?? project.settings.lowBalanceThreshold ?? null;
  return {
    object: 'user.alerts' as const,
    user: externalId,
    lowBalanceThreshold: threshold === null ? null : formatForCurrency(threshold, project.currency),
    source: own !== null ? ('user' as const) : threshold !== null ? ('project' as const) : null,
    currency: project.currency,
  };
}

/** A user's credit grants, newest first (at most 100). */
export async function listGrants(db: Database, project: ApiProject, externalId: string) {
  const wallet = await findWallet(db, project.id, externalId);
  const rows = wallet
    ? await db
        .selectFrom('credit_grants')
        .selectAll()
        .where('user_id', '=', wallet.userId)
        .orderBy('id', 'desc')
        .limit(100)
        .execute()
    : [];
  return { object: 'list' as const, data: rows.map((g) => grantView(project, externalId, g)) };
}

export async function getBalance(db: Database, project: ApiProject, externalId: string) {
  return balanceView(project, externalId, await findWallet(db, project.id, externalId));
}

/** One ledger entry as the activity list shows it. */
export function activityView(project: Pick<ProjectContext, 'currency'>, externalId: string, e: LedgerEntry) {
  return {
    id: e.id,
    object: 'user.activity' as const,
    user: externalId,
    type: e.kind,
    amount: formatForCurrency(e.amount, project.currency),
    heldDelta: formatForCurrency(e.held_delta, project.currency),
    balance: formatForCurrency(e.balance_after, project.currency),
    held: formatForCurrency(e.held_after, project.currency),
    currency: project.currency,
    source: e.source,
    description: e.description,
    holdId: e.hold_id,
    metadata: e.metadata,
    createdAt: e.created_at.toISOString(),
  };
}

/**
 * A user's ledger entries, newest first — in the order of their numbers (`seq`: the order in which they
 * changed the wallet, so each entry's balance is the next older one's plus its amount); `after` is the id
 * of the last entry of the previous page.
 */
export async function listActivity(
  db: Database,
  project: ApiProject,
  externalId: string,
  page: { limit: number; after?: string | undefined },
) {
  const wallet = await findWallet(db, project.id, externalId);
  if (!wallet) return { object: 'list' as const, data: [], has_more: false };
  let query = db
    .selectFrom('ledger_entries')
    .selectAll()
    .where('user_id', '=', wallet.userId)
    .orderBy('seq', 'desc')
    .limit(page.limit + 1);
  if (page.after) {
    const after = page.after;
    query = query.where('seq', '<', (eb) =>
      eb
        .selectFrom('ledger_entries')
        .select('seq')
        .where('user_id', '=', wallet.userId)
        .where('id', '=', after),
    );
  }
  const rows = await query.execute();
  const data = rows.slice(0, page.limit).map((e) => activityView(project, externalId, e));
  return {
    object: 'list' as const,
    data,
    has_more: rows.length > page.limit,
    first_id: data[0]?.id ?? null,
    last_id: data.at(-1)?.id ?? null,
  };
}

export interface MoneyRequest {
  user: string;
  amount: string;
  metadata?: Record<string, unknown> | undefined;
}

/**
 * Credits a wallet from the API (source `api`) inside the caller's billing transaction; the response
 * body of `POST /v1/user/balance/deposit`.
 */
export async function depositFromApi(
  tx: Transaction<DB>,
  billing: BillingService,
  project: ApiProject,
  input: MoneyRequest,
  trigger: Trigger,
  actor: Actor,
) {
  const result = await billing.deposit(moneyMove(project, input, 'api', trigger), tx);
  await auditMove(tx, actor, project, 'money.deposit', input.user, {
    entry: result.entry.id,
    amount: input.amount,
    metadata: input.metadata ?? {},
  });
  return {
    id: result.entry.id,
    object: 'deposit' as const,
    user: input.user,
    amount: input.amount,
    currency: project.currency,
    balance: formatForCurrency(result.wallet.balance, project.currency),
    metadata: input.metadata ?? {},
    createdAt: result.entry.created_at.toISOString(),
  };
}

/**
 * Debits a wallet from the API (source `api`) inside the caller's transaction; the response body of
 * `POST /v1/user/charge`. A refusal is `success: false` with a reason and the assistant message that
 * carries the connect or top-up link (the same links and messages chat replies with), and records
 * `auth.connection.required` or `limits.balance.insufficient`.
 */
export async function chargeFromApi(
  tx: Transaction<DB>,
  billing: BillingService,
  events: EventRecorder,
  project: ApiProject,
  input: MoneyRequest,
  trigger: Trigger,
  links: LinkSettings,
  actor: Actor,
) {
  const money = (v: string) => formatForCurrency(v, project.currency);
  const result = await billing.charge(
    {
      ...moneyMove(project, input, 'api', trigger),
      lowBalanceThreshold: project.settings.lowBalanceThreshold,
    },
    tx,
  );
  if (result.ok) {
    await auditMove(tx, actor, project, 'money.charge', input.user, {
      entry: result.entry.id,
      amount: input.amount,
      metadata: input.metadata ?? {},
    });
    return {
      success: true as const,
      charge: {
        id: result.entry.id,
        object: 'charge' as const,
        user: input.user,
        amount: input.amount,
        currency: project.currency,
        balance: money(result.wallet.balance),
        metadata: input.metadata ?? {},
        createdAt: result.entry.created_at.toISOString(),
      },
      balance: money(result.wallet.balance),
      currency: project.currency,
    };
  }
  const linkInput = { ...links, project, externalId: input.user };
  const subjectId = result.wallet?.userId ?? (await ensureUser(tx, project.id, input.user));
  const subject = { type: 'user', id: subjectId, externalId: input.user };
  let reply: { url: string; message: string };
  if (result.reason === 'not_connected') {
    reply = connectReply(linkInput);
    await events.record(tx, {
      project,
      type: 'auth.connection.required',
      trigger,
      subject,
      data: { model: null, operation: 'charge' },
      metadata: input.metadata,
    });
  } else {
    const available = money(result.wallet.available);
    reply = topupReply({ ...linkInput, required: input.amount, available, need: input.amount });
    await events.record(tx, {
      project,
      type: 'limits.balance.insufficient',
      trigger,
      subject,
      data: {
        model: null,
        operation: 'charge',
        required: input.amount,
        available,
        currency: project.currency,
      },
      metadata: input.metadata,
    });
  }
  billing.afterCommit(tx, () => events.wake());
  return {
    success: false as const,
    reason: result.reason,
    message: { role: 'assistant' as const, content: reply.message },
    url: reply.url,
    user: input.user,
    amount: input.amount,
    balance: money(result.wallet?.balance ?? '0'),
    available: money(result.wallet?.available ?? '0'),
    currency: project.currency,
  };
}

/** What every money move of the API gives the ledger: the wallet, the amount, the origin, the metadata. */
function moneyMove(project: ApiProject, input: MoneyRequest, source: string, trigger: Trigger) {
  return {
    project: ledgerProject(project),
    externalId: input.user,
    amount: input.amount,
    source,
    trigger,
    metadata: input.metadata,
  };
}

/** The audit entry of a money move on a user's wallet (a deposit, a charge, a grant). */
function auditMove(
  tx: Transaction<DB>,
  actor: Actor,
  project: ApiProject,
  action: string,
  user: string,
  after: Record<string, unknown>,
) {
  return recordAudit(tx, { actor, projectId: project.id, action, targetType: 'user', targetId: user, after });
}

function ledgerProject(project: ApiProject): LedgerProject {
  return { id: project.id, owner_user_id: project.owner_user_id, currency: project.currency };
}

export type { LinkSettings } from './links.ts';
export type { ApiProject };
