/**
 * Runs an async body one at a time: a request while it runs makes it run once more afterwards, however
 * many requests came (the claim loop and the fan-out loop). Errors are the body's to handle.
 */
export class SerialLoop {
  readonly #body: () => Promise<void>;
  #running: Promise<void> | undefined;
  #again = false;
  #stopped = false;

  constructor(body: () => Promise<void>) {
    this.#body = body;
  }

  request(): void {
    if (this.#stopped) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#running = (async () => {
      do {
        this.#again = false;
        await this.#body();
      } while (this.#again && !this.#stopped);
    })().finally(() => {
      this.#running = undefined;
    });
  }

  /** No more runs; resolves when the current one ends. */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#running;
  }
}
