import type { Logger } from 'pino';
import type { Bus } from '../bus/index.ts';
import { newId } from '../core/ids.ts';

/**
 * Reclaims: how pods ask each other, on the bus, to give their slices of wallets back (escrow.ts). A
 * pod that needs a wallet's balance publishes an ask naming the wallets and the pods holding slices of
 * them, and waits (at most the timeout) until each has answered; a pod asked gives its slices of those
 * wallets back, then answers — also when it holds nothing of them (any more), so the asker stops
 * waiting. A pod that does not answer (dead, or cut off) gets its slices taken back by the sweeper.
 */
export class Reclaims {
  readonly #bus: Bus;
  readonly #log: Logger;
  readonly #owner: string;
  readonly #timeoutMs: number;
  readonly #giveBack: (projectId: string, userIds: string[]) => Promise<void>;
  readonly #retire: (projectId: string, wallets: Wallet[]) => void;
  /** Reclaims this pod asked for, waiting for the owners' answers. */
  readonly #asked = new Map<string, { owners: Set<string>; done: () => void }>();
  #unsubscribe: Array<() => Promise<void>> = [];

  constructor(options: {
    bus: Bus;
    log: Logger;
    /** This pod, as slices name it (`holds.owner`). */
    owner: string;
    timeoutMs: number;
    /** Gives this pod's slices of the wallets back (their free part; all of a slice without requests). */
    giveBack: (projectId: string, userIds: string[]) => Promise<void>;
    /**
     * Suspends this pod's slices of the wallets at once (a debit outside the pods is waiting, with the
     * wallet locked): answered as soon as it returns, not once the slices are back.
     */
    retire: (projectId: string, wallets: Wallet[]) => void;
  }) {
    this.#bus = options.bus;
    this.#log = options.log;
    this.#owner = options.owner;
    this.#timeoutMs = options.timeoutMs;
    this.#giveBack = options.giveBack;
    this.#retire = options.retire;
  }

  /** Listens for other pods' asks and answers. */
  async start(): Promise<void> {
    this.#unsubscribe = await Promise.all([
      this.#bus.subscribe(RECLAIM, (message) => this.#onReclaim(message)),
      this.#bus.subscribe(RETURNED, (message) => this.#onReturned(message)),
    ]);
  }

  stop(): void {
    // Not awaited: with Redis unreachable an unsubscribe waits for a reconnect (the bus closes next anyway).
    for (const off of this.#unsubscribe) void off().catch(() => {});
  }

  /**
   * Asks `owners` (other pods) to give their slices of the wallets back; resolves once all answered, or
   * at the timeout. With `retire`, they suspend their slices of those wallets and answer at once (see
   * Escrow.retire).
   */
  async ask(projectId: string, userIds: string[], owners: string[], retire?: Wallet[]): Promise<void> {
    const id = newId('rcl');
    const waiting = new Set(owners);
    const answered = new Promise<void>((resolve) => {
      this.#asked.set(id, { owners: waiting, done: resolve });
    });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, this.#timeoutMs);
    });
    try {
      // (the publish is inside the time limit too: with Redis unreachable it waits for a reconnect)
      const asked = this.#bus.publish(
        RECLAIM,
        JSON.stringify({ id, projectId, userIds, from: this.#owner, ...(retire ? { retire } : {}) }),
      );
      const sent = asked.then(
        () => answered,
        (err: unknown) => this.#log.warn({ err }, 'could not ask the other pods to give their slices back'),
      );
      await Promise.race([sent, timeout]);
    } catch (err) {
      this.#log.warn({ err }, 'could not ask the other pods to give their slices back');
    } finally {
      clearTimeout(timer);
      this.#asked.delete(id);
    }
    if (waiting.size) {
      this.#log.info(
        { project: projectId, owners: [...waiting] },
        'pods holding slices of a wallet did not answer a reclaim (their slices come back through the sweeper)',
      );
    }
  }

  #onReclaim(message: string): void {
    let ask: { id: string; projectId: string; userIds: string[]; from: string; retire?: Wallet[] };
    try {
      ask = JSON.parse(message);
    } catch {
      return;
    }
    if (ask.from === this.#owner) return;
    if (ask.retire) {
      try {
        this.#retire(ask.projectId, ask.retire);
      } catch (err) {
        this.#log.error({ err }, 'suspending slices on a reclaim failed');
      }
      void this.#bus.publish(RETURNED, JSON.stringify({ id: ask.id, by: this.#owner })).catch(() => {});
      return;
    }
    // Answered even when this pod holds nothing of those wallets (any more): the asker stops waiting.
    void this.#giveBack(ask.projectId, ask.userIds)
      .catch((err) => this.#log.error({ err }, 'giving slices back on a reclaim failed'))
      .finally(() => {
        void this.#bus.publish(RETURNED, JSON.stringify({ id: ask.id, by: this.#owner })).catch(() => {});
      });
  }

  #onReturned(message: string): void {
    let answer: { id: string; by: string };
    try {
      answer = JSON.parse(message);
    } catch {
      return;
    }
    const asked = this.#asked.get(answer.id);
    if (!asked) return;
    asked.owners.delete(answer.by);
    if (!asked.owners.size) asked.done();
  }
}

/** A wallet as a retiring reclaim names it: its id, and its external id (a slice whose first take is in flight knows only that). */
export interface Wallet {
  userId: string;
  externalId: string;
}

const RECLAIM = 'escrow.reclaim';
const RETURNED = 'escrow.returned';
