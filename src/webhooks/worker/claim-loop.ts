import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { DB } from '../../db/schema.ts';
import { type ClaimedDelivery, claimDue, type EnvelopeCache, releaseClaim } from '../queue.ts';
import { SerialLoop } from './serial-loop.ts';
import type { SubscriptionSlots } from './subscription-slots.ts';

export interface ClaimLoopOptions {
  db: Kysely<DB>;
  log: Logger;
  slots: SubscriptionSlots;
  envelopes: EnvelopeCache;
  /** This worker's identity in the ownership rows. */
  owner: string;
  /** Deliveries held at once (sending or waiting). */
  concurrency: number;
  leaseMs: number;
  ownerLeaseMs: number;
  /** Called with each claimed delivery. */
  dispatch(delivery: ClaimedDelivery): void;
}

/**
 * The claim loop: claims due deliveries in batches while this worker has room for them, leaving out
 * the subscriptions it already holds a full share of. It claims again when a slot frees up and more
 * due work may be there (the last claim was full, or a subscription left out has room again), and on
 * every wake-up.
 */
export class ClaimLoop {
  readonly #o: ClaimLoopOptions;
  readonly #loop: SerialLoop;
  /** Claims at least this many at once when triggered by a freed slot (batching). */
  readonly #minClaim: number;
  /** The last claim found less due work than it could take; set back by wake-ups. */
  #lastShort = false;
  #stopping = false;

  constructor(options: ClaimLoopOptions) {
    this.#o = options;
    this.#minClaim = Math.max(1, Math.min(8, Math.floor(options.concurrency / 4)));
    this.#loop = new SerialLoop(() => this.#run());
  }

  /** New work may be due (a wake-up, the poll, a retry falling due). */
  wake(): void {
    this.#lastShort = false;
    this.#loop.request();
  }

  /**
   * A held delivery finished: claim again when there is room and likely more work (the last claim was
   * full, or this subscription just fell below its claim bound, which the last claim left it out for).
   */
  freed(subscriptionRoomAgain: boolean): void {
    if (subscriptionRoomAgain) this.#lastShort = false;
    if (!this.#lastShort && this.#o.concurrency - this.#o.slots.held >= this.#minClaim) this.#loop.request();
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#loop.stop();
  }

  async #run(): Promise<void> {
    const { db, slots } = this.#o;
    try {
      while (!this.#stopping) {
        const want = Math.min(this.#o.concurrency - slots.held, 100);
        if (want <= 0) return;
        const batch = await claimDue(
          db,
          {
            limit: want,
            leaseMs: this.#o.leaseMs,
            perSubscription: slots.claimedPerSubscription,
            excludeSubscriptions: slots.full(),
            owner: this.#o.owner,
            ownerLeaseMs: this.#o.ownerLeaseMs,
          },
          this.#o.envelopes,
        );
        if (this.#stopping) {
          await Promise.allSettled(batch.map((d) => releaseClaim(db, d)));
          return;
        }
        for (const d of batch) this.#o.dispatch(d);
        this.#lastShort = batch.length < want;
        if (this.#lastShort) return;
      }
    } catch (err) {
      if (!this.#stopping) this.#o.log.warn({ err }, 'claiming deliveries failed; retrying at the next poll');
    }
  }
}
