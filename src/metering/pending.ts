import type { Logger } from 'pino';

/**
 * The background work of metered requests — settles, releases, event writes — kept until it finishes, so
 * that `idle()` can wait for it (tests, shutdown). A failure is logged with the request it belongs to;
 * tracked work never rejects.
 */
export class Pending {
  readonly #log: Logger;
  readonly #work = new Set<Promise<unknown>>();

  constructor(log: Logger) {
    this.#log = log;
  }

  track(
    work: Promise<unknown>,
    x: { requestId: string; api: { name: string } },
    what: string,
  ): Promise<unknown> {
    const tracked = work
      .catch((err) => {
        this.#log.error({ err, requestId: x.requestId, what }, `${x.api.name} ${what} failed`);
      })
      .finally(() => this.#work.delete(tracked));
    this.#work.add(tracked);
    return tracked;
  }

  /** Resolves when every piece of work started so far (and any it started) has finished. */
  async idle(): Promise<void> {
    while (this.#work.size) await Promise.allSettled([...this.#work]);
  }
}
