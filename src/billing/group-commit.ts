/**
 * Group commit, as TigerBeetle batches transfers: work that arrives while batches are in flight waits and
 * leaves together in the next one, as soon as one returns. There is no timer: alone, a request pays one
 * round trip; under load, dozens share one.
 *
 * Up to `parallel` batches are in flight at once (on as many database connections). An item never
 * shares a batch with, or overtakes, an earlier item of the same key (a wallet): it waits until the
 * earlier one's batch returned, so a batch's statement can treat its rows as independent and a wallet's
 * changes apply in order. One queue per project keeps every batch inside one project.
 */
export class GroupCommit<I, O> {
  readonly #run: (items: I[]) => Promise<O[]>;
  readonly #keyOf: (item: I) => string;
  readonly #max: number;
  readonly #parallel: number;
  #waiting: Array<Pending<I, O>> = [];
  #inFlight = 0;
  /** Keys of the items in the batches in flight. */
  readonly #busy = new Set<string>();

  /**
   * @param run runs one batch and returns one result per item, in order
   * @param keyOf items with equal keys never share a batch, nor overtake each other
   * @param max the most items in one batch
   * @param parallel the most batches in flight at once
   */
  constructor(run: (items: I[]) => Promise<O[]>, keyOf: (item: I) => string, max = 512, parallel = 1) {
    this.#run = run;
    this.#keyOf = keyOf;
    this.#max = max;
    this.#parallel = parallel;
  }

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.#waiting.push({ item, key: this.#keyOf(item), resolve, reject });
      if (this.#inFlight < this.#parallel) this.#next();
    });
  }

  /** True when nothing is queued or in flight. */
  get idle(): boolean {
    return this.#inFlight === 0 && this.#waiting.length === 0;
  }

  #next(): void {
    if (this.#waiting.length === 0) return;
    const batch: Array<Pending<I, O>> = [];
    const later: Array<Pending<I, O>> = [];
    const keys = new Set<string>();
    for (const pending of this.#waiting) {
      const key = pending.key;
      // a key in flight or already in this batch waits (and so do its later items: `keys` keeps it)
      if (batch.length >= this.#max || keys.has(key) || this.#busy.has(key)) {
        keys.add(key);
        later.push(pending);
      } else {
        keys.add(key);
        batch.push(pending);
      }
    }
    if (!batch.length) return;
    this.#waiting = later;
    this.#inFlight++;
    for (const pending of batch) this.#busy.add(pending.key);
    let work: Promise<O[]>;
    try {
      work = this.#run(batch.map((p) => p.item));
    } catch (err) {
      work = Promise.reject(err);
    }
    work
      .then(
        (results) => {
          for (let i = 0; i < batch.length; i++) batch[i]!.resolve(results[i]!);
        },
        (err: unknown) => {
          for (const pending of batch) pending.reject(err);
        },
      )
      .finally(() => {
        this.#inFlight--;
        for (const pending of batch) this.#busy.delete(pending.key);
        while (this.#inFlight < this.#parallel && this.#waiting.length) {
          const before = this.#inFlight;
          this.#next();
          if (this.#inFlight === before) break; // everything waiting is behind a key in flight
        }
      });
  }
}

interface Pending<I, O> {
  item: I;
  key: string;
  resolve(value: O): void;
  reject(err: unknown): void;
}
