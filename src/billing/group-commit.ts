/**
 * Group commit, as TigerBeetle batches transfers: work that arrives while a batch is in flight waits and
 * leaves together in the next one, as soon as the previous one returns. There is no timer: alone, a
 * request pays one round trip; under load, dozens share one.
 *
 * A batch never holds two items with the same key (a wallet): the second waits for the next batch, so
 * the batch's statement can treat its rows as independent. One queue per project keeps every batch
 * inside one project.
 */
export class GroupCommit<I, O> {
  readonly #run: (items: I[]) => Promise<O[]>;
  readonly #keyOf: (item: I) => string;
  readonly #max: number;
  #waiting: Array<Pending<I, O>> = [];
  #inFlight = false;

  /**
   * @param run runs one batch and returns one result per item, in order
   * @param keyOf items with equal keys never share a batch
   * @param max the most items in one batch
   */
  constructor(run: (items: I[]) => Promise<O[]>, keyOf: (item: I) => string, max = 512) {
    this.#run = run;
    this.#keyOf = keyOf;
    this.#max = max;
  }

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.#waiting.push({ item, resolve, reject });
      if (!this.#inFlight) this.#next();
    });
  }

  /** True when nothing is queued or in flight. */
  get idle(): boolean {
    return !this.#inFlight && this.#waiting.length === 0;
  }

  #next(): void {
    if (this.#waiting.length === 0) return;
    const batch: Array<Pending<I, O>> = [];
    const later: Array<Pending<I, O>> = [];
    const keys = new Set<string>();
    for (const pending of this.#waiting) {
      const key = this.#keyOf(pending.item);
      if (batch.length >= this.#max || keys.has(key)) later.push(pending);
      else {
        keys.add(key);
        batch.push(pending);
      }
    }
    this.#waiting = later;
    this.#inFlight = true;
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
        this.#inFlight = false;
        this.#next();
      });
  }
}

interface Pending<I, O> {
  item: I;
  resolve(value: O): void;
  reject(err: unknown): void;
}
