import { AsyncLocalStorage } from 'node:async_hooks';
import { sql, type Transaction } from 'kysely';
import type { Logger } from 'pino';
import type { Bus } from '../bus/index.ts';
import { newId } from '../core/ids.ts';
import { formatAmount, fromUnits, Money, minUnits, toUnits } from '../core/money.ts';
import type { Database, DatabaseHandle } from '../db/index.ts';
import type { DB, ModelRow } from '../db/schema.ts';
import type { EventType } from '../events/catalog.ts';
import type { EventEnvelope, EventRecorder } from '../events/outbox.ts';
import type { Metrics } from '../metrics/registry.ts';
import { balanceEventEnvelopes } from './balance-events.ts';
import { Escrow } from './escrow.ts';
import {
  type ChargeInput,
  type ChargeResult,
  charge,
  type DepositInput,
  type DepositResult,
  deposit,
  expireGrants,
  type GrantInput,
  type GrantResult,
  grant,
  type LedgerProject,
  type PaywallRefusal,
  type ReverseInput,
  type ReverseResult,
  refusal,
  reverse,
  type Trigger,
  type WalletState,
  walletOf,
} from './ledger.ts';
import type { Reservation } from './slice.ts';
import { type SubscriptionAccess, subscriptionAccess } from './subscriptions.ts';

/**
 * The billing service: the one owner of every movement of money — holds, settles, releases, the
 * sweeper, deposits, charges and subscription fees — and of the effects that must follow a commit (the
 * event fan-out's wake-up, the money metrics), which run only after the change committed.
 *
 * The metered hot path holds through escrow (escrow.ts): a pod admits a wallet's requests from its
 * slice of the wallet's balance, taking (more of) a slice only when it does not cover a request, and
 * settles each request on its slice — both through group commit (group-commit.ts), durably.
 */
export class BillingService {
  readonly #database: DatabaseHandle;
  readonly #events: EventRecorder;
  readonly #metrics: Metrics;
  readonly #log: Logger;
  /** The pod's slices of wallets, from which it admits requests (escrow.ts). */
  readonly escrow: Escrow;
  /** Holds settled or released: a second settle of one hold changes nothing. */
  readonly #closedHolds = new WeakSet<Hold>();
  /** Effects waiting for the commit of a transaction opened by `transaction()`. */
  readonly #afterCommit = new WeakMap<Transaction<DB>, Array<() => void>>();
  /** Told of every committed debit (settle or charge): auto-recharge watches balances this way. */
  readonly #debitListeners: Array<(debit: WalletDebit) => void> = [];

  constructor(options: {
    database: DatabaseHandle;
    events: EventRecorder;
    metrics: Metrics;
    log: Logger;
    bus: Bus;
    escrow: { ttlSeconds: number; idleMs: number; sliceRequests: number; settleCommit: 'durable' | 'async' };
  }) {
    this.#database = options.database;
    this.#events = options.events;
    this.#metrics = options.metrics;
    this.#log = options.log;
    this.escrow = new Escrow({
      database: options.database,
      bus: options.bus,
      metrics: options.metrics,
      log: options.log,
      ...options.escrow,
    });
  }

  /** Starts the escrow's upkeep (reclaims from other pods, renewals, idle slices given back). */
  start(): Promise<void> {
    return this.escrow.start();
  }

  /** Gives this pod's slices back (shutdown, once no request is in flight). */
  async close(): Promise<void> {
    await this.idle();
    await this.escrow.close();
    await this.idle();
  }

  get #db(): Database {
    return this.#database.db;
  }

  // ---- the metered hot path ----

  /**
   * Reserves `amount` of a connected wallet's available balance for one request, or says why not (not
   * connected, or cannot pay): from this pod's slice of the wallet when it covers the amount (no
   * statement), else by taking more of it (escrow.ts).
   */
  async hold(input: HoldInput): Promise<HoldResult> {
    const amount = formatAmount(input.amount);
    const reserved = await this.escrow.reserve(
      input.project.id,
      input.externalId,
      amount,
      input.purpose,
      input.debtLimit ?? '0',
    );
    if (!reserved) return refusal(this.#db, input.project.id, input.externalId, amount);
    this.#metrics.holdsOpen.inc({ project: input.project.id });
    return {
      ok: true,
      hold: { id: reserved.sliceId, amount, userId: reserved.userId, projectId: input.project.id },
    };
  }

  /**
   * Closes a hold at the real cost — the provider's usage × the price, never capped: above the hold the
   * excess comes from the balance in the same statement, and what even the balance cannot cover leaves
   * the wallet below zero (a debt, with `balance.debt.created`) — with its ledger entry and its events
   * (the balance events the charge emits, balance-events.ts, and `completed` when given) in the same
   * transaction. Joins the project's next settle batch; resolves once it committed, so a read that
   * follows sees the charge. Retried after a transient failure: closing is idempotent (a hold no longer
   * open is left alone), so a retry after an ambiguous failure cannot charge twice.
   */
  async settle(input: SettleInput): Promise<SettleResult> {
    const { project, hold } = input;
    const cost = toUnits(input.cost);
    const charged = cost > 0n ? fromUnits(cost) : '0';
    const entryId = newId('act');
    const envelopes = this.#settleEvents(input, charged, entryId);
    if (this.#closedHolds.has(hold)) return { charged: '0', shortfall: '0', wallet: undefined };
    this.#closedHolds.add(hold);
    this.#metrics.holdsOpen.dec({ project: project.id });
    const row = await this.escrow.settle(reservationOf(hold), {
      charged,
      entryId,
      source: input.source,
      description: input.description,
      metadata: JSON.stringify({ ...input.metadata, holdAmount: hold.amount }),
      events: envelopes.length ? JSON.stringify(envelopes) : null,
      threshold: input.lowBalanceThreshold ?? null,
    });
    if (!row || row.charged === null || row.balance === null || row.reserved === null) {
      return { charged: '0', shortfall: '0', wallet: undefined };
    }
    const shortfall = this.#settled(input, row.charged, row.balance, row.reserved);
    if (envelopes.length) this.#events.wake();
    return {
      charged: formatAmount(row.charged),
      shortfall,
      wallet: walletOf({
        id: hold.userId,
        external_id: input.externalId,
        connected: true,
        balance: row.balance,
        reserved: row.reserved,
        granted: row.granted ?? '0',
      }),
    };
  }

  /**
   * The events a settle may write, that the project wants: the balance events of its charge (the
   * statement keeps those whose rule holds, and fills in their amounts) and `completed`.
   */
  #settleEvents(input: SettleInput, charged: string, entryId: string): EventEnvelope[] {
    const { project, hold } = input;
    const envelopes: EventEnvelope[] = [];
    if (charged !== '0') {
      const facts = {
        project,
        userId: hold.userId,
        externalId: input.externalId,
        amount: charged,
        source: input.source,
        activityId: entryId,
        holdAmount: hold.amount,
        trigger: input.trigger,
        metadata: input.metadata,
      };
      balanceEventEnvelopes(this.#events, facts, envelopes);
    }
    const completed = input.completed;
    if (completed && this.#events.wants(project.id, completed.type)) {
      envelopes.push(
        this.#events.build({
          project,
          type: completed.type,
          trigger: input.trigger,
          subject: { type: 'user', id: hold.userId, externalId: input.externalId },
          data: completed.data(charged),
        }),
      );
    }
    return envelopes;
  }

  /**
   * A settle committed: tells the debit listeners and counts the money (charged, above the hold, into
   * debt). Returns the part of the charge the balance did not cover.
   */
  #settled(input: SettleInput, charged: string, balance: string, reserved: string): string {
    const { project, hold } = input;
    const chargedUnits = toUnits(charged);
    if (chargedUnits <= 0n) return '0';
    const after = toUnits(balance);
    this.#debited({
      projectId: project.id,
      userId: hold.userId,
      externalId: input.externalId,
      available: fromUnits(after - toUnits(reserved)),
    });
    const labels = { project: project.id, model: input.model, currency: project.currency };
    this.#metrics.charged.inc({ ...labels, source: input.source }, Number(fromUnits(chargedUnits)));
    const overage = chargedUnits - toUnits(hold.amount);
    if (overage > 0n) this.#metrics.chargeOverage.inc(labels, Number(fromUnits(overage)));
    if (after >= 0n) return '0';
    const shortfall = minUnits(chargedUnits, -after);
    this.#metrics.debtCreated.inc(labels, Number(fromUnits(shortfall)));
    this.#log.info(
      { project: project.id, user: hold.userId, charged, debt: fromUnits(-after) },
      'a charge above its hold left the wallet below zero (debt)',
    );
    return fromUnits(shortfall);
  }

  /** Releases a hold in full (nothing was served, or the provider failed). */
  async release(hold: Hold): Promise<void> {
    if (this.#closedHolds.has(hold)) return;
    this.#closedHolds.add(hold);
    this.#metrics.holdsOpen.dec({ project: hold.projectId });
    await this.escrow.settle(reservationOf(hold), undefined);
  }

  /** Releases every slice past its expiry (its pod died). Returns how many. */
  sweep(limit = 500): Promise<number> {
    return this.escrow.sweep(limit);
  }

  /** Resolves when no statement of the hot path is queued or in flight (tests, shutdown). */
  async idle(): Promise<void> {
    while (!this.escrow.idle) await new Promise((resolve) => setImmediate(resolve));
  }

  // ---- deposits, charges, subscription fees ----

  /**
   * Runs `fn` in one transaction; the effects of the money moved inside it (through `deposit`, `charge`
   * and `subscription` given the transaction) run after it committed, never after a rollback.
   */
  async transaction<T>(fn: (tx: Transaction<DB>) => Promise<T>): Promise<T> {
    const effects: Array<() => void> = [];
    const result = await this.#db.transaction().execute((tx) => {
      effects.length = 0; // a fresh list per attempt
      this.#afterCommit.set(tx, effects);
      return fn(tx);
    });
    this.#runEffects(effects);
    return result;
  }

  /** Credits a wallet (creating the user when unknown); in `within` when given (see `transaction`). */
  deposit(input: DepositInput, within?: Transaction<DB>): Promise<DepositResult> {
    const labels = { project: input.project.id, currency: input.project.currency };
    return this.#crediting(
      within,
      input.amount,
      (tx) => deposit(tx, this.#events, input),
      (amount) => this.#metrics.deposited.inc(labels, amount),
    );
  }

  /**
   * Debits a connected wallet that can pay, or says why not; in `within` when given. A wallet that
   * cannot pay only because pods hold slices of it (escrow.ts) gets them back first: inside `withRoom`
   * (and always without `within`) the refusal rolls the transaction back, the slices are asked back,
   * and the work runs again.
   */
  async charge(input: ChargeInput & { model?: string }, within?: Transaction<DB>): Promise<ChargeResult> {
    if (!within && !room.getStore()) return this.withRoom(() => this.charge(input));
    return this.#moving(within, async (tx, after) => {
      const result = await charge(tx, this.#events, input);
      if (room.getStore()?.last === false && slicesInTheWay(result, input.amount)) {
        throw new SlicesInTheWay(input.project.id, result.wallet.userId);
      }
      if (result.ok) {
        after(() => {
          if (result.event) this.#events.wake();
          this.#debited({
            projectId: input.project.id,
            userId: result.wallet.userId,
            externalId: result.wallet.externalId,
            available: result.wallet.available,
          });
          this.#metrics.charged.inc(
            {
              project: input.project.id,
              model: input.model ?? '',
              currency: input.project.currency,
              source: input.source,
            },
            Number(input.amount),
          );
        });
      }
      return result;
    });
  }

  /** Grants credit to a wallet (creating the user when unknown); in `within` when given. */
  grant(input: GrantInput, within?: Transaction<DB>): Promise<GrantResult> {
    const labels = { project: input.project.id, currency: input.project.currency, reason: input.reason };
    return this.#crediting(
      within,
      input.amount,
      (tx) => grant(tx, this.#events, input),
      (amount) => this.#metrics.granted.inc(labels, amount),
    );
  }

  /** A credit (deposit or grant) in `within` or a transaction of its own; once committed, its event is sent and `count`ed. */
  #crediting<T extends { event: EventEnvelope | undefined }>(
    within: Transaction<DB> | undefined,
    amount: string,
    credit: (tx: Transaction<DB>) => Promise<T>,
    count: (amount: number) => void,
  ): Promise<T> {
    return this.#moving(within, async (tx, after) => {
      const result = await credit(tx);
      after(() => {
        if (result.event) this.#events.wake();
        count(Number(amount));
      });
      return result;
    });
  }

  /**
   * Takes the unspent rest of expired credit grants off their wallets (the grants job), in batches of
   * `batch` grants until none is due. Returns how many grants expired.
   */
  async expireGrants(batch = 500): Promise<number> {
    const trigger = { source: 'job', actorType: 'system', actorId: 'grant-expiry' };
    // A wallet expires once nothing is held: pods give their slices of wallets with grants due back first.
    const held = await this.#db
      .selectFrom('credit_grants as g')
      .innerJoin('end_users as e', 'e.id', 'g.user_id')
      .select(['e.project_id', 'e.id'])
      .distinct()
      .where('g.remaining', '>', '0')
      .where('g.expires_at', '<=', sql<Date>`now()`)
      .where('e.held', '>', '0')
      .limit(batch)
      .execute();
    const byProject = new Map<string, string[]>();
    for (const w of held) byProject.set(w.project_id, [...(byProject.get(w.project_id) ?? []), w.id]);
    for (const [projectId, userIds] of byProject) await this.escrow.reclaim(projectId, userIds);
    let total = 0;
    for (;;) {
      const expired = await this.transaction((tx) => expireGrants(tx, this.#events, batch, trigger));
      if (!expired.length) return total;
      total += expired.length;
      this.#events.wake();
      if (expired.length < batch) return total;
    }
  }

  /**
   * Takes back what a payment provider returned to the payer (a refund or a dispute), whole (see
   * `reverse` in ledger.ts: every pod's slice of the wallet is taken back before it commits); in
   * `within` when given.
   */
  async reverse(input: ReverseInput, within?: Transaction<DB>): Promise<ReverseResult> {
    return this.#moving(within, async (tx, after) => {
      const result = await reverse(tx, this.#events, input, (wallet) =>
        this.escrow.retire(input.project.id, wallet, tx),
      );
      // Not counted in the charge metrics: a reversal is money returned to the payer, not use.
      if (result.event) after(() => this.#events.wake());
      return result;
    });
  }

  /**
   * Subscription pricing: a connected user with a current period of the model is served free;
   * otherwise a new period starts by charging its fee (a top-up refusal when it cannot be paid).
   */
  async subscription(input: {
    project: LedgerProject;
    model: ModelRow;
    externalId: string;
    pricing: { fee: string; periodSeconds: number };
    trigger: Trigger;
  }): Promise<SubscriptionAccess> {
    return subscriptionAccess(this, this.#db, input);
  }

  /**
   * Runs `work` (a transaction that may charge); when a charge in it was refused only because pods hold
   * slices of the wallet, `work` has rolled back: the slices are asked back (outside any transaction:
   * the pods giving back lock the wallet) and `work` runs again — up to ROOM_ATTEMPTS times, the last
   * refusing for real. More than once, because a pod may take a new slice of what was given back before
   * the charge runs again (the billing property test found it: a hold's take on the same pod took the
   * whole balance between the give-back and the retry); each give-back leaves only the reservations of
   * requests in flight held.
   */
  async withRoom<T>(work: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await room.run({ last: attempt >= ROOM_ATTEMPTS }, work);
      } catch (err) {
        if (!(err instanceof SlicesInTheWay)) throw err;
        await this.escrow.reclaim(err.projectId, [err.userId]);
      }
    }
  }

  /**
   * Calls `listener` after every committed debit of a wallet (a settle that charged, or a charge), on
   * this process, synchronously: a listener that has work to do starts it in the background.
   */
  onDebit(listener: (debit: WalletDebit) => void): () => void {
    this.#debitListeners.push(listener);
    return () => {
      const i = this.#debitListeners.indexOf(listener);
      if (i >= 0) this.#debitListeners.splice(i, 1);
    };
  }

  #debited(debit: WalletDebit): void {
    for (const listener of this.#debitListeners) {
      try {
        listener(debit);
      } catch (err) {
        this.#log.error({ err }, 'a debit listener failed');
      }
    }
  }

  /** Registers an effect of `tx` (a transaction of `transaction()`), run after it commits. */
  afterCommit(tx: Transaction<DB>, effect: () => void): void {
    const effects = this.#afterCommit.get(tx);
    if (!effects) throw new Error('money moved in a transaction not opened by the billing service');
    effects.push(effect);
  }

  async #moving<T>(
    within: Transaction<DB> | undefined,
    work: (tx: Transaction<DB>, after: (effect: () => void) => void) => Promise<T>,
  ): Promise<T> {
    if (within) return work(within, (effect) => this.afterCommit(within, effect));
    return this.transaction((tx) => work(tx, (effect) => this.afterCommit(tx, effect)));
  }

  #runEffects(effects: Array<() => void>): void {
    for (const effect of effects) {
      try {
        effect();
      } catch (err) {
        this.#log.error({ err }, 'an effect after a money commit failed');
      }
    }
  }
}

/** A committed debit of a wallet, and the wallet's available balance after it. */
export interface WalletDebit {
  projectId: string;
  userId: string;
  externalId: string;
  available: string;
}

/** An open hold: what a request reserved. */
export interface Hold {
  id: string;
  amount: string;
  userId: string;
  projectId: string;
}

export interface HoldInput {
  project: Pick<LedgerProject, 'id'>;
  externalId: string;
  amount: string;
  /** The API (`chat`, `responses`, `embeddings`). */
  purpose: string;
  /**
   * How far below zero the wallet may go (the project's `debtLimit`; default '0'): a request is admitted
   * when balance + debtLimit − held covers it.
   */
  debtLimit?: string | undefined;
}

export type HoldResult = { ok: true; hold: Hold } | PaywallRefusal;

export interface SettleInput {
  project: LedgerProject;
  hold: Hold;
  /** The real cost (the provider's usage × the price); above the hold, the excess comes from the balance. */
  cost: string;
  /** The ledger entry's source (the API). */
  source: string;
  /** The model, for the money metrics. */
  model: string;
  trigger: Trigger;
  externalId: string;
  metadata: Record<string, unknown>;
  description: string;
  /** The project's `lowBalanceThreshold` (a user's own threshold overrides it). */
  lowBalanceThreshold?: string | undefined;
  /** An event recorded with the charge, built from the amount charged. */
  completed?: { type: EventType; data: (charged: string) => Record<string, unknown> };
}

export interface SettleResult {
  /** The amount charged ('0' when the hold was no longer open, or nothing was due). */
  charged: string;
  /** The part of the charge the balance did not cover (the debt it created; '0' mostly). */
  shortfall: string;
  /** The wallet after the charge, when this call closed the hold. */
  wallet: WalletState | undefined;
}

/** Inside `withRoom`: whether the work already ran once (a charge then refuses for real). */
const room = new AsyncLocalStorage<{ last: boolean }>();
/** How many times `withRoom` runs its work at most (see there). */
const ROOM_ATTEMPTS = 4;

/** A charge refused only because pods' slices hold the wallet's balance (see `withRoom`). */
class SlicesInTheWay extends Error {
  readonly projectId: string;
  readonly userId: string;
  constructor(projectId: string, userId: string) {
    super('pods hold slices of the wallet');
    this.projectId = projectId;
    this.userId = userId;
  }
}

/**
 * A refusal that the wallet's slices (its held amount) explain: the balance itself covers the amount.
 * Whatever `held` the wallet read after the refusal shows: a slice given back between the refused
 * update and that read leaves `held` at 0 with the balance covering the amount, and the charge must run
 * again then too (the property test found it: a charge refused on the slice owner while its give-back
 * committed).
 */
function slicesInTheWay(
  result: ChargeResult,
  amount: string,
): result is PaywallRefusal & { wallet: WalletState; reason: 'insufficient_balance' } {
  return (
    !result.ok &&
    result.reason === 'insufficient_balance' &&
    result.wallet !== undefined &&
    new Money(result.wallet.balance).gte(amount)
  );
}

function reservationOf(hold: Hold): Reservation {
  return { sliceId: hold.id, projectId: hold.projectId, userId: hold.userId, amount: hold.amount };
}
