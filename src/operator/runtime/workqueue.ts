/**
 * A keyed work queue in the style of client-go's: a key waits in the queue at most once however often it
 * is added; a key being processed is never handed to a second worker — added again meanwhile, it is
 * queued once more when the first worker is done. Failed keys come back after an exponential backoff.
 */
export interface WorkQueueOptions {
  /** First retry delay of a failing key. */
  baseDelayMs?: number;
  /** Cap of the retry delay. */
  maxDelayMs?: number;
}

export class WorkQueue {
  readonly #baseDelayMs: number;
  readonly #maxDelayMs: number;
  readonly #queue: string[] = [];
  /** Keys waiting to be processed (queued, or re-added while processing). */
  readonly #dirty = new Set<string>();
  readonly #processing = new Set<string>();
  readonly #failures = new Map<string, number>();
  readonly #timers = new Map<string, { at: number; timer: NodeJS.Timeout }>();
  #waiters: Array<(key: string | undefined) => void> = [];
  #shutDown = false;

  constructor(options: WorkQueueOptions = {}) {
    this.#baseDelayMs = options.baseDelayMs ?? 200;
    this.#maxDelayMs = options.maxDelayMs ?? 60_000;
  }

  get length(): number {
    return this.#queue.length;
  }

  get shuttingDown(): boolean {
    return this.#shutDown;
  }

  add(key: string): void {
    if (this.#shutDown || this.#dirty.has(key)) return;
    this.#dirty.add(key);
    if (this.#processing.has(key)) return;
    const waiter = this.#waiters.shift();
    if (waiter) {
      this.#dirty.delete(key);
      this.#processing.add(key);
      waiter(key);
    } else {
      this.#queue.push(key);
    }
  }

  /** Adds the key after a delay; an earlier pending delay for the same key wins. */
  addAfter(key: string, delayMs: number): void {
    if (this.#shutDown) return;
    if (delayMs <= 0) {
      this.add(key);
      return;
    }
    const at = Date.now() + delayMs;
    const pending = this.#timers.get(key);
    if (pending && pending.at <= at) return;
    if (pending) clearTimeout(pending.timer);
    const timer = setTimeout(() => {
      this.#timers.delete(key);
      this.add(key);
    }, delayMs);
    timer.unref();
    this.#timers.set(key, { at, timer });
  }

  /** Requeues a failed key with exponential backoff; returns the delay chosen. */
  addRateLimited(key: string): number {
    const failures = (this.#failures.get(key) ?? 0) + 1;
    this.#failures.set(key, failures);
    const delay = this.backoff(failures);
    this.addAfter(key, delay);
    return delay;
  }

  backoff(failures: number): number {
    return Math.min(this.#maxDelayMs, this.#baseDelayMs * 2 ** Math.min(failures - 1, 30));
  }

  failures(key: string): number {
    return this.#failures.get(key) ?? 0;
  }

  /** Clears the failure count of a key that succeeded. */
  forget(key: string): void {
    this.#failures.delete(key);
  }

  /** The next key to process, or undefined once the queue is shut down. */
  get(): Promise<string | undefined> {
    if (this.#shutDown) return Promise.resolve(undefined);
    const key = this.#queue.shift();
    if (key !== undefined) {
      this.#dirty.delete(key);
      this.#processing.add(key);
      return Promise.resolve(key);
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** Marks a key finished; re-queues it when it was added while being processed. */
  done(key: string): void {
    this.#processing.delete(key);
    if (this.#dirty.has(key)) {
      this.#dirty.delete(key);
      this.add(key);
    }
  }

  shutDown(): void {
    this.#shutDown = true;
    for (const { timer } of this.#timers.values()) clearTimeout(timer);
    this.#timers.clear();
    this.#queue.length = 0;
    this.#dirty.clear();
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) waiter(undefined);
  }
}
