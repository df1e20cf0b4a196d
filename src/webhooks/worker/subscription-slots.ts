import type { ClaimedDelivery } from '../queue.ts';

/**
 * The deliveries a worker holds, per subscription: at most `perSubscription` being sent at once, the
 * rest of what was claimed waiting in a short local queue. Since each subscription has one owning
 * worker at a time (see queue.ts), this bound holds for the receiver across all workers.
 */
export class SubscriptionSlots {
  readonly perSubscription: number;
  /** Deliveries of one subscription held at most (sending plus waiting): the claim's bound. */
  readonly claimedPerSubscription: number;
  readonly #sending = new Map<string, number>();
  readonly #waiting = new Map<string, ClaimedDelivery[]>();
  #held = 0;

  constructor(perSubscription: number, claimedPerSubscription = perSubscription * 4) {
    this.perSubscription = perSubscription;
    this.claimedPerSubscription = claimedPerSubscription;
  }

  /** Deliveries held (sending or waiting). */
  get held(): number {
    return this.#held;
  }

  /** Deliveries of a subscription held. */
  load(subscriptionId: string): number {
    return (this.#sending.get(subscriptionId) ?? 0) + (this.#waiting.get(subscriptionId)?.length ?? 0);
  }

  /** Takes a claimed delivery: true when it may be sent now, false when it waits for a slot. */
  admit(delivery: ClaimedDelivery): boolean {
    this.#held++;
    const sub = delivery.subscription_id;
    const sending = this.#sending.get(sub) ?? 0;
    if (sending < this.perSubscription) {
      this.#sending.set(sub, sending + 1);
      return true;
    }
    const queue = this.#waiting.get(sub) ?? [];
    queue.push(delivery);
    this.#waiting.set(sub, queue);
    return false;
  }

  /**
   * A delivery's request is over: frees its slot and returns the next waiting delivery of the same
   * subscription, which now holds that slot (to be sent), with whether this release took the
   * subscription below its claim bound (so the next claim takes it in again: claiming for it while it
   * is still at the bound would only come back empty).
   */
  release(subscriptionId: string): { next: ClaimedDelivery | undefined; roomAgain: boolean } {
    const roomAgain = this.load(subscriptionId) === this.claimedPerSubscription;
    this.#held--;
    const queue = this.#waiting.get(subscriptionId);
    const next = queue?.shift();
    if (queue && queue.length === 0) this.#waiting.delete(subscriptionId);
    if (!next) {
      const left = (this.#sending.get(subscriptionId) ?? 1) - 1;
      if (left > 0) this.#sending.set(subscriptionId, left);
      else this.#sending.delete(subscriptionId);
    }
    return { next, roomAgain };
  }

  /** A delivery handed out by `release` that will not be sent after all (the worker is stopping). */
  abandon(subscriptionId: string): void {
    this.#held--;
    const left = (this.#sending.get(subscriptionId) ?? 1) - 1;
    if (left > 0) this.#sending.set(subscriptionId, left);
    else this.#sending.delete(subscriptionId);
  }

  /** Subscriptions at their claim bound: the next claim leaves them out. */
  full(): string[] {
    return [...this.#sending.keys()].filter((sub) => this.load(sub) >= this.claimedPerSubscription);
  }

  /** Subscriptions with anything held: their ownership is renewed. */
  busy(): string[] {
    return [...this.#sending.keys()];
  }

  /** Takes every waiting delivery out (a worker stopping gives them back unsent). */
  drainWaiting(): ClaimedDelivery[] {
    const all = [...this.#waiting.values()].flat();
    this.#waiting.clear();
    this.#held -= all.length;
    return all;
  }
}
