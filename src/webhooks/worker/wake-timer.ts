/**
 * Wakes the claim loop once at the earliest time asked for (a retry falling due): a later request while
 * an earlier one is set changes nothing. Stopped, it asks nothing more.
 */
export class WakeTimer {
  readonly #wake: () => void;
  #timer: NodeJS.Timeout | undefined;
  #at = Number.POSITIVE_INFINITY;
  #stopped = false;

  constructor(wake: () => void) {
    this.#wake = wake;
  }

  in(ms: number): void {
    if (this.#stopped) return;
    const at = Date.now() + ms;
    if (this.#timer && at >= this.#at) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#at = at;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#at = Number.POSITIVE_INFINITY;
      this.#wake();
    }, Math.max(ms, 0) + 5);
    this.#timer.unref();
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
  }
}
