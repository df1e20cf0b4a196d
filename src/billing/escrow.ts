import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { Bus } from '../bus/index.ts';
import { newId } from '../core/ids.ts';
import { fromUnits, maxUnits, minUnits, toUnits, type Units } from '../core/money.ts';
import type { DatabaseHandle } from '../db/index.ts';
import type { DB } from '../db/schema.ts';
import type { Metrics } from '../metrics/registry.ts';
import { EscrowQueues } from './escrow-queues.ts';
import { Reclaims } from './reclaims.ts';
import { type Reservation, Slice } from './slice.ts';
import {
  type ApplyItem,
  type ApplyRow,
  type ChargeRecord,
  expireSlices,
  renewSlices,
  type TakeRow,
} from './statements.ts';

/**
 * Escrow: how a pod admits a busy wallet's requests without a database round trip.
 *
 * A hold is a pod's *slice* of a wallet's available balance: one `holds` row, owned by the pod, reserved
 * (`end_users.held`) in one conditional statement (`takeSlices`) like any hold. The pod then admits that
 * wallet's requests from memory while the slice's free part (its amount less what its requests in
 * flight reserved) covers them, as a bank pre-authorises a card or TigerBeetle-style ledgers escrow.
 * Every request still pays exactly: its settle (`applySlices`, durable, before the response's last byte)
 * charges the provider's usage × the price and takes that much off the slice. A request that costs
 * nothing (a refusal upstream, a free answer) needs no statement at all.
 *
 * Nothing is overspent: requests in flight never reserve more than the slice, and the slice never more
 * than the wallet's available balance when it was taken; a charge above its request's reservation comes
 * from the balance in the same statement, as it did with a hold per request.
 *
 * A slice comes back (its rest returns to the available balance):
 * - when idle (`idleMs` without a request and none in flight; 0: as soon as its last request settles —
 *   then a slice is exactly a hold per request, shared by the wallet's concurrent requests);
 * - when another pod (or a charge, a grant expiry) needs the balance: it asks on the bus (`reclaim`,
 *   reclaims.ts), and every pod holding a slice of that wallet gives back its free part at once;
 * - on shutdown;
 * - when its pod died: a slice is renewed while its pod lives; the sweeper releases one not renewed
 *   within `ttlSeconds`.
 *
 * Slices are invisible outside the pod: every statement that changes a slice (a take, a settle, a
 * give-back) also writes what the slice's requests in flight reserve (`holds.reserved`, ordered by the
 * change's number), and moves the wallet's `reserved` — the held amount the API, the pages, the events and
 * auto-recharge show — by the difference; the last request of a slice to finish writes 0 even when it
 * costs nothing. A debit outside the pods that is not conditional on the balance (a refund, a dispute)
 * first retires every pod's slices of the wallet (`retire`), so none is served from after it.
 *
 * Every change of a slice carries the slice's next sequence number, and the changes of one wallet leave
 * in order (one group-commit queue keyed by wallet), so a statement retried after an ambiguous failure
 * applies each change once; a charge whose slice the sweeper took back still charges the wallet, once
 * (its ledger entry id).
 */
export class Escrow {
  /** This pod, as slices name it (`holds.owner`). */
  readonly owner = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  readonly #database: DatabaseHandle;
  readonly #metrics: Metrics;
  readonly #log: Logger;
  readonly #ttlSeconds: number;
  readonly #idleMs: number;
  readonly #sliceRequests: number;
  /** The slice admitting each wallet's next requests, by project and external user id. */
  readonly #current = new Map<string, Slice>();
  /** Every slice this pod holds (current, suspended or being given back), by id. */
  readonly #slices = new Map<string, Slice>();
  /** The group-commit queues of the take and apply statements, per project. */
  readonly #queues: EscrowQueues;
  /**
   * The last change submitted for each wallet (project, user id) until it is applied: a reclaim answers
   * only once the wallet's slices given back (and its settles) are in the database, also when the slice
   * was already closed in memory by an earlier give-back still in flight.
   */
  readonly #applying = new Map<string, Promise<void>>();
  /**
   * The give-back of each wallet's retired slices (a refund's `retire`), by wallet (project, user id),
   * until it is applied: this pod's own request refused meanwhile waits for it before it tries again.
   */
  readonly #retiring = new Map<string, Promise<void>>();
  /** Asks the other pods to give slices back, and answers their asks (the bus). */
  readonly #reclaims: Reclaims;
  readonly #timers: NodeJS.Timeout[] = [];
  #closed = false;

  constructor(options: {
    database: DatabaseHandle;
    bus: Bus;
    metrics: Metrics;
    log: Logger;
    /** A slice not renewed within this time (its pod died) is released by the sweeper. */
    ttlSeconds: number;
    /** A slice without requests this long comes back (0: when its last request settles). */
    idleMs: number;
    /** A slice is this many times the request that takes it (at most the available balance). */
    sliceRequests: number;
    /** `async`: a settle's commit does not wait for the WAL flush (see SETTLE_COMMIT). */
    settleCommit?: 'durable' | 'async';
    reclaimTimeoutMs?: number;
  }) {
    this.#database = options.database;
    this.#metrics = options.metrics;
    this.#log = options.log;
    this.#ttlSeconds = options.ttlSeconds;
    this.#idleMs = options.idleMs;
    this.#sliceRequests = Math.max(1, options.sliceRequests);
    this.#reclaims = new Reclaims({
      bus: options.bus,
      log: options.log,
      owner: this.owner,
      timeoutMs: options.reclaimTimeoutMs ?? 1000,
      giveBack: (projectId, userIds) => this.#shrink(projectId, new Set(userIds)),
      retire: (projectId, wallets) => this.#retire(projectId, wallets),
    });
    this.#queues = new EscrowQueues({
      database: options.database,
      metrics: options.metrics,
      owner: this.owner,
      ttlSeconds: options.ttlSeconds,
      durable: options.settleCommit !== 'async',
    });
  }

  /** Listens for other pods' reclaims and starts the renew and idle timers. */
  async start(): Promise<void> {
    await this.#reclaims.start();
    const renewEvery = Math.max(1000, (this.#ttlSeconds * 1000) / 3);
    this.#timers.push(setInterval(() => this.#tick(() => this.#renew()), renewEvery).unref());
    if (this.#idleMs > 0) {
      const idleEvery = Math.max(250, Math.min(this.#idleMs / 2, 5000));
      this.#timers.push(setInterval(() => this.#tick(() => this.#giveBackIdle()), idleEvery).unref());
    }
  }

  /** Gives every slice back (shutdown): call once no request is in flight. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const timer of this.#timers) clearInterval(timer);
    this.#reclaims.stop();
    await this.#giveBack([...this.#slices.values()].filter((s) => s.inFlight === 0));
  }

  /** Resolves when no statement of the escrow is queued or in flight. */
  get idle(): boolean {
    return this.#queues.idle;
  }

  /**
   * Reserves `amount` (canonical, as `formatAmount` writes it) for one request of the wallet: from this
   * pod's slice when it covers it, else by taking (more of) a slice in the database; asks the other pods
   * to give their slices of the wallet back before refusing. Resolves `undefined` when the wallet cannot pay (or is not connected).
   */
  async reserve(
    projectId: string,
    externalId: string,
    amount: string,
    purpose: string,
    debtLimit = '0',
  ): Promise<Reservation | undefined> {
    const key = walletKey(projectId, externalId);
    const need = toUnits(amount);
    let asked = false;
    let last: Slice | undefined;
    for (let attempt = 0; attempt < 8; attempt++) {
      let slice = this.#current.get(key);
      while (slice?.taking) {
        await slice.taking;
        slice = this.#current.get(key);
      }
      if (slice && slice.free >= need) {
        this.#metrics.escrowAdmissions.inc({ project: projectId, from: 'memory' });
        return slice.admit(amount, need);
      }
      if (!slice) {
        slice = new Slice(newId('hold'), projectId, externalId);
        this.#current.set(key, slice);
        this.#slices.set(slice.id, slice);
      }
      last = slice;
      const short = need - slice.free;
      const want = maxUnits(need * BigInt(this.#sliceRequests) - slice.free, short);
      let settled!: () => void;
      slice.taking = new Promise<void>((resolve) => {
        settled = resolve;
      });
      let row: TakeRow;
      const seq = ++slice.seq;
      const reserved = slice.reserved + need;
      try {
        row = await this.#queues.take(projectId).submit({
          externalId,
          need: fromUnits(short),
          want: fromUnits(want),
          sliceId: slice.id,
          purpose,
          debtLimit,
          seq: String(seq),
          reserved: fromUnits(reserved),
        });
      } catch (err) {
        this.#forget(slice);
        throw err;
      } finally {
        slice.taking = undefined;
        settled();
      }
      if (row.gone) {
        // The sweeper took this slice back (this pod looked dead): start a new one.
        this.#forget(slice);
        continue;
      }
      if (row.take !== null) {
        slice.wrote(seq, reserved);
        slice.taken = true;
        slice.debtLimit = debtLimit;
        slice.userId = row.user_id ?? slice.userId;
        slice.amount += toUnits(row.take);
        if (slice.free >= need) {
          this.#metrics.escrowAdmissions.inc({ project: projectId, from: 'database' });
          return slice.admit(amount, need);
        }
        // a charge above its reservation used the free part meanwhile, or the slice was given back
        await this.#closeIfDone(slice);
        continue;
      }
      await this.#closeIfDone(slice);
      // Refused: when more is held than this pod's slice, other pods' slices stand in the way — they
      // are asked back (found by a fresh query: the statement's snapshot may predate them), and once.
      if (asked || !row.user_id || toUnits(row.held ?? '0') <= slice.amount) return this.#refused(slice);
      asked = true;
      await this.reclaim(projectId, [row.user_id], { others: true });
    }
    return last && this.#refused(last);
  }

  /**
   * A request refused: a take that succeeded before it (whose request was not admitted after all) may
   * have written a reservation no request holds; it is written again, so the wallet's visible held
   * amount counts only requests in flight.
   */
  async #refused(slice: Slice): Promise<undefined> {
    if (this.#slices.has(slice.id) && slice.taken && !slice.taking && slice.written !== slice.reserved) {
      await this.#change(slice, 0n, false);
    }
    return undefined;
  }

  /**
   * The request that reserved `reservation` is done: `charge` (the provider's usage × the price, '0' for
   * none) comes off the slice and the balance. Resolves with the statement's row when one was needed,
   * once committed. `charge` carries what the settle statement records with a charge.
   */
  async settle(reservation: Reservation, charge: ChargeRecord | undefined): Promise<ApplyRow | undefined> {
    const slice = this.#slices.get(reservation.sliceId);
    const cost = charge ? toUnits(charge.charged) : 0n;
    if (!slice) {
      // Forgotten (a failed statement or the sweeper): the charge goes straight to the balance.
      if (!charge || cost <= 0n) return undefined;
      return this.#apply(reservation.projectId, {
        sliceId: reservation.sliceId,
        userId: reservation.userId,
        seq: '0',
        released: '0',
        close: false,
        reserved: '0',
        ...charge,
      });
    }
    slice.inFlight--;
    slice.reserved -= toUnits(reservation.amount);
    slice.lastUsed = Date.now();
    // The charge comes off the slice's free part (this request's reservation is free again), never off
    // the reservations of the slice's other requests in flight; above that it comes from the balance. A
    // suspended slice (given back) gives back all of its free part.
    const free = maxUnits(slice.unreserved, 0n);
    // A charge above the slice's free part takes the rest from the balance, which may then no longer cover
    // what the slice's other requests reserved: the slice admits no more (their reservations are given
    // back as they finish), and the wallet's next request asks the database.
    if (cost > free) this.#suspend(slice);
    let released = slice.suspended ? free : minUnits(cost, free);
    slice.amount -= released;
    const close = slice.inFlight === 0 && !slice.taking && this.#closesWhenDone(slice);
    if (close) {
      released += slice.amount;
      slice.amount = 0n;
      this.#forget(slice);
    }
    // Without a charge, a statement only when the slice closes or gives something back — or when its
    // last request in flight settled and the database still counts a reservation of the slice (the
    // wallet's visible held amount returns to what requests in flight reserved: 0).
    const stale = slice.inFlight === 0 && slice.written !== 0n;
    if (cost <= 0n && !close && released <= 0n && !stale) return undefined;
    const row = await this.#change(slice, released, close, charge && cost > 0n ? charge : NO_CHARGE);
    // Overdrawn (the charge went below what the wallet's slices hold, on any pod): every pod gives back
    // the free part of its slices of the wallet before this settle resolves, so none admits a request
    // from money the balance no longer has.
    if (row?.held && toUnits(row.balance!) + toUnits(slice.debtLimit) < toUnits(row.held)) {
      await this.reclaim(reservation.projectId, [row.user_id ?? slice.userId]);
    }
    return row;
  }

  /**
   * Applies the slice's next change (its sequence number taken now): `released` off it, `close`, `charge`,
   * and what its requests in flight reserve now.
   */
  #change(slice: Slice, released: Units, close: boolean, charge = NO_CHARGE): Promise<ApplyRow | undefined> {
    const seq = ++slice.seq;
    const reserved = close ? 0n : slice.reserved;
    slice.wrote(seq, reserved);
    return this.#apply(
      slice.projectId,
      {
        sliceId: slice.id,
        userId: slice.userId,
        seq: String(seq),
        released: fromUnits(released),
        close,
        reserved: fromUnits(reserved),
        ...charge,
      },
      slice,
    );
  }

  /** A slice without requests closes at once: no idle time, given back, or shutting down. */
  #closesWhenDone(slice: Slice): boolean {
    return this.#idleMs === 0 || slice.suspended || this.#closed;
  }

  /** Closes a slice left without requests or a take in flight when it closes when done. */
  async #closeIfDone(slice: Slice): Promise<void> {
    if (slice.inFlight > 0 || slice.taking) return;
    if (!slice.taken) this.#forget(slice);
    else if (this.#closesWhenDone(slice)) await this.#giveBack([slice]);
  }

  /**
   * Asks every pod holding a slice of these wallets to give its free part back, and waits for their
   * answers (at most the reclaim timeout): a charge, a grant expiry or another pod's request then sees
   * the wallet's whole available balance.
   */
  async reclaim(projectId: string, userIds: string[], options: { others?: boolean } = {}): Promise<void> {
    if (!userIds.length) return;
    // Asked for a request of this pod: this pod's own slices of the wallets being given back (retired by a
    // refund, or given back to another pod) stand in the way until that is applied — waited for first.
    if (options.others) await this.#ownChanges(projectId, userIds);
    const owners = await this.#database.db
      .selectFrom('holds')
      .select('owner')
      .distinct()
      .where('user_id', 'in', userIds)
      .where('status', '=', 'open')
      .where('amount', '>', '0')
      .execute();
    const list = owners
      .map((o) => o.owner)
      .filter((o): o is string => o !== null && !(options.others && o === this.owner));
    if (!list.length) return;
    const others = list.filter((o) => o !== this.owner);
    if (list.includes(this.owner)) await this.#shrink(projectId, new Set(userIds));
    if (others.length) await this.#reclaims.ask(projectId, userIds, others);
  }

  /**
   * Takes every pod's slices of a wallet back before a debit that does not come through a pod (a refund,
   * a dispute) commits: called with the wallet's row locked, in the debit's transaction. Each pod
   * suspends its slices of the wallet at once (it admits no more requests from them: the wallet's next
   * request takes a new slice, from the balance after the debit) and answers; what the slices held comes
   * back once the debit committed (their statements wait for the wallet's lock), the reservations of
   * requests in flight when they settle. Resolves once every pod holding a slice answered (at most the
   * reclaim timeout: a pod that does not answer gets its slices taken back by the sweeper).
   */
  async retire(
    projectId: string,
    wallet: { userId: string; externalId: string },
    tx: Kysely<DB>,
  ): Promise<void> {
    this.#retire(projectId, [wallet]);
    // (read in the debit's transaction: the embedded database has one connection)
    const owners = await tx
      .selectFrom('holds')
      .select('owner')
      .distinct()
      .where('user_id', '=', wallet.userId)
      .where('status', '=', 'open')
      .where('owner', '<>', this.owner)
      .execute();
    const others = owners.map((o) => o.owner).filter((o): o is string => o !== null);
    if (others.length) await this.#reclaims.ask(projectId, [wallet.userId], others, [wallet]);
  }

  /**
   * Suspends this pod's slices of these wallets (synchronously: no request is admitted from them once
   * this returns), then gives them back in the background (see `retire`).
   */
  #retire(projectId: string, wallets: Array<{ userId: string; externalId: string }>): void {
    const userIds = new Set(wallets.map((w) => w.userId));
    const externalIds = new Set(wallets.map((w) => w.externalId));
    const slices = [...this.#slices.values()].filter(
      (s) => s.projectId === projectId && (userIds.has(s.userId) || externalIds.has(s.externalId)),
    );
    for (const slice of slices) this.#suspend(slice);
    if (!slices.length) return;
    const done = this.#giveBack(slices).catch((err) =>
      this.#log.warn({ err }, 'giving retired slices back failed (the sweeper takes them)'),
    );
    for (const key of new Set(slices.map((s) => walletKey(projectId, s.userId)))) {
      this.#retiring.set(key, done);
      void done.then(() => {
        if (this.#retiring.get(key) === done) this.#retiring.delete(key);
      });
    }
  }

  /** Resolves once this pod's changes of these wallets submitted so far (and their retired slices' give-back) are applied. */
  async #ownChanges(projectId: string, userIds: string[]): Promise<void> {
    await Promise.all(userIds.map((userId) => this.#retiring.get(walletKey(projectId, userId))));
    await Promise.all(userIds.map((userId) => this.#applying.get(walletKey(projectId, userId))));
  }

  /** Gives back the free part of this pod's slices of these wallets (all of a slice without requests). */
  async #shrink(projectId: string, userIds: Set<string>): Promise<void> {
    // (a slice whose first take is still in flight does not know its wallet yet: it is waited for)
    const slices = [...this.#slices.values()].filter(
      (s) => s.projectId === projectId && (userIds.has(s.userId) || (s.userId === '' && s.taking)),
    );
    await this.#giveBack(slices);
    await Promise.all([...userIds].map((userId) => this.#applying.get(walletKey(projectId, userId))));
  }

  /** Gives back the free part of each slice (the whole slice, closed, when nothing is in flight). */
  async #giveBack(slices: Slice[]): Promise<void> {
    await Promise.all(
      slices.map(async (slice) => {
        while (slice.taking) await slice.taking;
        if (!slice.taken || !this.#slices.has(slice.id)) return;
        const close = slice.inFlight === 0;
        const released = close ? slice.amount : maxUnits(slice.unreserved, 0n);
        if (!close && released <= 0n) {
          await slice.applied; // what an earlier give-back released is back once this resolves
          return;
        }
        slice.amount -= released;
        if (close) this.#forget(slice);
        await this.#change(slice, released, close);
      }),
    );
  }

  async #giveBackIdle(): Promise<void> {
    const before = Date.now() - this.#idleMs;
    const idle = [...this.#slices.values()].filter(
      (s) => s.inFlight === 0 && !s.taking && (s.lastUsed <= before || s.suspended),
    );
    if (idle.length) await this.#giveBack(idle);
  }

  /**
   * Renews this pod's open slices; forgets those the sweeper took back. Slices suspended after a
   * database failure are given back once their requests are done (not renewed: the sweeper takes them
   * should the database stay away).
   */
  async #renew(): Promise<void> {
    const done = [...this.#slices.values()].filter((s) => s.suspended && s.inFlight === 0 && !s.taking);
    if (done.length) await this.#giveBack(done);
    const byProject = new Map<string, string[]>();
    for (const slice of this.#slices.values()) {
      if (slice.suspended || (slice.amount === 0n && slice.inFlight === 0)) continue;
      const ids = byProject.get(slice.projectId) ?? [];
      ids.push(slice.id);
      byProject.set(slice.projectId, ids);
    }
    for (const [projectId, ids] of byProject) {
      const rows = await this.#database.run<{ id: string }>(renewSlices, [projectId, ids, this.#ttlSeconds]);
      const open = new Set(rows.map((r) => r.id));
      for (const id of ids) {
        const slice = this.#slices.get(id);
        if (slice && !open.has(id) && !slice.taking) this.#forget(slice);
      }
    }
  }

  /**
   * Releases every slice past its expiry (its pod died or lost the database for longer than the time
   * to live). Returns how many.
   */
  async sweep(limit: number): Promise<number> {
    const expired = await this.#database.db
      .selectFrom('holds')
      .select(['id', 'project_id'])
      .where('status', '=', 'open')
      .where('expires_at', '<', new Date())
      .orderBy('expires_at')
      .limit(limit)
      .execute();
    const byProject = new Map<string, string[]>();
    for (const h of expired) byProject.set(h.project_id, [...(byProject.get(h.project_id) ?? []), h.id]);
    let released = 0;
    for (const [projectId, ids] of byProject) {
      released += (await this.#database.run(expireSlices, [projectId, ids])).length;
    }
    return released;
  }

  #tick(work: () => Promise<void>): void {
    if (this.#closed) return;
    work().catch((err) => this.#log.warn({ err }, 'escrow upkeep failed (retried at the next tick)'));
  }

  /** The slice admits no more requests (it is given back once those in flight are done). */
  #suspend(slice: Slice): void {
    slice.suspended = true;
    const key = walletKey(slice.projectId, slice.externalId);
    if (this.#current.get(key) === slice) this.#current.delete(key);
  }

  #forget(slice: Slice): void {
    const key = walletKey(slice.projectId, slice.externalId);
    if (this.#current.get(key) === slice) this.#current.delete(key);
    if (slice.inFlight === 0) this.#slices.delete(slice.id);
    else slice.suspended = true;
  }

  /**
   * The database failed under a slice change: stop admitting from memory (this pod's slices may no
   * longer be what it thinks), so the next requests ask the database (and get a 503 while it is down).
   */
  #suspendAll(): void {
    for (const slice of [...this.#slices.values()]) this.#suspend(slice);
  }

  async #apply(projectId: string, item: ApplyItem, slice?: Slice): Promise<ApplyRow | undefined> {
    try {
      const submitted = this.#queues.apply(projectId).submit(item);
      const applied = submitted.then(
        () => {},
        () => {},
      );
      const key = walletKey(projectId, item.userId);
      this.#applying.set(key, applied);
      void applied.then(() => {
        if (this.#applying.get(key) === applied) this.#applying.delete(key);
      });
      if (slice) slice.applied = applied;
      const row = await submitted;
      if (!row.open) {
        const slice = this.#slices.get(item.sliceId);
        if (slice) this.#forget(slice);
      }
      return row.balance === null ? undefined : row;
    } catch (err) {
      this.#suspendAll();
      throw err;
    }
  }
}

/** A wallet's key in the pod's maps: the project and the external id (current slices) or user id (changes). */
function walletKey(projectId: string, id: string): string {
  return `${projectId}\u0000${id}`;
}

/** A change that charges nothing (a slice given back, or a release). */
const NO_CHARGE: ChargeRecord = {
  charged: '0',
  entryId: '',
  source: '',
  description: null,
  metadata: '{}',
  events: null,
  threshold: null,
};
