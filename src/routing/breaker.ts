/**
 * A circuit breaker per route (project, provider, provider model), per process: after `failures`
 * consecutive failures the route is skipped for `cooldownMs`; then exactly one request probes it — a
 * success closes the circuit, a failure opens it for another cool-down.
 */
export type CircuitPass = 'closed' | 'probe' | 'open';

interface CircuitState {
  failures: number;
  openedAt: number | undefined;
  probing: boolean;
}

export class CircuitBreakers {
  readonly #states = new Map<string, CircuitState>();
  readonly #failures: number;
  readonly #cooldownMs: number;

  constructor(options: { failures: number; cooldownMs: number }) {
    this.#failures = options.failures;
    this.#cooldownMs = options.cooldownMs;
  }

  /** Whether a request may use the route now; `probe` reserves the one probe of a half-open circuit. */
  pass(key: string, now = Date.now()): CircuitPass {
    const state = this.#states.get(key);
    if (!state || state.openedAt === undefined) return 'closed';
    if (state.probing || now - state.openedAt < this.#cooldownMs) return 'open';
    state.probing = true;
    return 'probe';
  }

  /** Milliseconds until an open circuit lets its probe through (0 when it is not open). */
  retryInMs(key: string, now = Date.now()): number {
    const state = this.#states.get(key);
    if (!state || state.openedAt === undefined) return 0;
    return Math.max(0, state.openedAt + this.#cooldownMs - now);
  }

  /** Records a success; true when it closed an open circuit. */
  success(key: string): boolean {
    const state = this.#states.get(key);
    if (!state) return false;
    this.#states.delete(key);
    return state.openedAt !== undefined;
  }

  /** Records a failure; true when it opened the circuit (or re-opened it after a failed probe). */
  failure(key: string, now = Date.now()): boolean {
    let state = this.#states.get(key);
    if (!state) {
      state = { failures: 0, openedAt: undefined, probing: false };
      this.#states.set(key, state);
    }
    state.failures++;
    if (state.probing || (state.openedAt === undefined && state.failures >= this.#failures)) {
      state.openedAt = now;
      state.probing = false;
      return true;
    }
    return false;
  }

  /** A probe that ended without a verdict (the client left, the request was invalid): let another probe. */
  abandon(key: string): void {
    const state = this.#states.get(key);
    if (state) state.probing = false;
  }

  state(key: string): 'closed' | 'open' {
    return this.#states.get(key)?.openedAt === undefined ? 'closed' : 'open';
  }
}
