import type { DatabaseHandle } from '../db/index.ts';
import type { Metrics } from '../metrics/registry.ts';
import { GroupCommit } from './group-commit.ts';
import {
  type ApplyItem,
  type ApplyRow,
  applyParameters,
  applySlices,
  NO_ROW,
  NOT_FOUND,
  type TakeItem,
  type TakeRow,
  takeParameters,
  takeSlices,
} from './statements.ts';

/**
 * The escrow's group-commit queues (escrow.ts): one of takes and one of slice changes per project, each
 * running its statement (statements.ts) over a batch, timed and counted.
 */
export class EscrowQueues {
  readonly #database: DatabaseHandle;
  readonly #metrics: Metrics;
  /** The pod, as its slices name it. */
  readonly #owner: string;
  readonly #ttlSeconds: number;
  /** Settles wait for the WAL flush (SETTLE_COMMIT=durable). */
  readonly #durable: boolean;
  readonly #takes = new Map<string, GroupCommit<TakeItem, TakeRow>>();
  readonly #applies = new Map<string, GroupCommit<ApplyItem, ApplyRow>>();

  constructor(options: {
    database: DatabaseHandle;
    metrics: Metrics;
    owner: string;
    ttlSeconds: number;
    durable: boolean;
  }) {
    this.#database = options.database;
    this.#metrics = options.metrics;
    this.#owner = options.owner;
    this.#ttlSeconds = options.ttlSeconds;
    this.#durable = options.durable;
  }

  /** True when no statement is queued or in flight. */
  get idle(): boolean {
    for (const q of this.#takes.values()) if (!q.idle) return false;
    for (const q of this.#applies.values()) if (!q.idle) return false;
    return true;
  }

  /** The project's queue of takes. */
  take(projectId: string): GroupCommit<TakeItem, TakeRow> {
    return (
      this.#takes.get(projectId) ??
      this.#newQueue(this.#takes, projectId, {
        statement: 'take',
        parallel: TAKE_PARALLEL,
        keyOf: (item) => item.externalId,
        run: (items) =>
          this.#database.run<TakeRow>(
            takeSlices,
            takeParameters(projectId, items, this.#owner, this.#ttlSeconds),
          ),
        missing: () => NOT_FOUND,
      })
    );
  }

  /** The project's queue of slice changes (settles, give-backs). */
  apply(projectId: string): GroupCommit<ApplyItem, ApplyRow> {
    return (
      this.#applies.get(projectId) ??
      this.#newQueue(this.#applies, projectId, {
        statement: 'apply',
        parallel: APPLY_PARALLEL,
        keyOf: (item) => item.userId,
        // Retried here, inside the batch, so a wallet's later changes never overtake a retried one.
        run: (items) =>
          retrying(() =>
            this.#database.run<ApplyRow>(
              applySlices,
              applyParameters(projectId, items, this.#durable ? 'on' : 'off'),
            ),
          ),
        missing: (item) => ({ ...NO_ROW, slice_id: item.sliceId }),
      })
    );
  }

  /** A project's group-commit queue of one statement: one row per item, by slice id (timed, counted). */
  #newQueue<I extends { sliceId: string }, R extends { slice_id: string }>(
    queues: Map<string, GroupCommit<I, R>>,
    projectId: string,
    batch: {
      statement: 'take' | 'apply';
      parallel: number;
      keyOf: (item: I) => string;
      run: (items: I[]) => Promise<R[]>;
      /** The row of an item the statement returned none for. */
      missing: (item: I) => R;
    },
  ): GroupCommit<I, R> {
    const { statement } = batch;
    const queue = new GroupCommit<I, R>(
      async (items) => {
        this.#metrics.billingBatchSize.observe({ statement }, items.length);
        const done = this.#metrics.billingBatchDuration.startTimer({ statement });
        const rows = await batch.run(items);
        done();
        const byId = new Map(rows.map((r) => [r.slice_id, r]));
        return items.map((i) => byId.get(i.sliceId) ?? batch.missing(i));
      },
      batch.keyOf,
      512,
      batch.parallel,
    );
    queues.set(projectId, queue);
    return queue;
  }
}

/**
 * Batches of one project in flight at once. Settles: one. Every request waiting while a settle batch is
 * in flight joins the next, so a batch grows with the load, and Postgres's cost per request falls with
 * the batch's size: on the 2-core bench machine one in flight against two and three cut Postgres's CPU
 * per request by 25–47 % and served more requests per second at concurrency 16 and 64, streaming and
 * not (bench/ab.ts; docs/benchmarks.md). Takes (a wallet's first request on a pod) are rarer and wait
 * before the first byte: two.
 */
const APPLY_PARALLEL = 1;
const TAKE_PARALLEL = 2;

/** Retries a statement after a transient database failure (it is idempotent). */
async function retrying<T>(work: () => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (attempt >= attempts) throw err;
      await new Promise((resolve) => setTimeout(resolve, 200 * attempt * attempt));
    }
  }
}
