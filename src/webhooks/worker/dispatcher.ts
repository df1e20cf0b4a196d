import type { Logger } from 'pino';
import type { Database } from '../../db/index.ts';
import type { Metrics } from '../../metrics/registry.ts';
import { type ClaimedDelivery, releaseClaim } from '../queue.ts';
import type { Completed } from './attempt.ts';
import { ResultWriter } from './result-writer.ts';
import type { SubscriptionSlots } from './subscription-slots.ts';

export interface DispatcherOptions {
  db: Database;
  log: Logger;
  metrics: Pick<Metrics, 'deliveries' | 'deliveryLatency' | 'deliveryAttempts'>;
  slots: SubscriptionSlots;
  /** One attempt (src/webhooks/worker/attempt.ts); never rejects on a failed send. */
  attempt(delivery: ClaimedDelivery): Promise<Completed>;
  /** A slot was given back; `roomAgain`: its subscription fell below its claim bound (the claim loop). */
  freed(roomAgain: boolean): void;
  /** A retry falls due in `ms`. */
  retryIn(ms: number): void;
}

/**
 * Sends the deliveries the claim loop hands over: at once when their subscription has a free slot, else
 * when one frees up. A slot is given back as soon as the answer is in; the result is written after (in
 * a group with others), then counted. Stopping (`halt`, then `finish`) gives back what was not sent.
 */
export class Dispatcher {
  readonly #o: DispatcherOptions;
  readonly #writer: ResultWriter;
  readonly #tasks = new Set<Promise<void>>();
  #halted = false;

  constructor(options: DispatcherOptions) {
    this.#o = options;
    this.#writer = new ResultWriter(options.db);
  }

  /** Takes a claimed delivery: sent now, or when a slot of its subscription frees up. */
  dispatch(d: ClaimedDelivery): void {
    if (this.#o.slots.admit(d)) this.#send(d);
  }

  /** From now on a freed slot is not filled again: the delivery waiting for it is given back. */
  halt(): void {
    this.#halted = true;
  }

  /**
   * Gives back the deliveries still waiting, lets requests in flight finish within `graceMs` (after
   * that `abort` ends them; they are retried later), and waits for their results to be written.
   */
  async finish(graceMs: number, abort: () => void): Promise<void> {
    this.halt();
    const unsent = this.#o.slots.drainWaiting();
    await Promise.allSettled(unsent.map((d) => releaseClaim(this.#o.db, d)));
    const inFlight = Promise.allSettled([...this.#tasks]);
    let timer: NodeJS.Timeout | undefined;
    const expired = await Promise.race([
      inFlight.then(() => false),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), graceMs);
      }),
    ]);
    clearTimeout(timer);
    if (expired) {
      abort();
      await inFlight;
    }
    await this.#writer.idle();
  }

  /** Sends one held delivery; its slot is given back as soon as the answer is in, the result written after. */
  #send(d: ClaimedDelivery): void {
    const task: Promise<void> = this.#o
      .attempt(d)
      .then(
        (completed) => {
          this.#freeSlot(d);
          return this.#record(completed);
        },
        (err) => {
          this.#freeSlot(d);
          throw err;
        },
      )
      .catch((err) => this.#o.log.error({ err, delivery: d.id }, 'delivery failed unexpectedly'))
      .finally(() => this.#tasks.delete(task));
    this.#tasks.add(task);
  }

  #freeSlot(d: ClaimedDelivery): void {
    const { slots } = this.#o;
    const { next, roomAgain } = slots.release(d.subscription_id);
    if (next) {
      if (!this.#halted) this.#send(next);
      else {
        slots.abandon(next.subscription_id);
        const give: Promise<void> = releaseClaim(this.#o.db, next)
          .catch(() => {})
          .finally(() => this.#tasks.delete(give));
        this.#tasks.add(give);
      }
    }
    this.#o.freed(roomAgain);
  }

  /** Records an attempt's result under its claim (in a group with others), then counts it. */
  async #record({ delivery: d, result }: Completed): Promise<void> {
    const { log, metrics } = this.#o;
    let recorded: boolean;
    try {
      recorded = await this.#writer.write({ delivery: d, result });
    } catch (err) {
      log.warn(
        { err, delivery: d.id },
        'could not record a delivery result; it is retried when its lease runs out',
      );
      return;
    }
    if (!recorded) {
      log.warn(
        { delivery: d.id, attempt: d.attempts },
        'delivery claim was taken over after its lease ran out; result dropped',
      );
      return;
    }
    metrics.deliveries.inc({ project: d.project_id, outcome: result.outcome });
    metrics.deliveryLatency.observe({ outcome: result.outcome }, result.durationMs / 1000);
    if (result.outcome === 'retry') this.#o.retryIn(result.retryInMs ?? 0);
    else metrics.deliveryAttempts.observe({ outcome: result.outcome }, d.attempts);
    log.debug(
      {
        delivery: d.id,
        subscription: d.subscription_id,
        attempt: d.attempts,
        outcome: result.outcome,
        status: result.status,
        error: result.error,
        ms: result.durationMs,
      },
      'webhook attempt',
    );
  }
}
