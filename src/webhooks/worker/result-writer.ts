import type { Kysely } from 'kysely';
import type { DB } from '../../db/schema.ts';
import { type RecordItem, recordResults } from '../queue.ts';

/**
 * Writes attempt results in groups: whatever finished while the previous write ran goes into the next
 * one (one statement and one commit for many results). Each `write` resolves with whether the result
 * was recorded (false: the claim was lost to another worker after its lease ran out).
 */
export class ResultWriter {
  readonly #db: Kysely<DB>;
  readonly #maxBatch: number;
  #pending: Array<{ item: RecordItem; resolve: (ok: boolean) => void; reject: (err: unknown) => void }> = [];
  #writing: Promise<void> | undefined;

  constructor(db: Kysely<DB>, maxBatch = 500) {
    this.#db = db;
    this.#maxBatch = maxBatch;
  }

  write(item: RecordItem): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.#pending.push({ item, resolve, reject });
      this.#kick();
    });
  }

  /** Resolves once everything handed in so far is written. */
  async idle(): Promise<void> {
    while (this.#writing) await this.#writing;
  }

  #kick(): void {
    if (this.#writing || this.#pending.length === 0) return;
    this.#writing = (async () => {
      while (this.#pending.length) {
        const batch = this.#pending.splice(0, this.#maxBatch);
        try {
          const recorded = await recordResults(
            this.#db,
            batch.map((b) => b.item),
          );
          for (const b of batch) b.resolve(recorded.has(b.item.delivery.id));
        } catch (err) {
          for (const b of batch) b.reject(err);
        }
      }
    })().finally(() => {
      this.#writing = undefined;
      this.#kick();
    });
  }
}
