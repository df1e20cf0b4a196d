/**
 * A small in-process cache with per-entry time-to-live and a size bound (oldest entries go first).
 * Concurrent misses for one key share one load.
 */
export class TtlCache<K, V> {
  readonly #entries = new Map<K, { value: V; expires: number }>();
  readonly #loading = new Map<K, Promise<V>>();
  readonly #maxEntries: number;

  constructor(maxEntries = 10_000) {
    this.#maxEntries = maxEntries;
  }

  get(key: K): V | undefined {
    const entry = this.#entries.get(key);
    if (!entry) return undefined;
    if (entry.expires <= Date.now()) {
      this.#entries.delete(key);
      return undefined;
    }
    return entry.value;
  }

  set(key: K, value: V, ttlMs: number): void {
    this.#entries.delete(key);
    this.#entries.set(key, { value, expires: Date.now() + ttlMs });
    if (this.#entries.size > this.#maxEntries) {
      const oldest = this.#entries.keys().next();
      if (!oldest.done) this.#entries.delete(oldest.value);
    }
  }

  delete(key: K): void {
    this.#entries.delete(key);
  }

  clear(): void {
    this.#entries.clear();
  }

  /** Returns the cached value or loads it once; `ttl` picks the lifetime from the loaded value. */
  async getOrLoad(key: K, load: () => Promise<V>, ttl: (value: V) => number): Promise<V> {
    const hit = this.get(key);
    if (hit !== undefined) return hit;
    const pending = this.#loading.get(key);
    if (pending) return pending;
    const promise = load()
      .then((value) => {
        // A delete() during the load (an invalidation) must win: only cache if still the current load.
        if (this.#loading.get(key) === promise) this.set(key, value, ttl(value));
        return value;
      })
      .finally(() => {
        if (this.#loading.get(key) === promise) this.#loading.delete(key);
      });
    this.#loading.set(key, promise);
    return promise;
  }

  /** Drops the entry and any load in flight, so the next read goes to the source. */
  invalidate(key: K): void {
    this.#entries.delete(key);
    this.#loading.delete(key);
  }
}
