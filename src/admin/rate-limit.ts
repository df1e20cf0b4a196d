import { ApiError } from '../core/errors.ts';

/**
 * The sign-in rate limit: failed attempts are counted per e-mail and per client address over a sliding
 * window; past the limit, sign-in answers 429 with Retry-After until the oldest failure leaves the window.
 * A success clears the e-mail's count. Kept in the process (each pod counts its own).
 */
export class SignInLimiter {
  readonly #failures = new Map<string, number[]>();
  readonly #windowMs: number;
  readonly #perEmail: number;
  readonly #perAddress: number;

  constructor(options: { windowMs?: number; perEmail?: number; perAddress?: number } = {}) {
    this.#windowMs = options.windowMs ?? 15 * 60_000;
    this.#perEmail = options.perEmail ?? 5;
    this.#perAddress = options.perAddress ?? 20;
  }

  #recent(key: string, now: number): number[] {
    const kept = (this.#failures.get(key) ?? []).filter((t) => t > now - this.#windowMs);
    if (kept.length) this.#failures.set(key, kept);
    else this.#failures.delete(key);
    return kept;
  }

  /** Throws 429 when the e-mail or the address has too many recent failures. */
  check(email: string, address: string, now = Date.now()): void {
    for (const [key, limit] of [
      [`e:${email}`, this.#perEmail],
      [`a:${address}`, this.#perAddress],
    ] as const) {
      const recent = this.#recent(key, now);
      if (recent.length >= limit) {
        const retryAfter = Math.max(1, Math.ceil((recent[0]! + this.#windowMs - now) / 1000));
        throw new ApiError(
          429,
          'rate_limit_error',
          `Too many failed sign-in attempts. Try again in ${Math.ceil(retryAfter / 60)} minute(s).`,
          { code: 'sign_in_rate_limited', headers: { 'retry-after': String(retryAfter) } },
        );
      }
    }
  }

  failed(email: string, address: string, now = Date.now()): void {
    for (const key of [`e:${email}`, `a:${address}`]) {
      const recent = this.#recent(key, now);
      recent.push(now);
      this.#failures.set(key, recent);
    }
    if (this.#failures.size > 100_000) this.#failures.clear();
  }

  succeeded(email: string): void {
    this.#failures.delete(`e:${email}`);
  }
}
