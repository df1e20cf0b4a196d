import { Redis } from 'ioredis';

/**
 * Where limit counters live: Redis (shared by every pod; each check is one atomic Lua script) or, without
 * REDIS_URL, this process's memory with the same semantics. Counters are integers; a key expires with
 * its window or period.
 */
export interface CounterStore {
  readonly kind: 'redis' | 'memory';
  /**
   * Atomically: when every `used + cost <= cap`, adds each cost and returns `denied: -1`; else adds
   * nothing and returns the index of the first counter over its cap. `values` are the counters after.
   * A missing key counts from its `seed` when given (`needsSeed` lists missing keys without a seed).
   * With a `marker`, `fresh` says whether the store lost its data lately (see `Marker`).
   */
  take(counters: readonly CounterTake[], marker?: Marker): Promise<TakeResult>;
  /** Adds `delta` to each existing key (a correction; a key that expired stays gone). */
  adjust(keys: string[], deltas: number[]): Promise<void>;
  /** Removes keys (counters that missed changes while the store was unreachable: seeded again). */
  forget(keys: string[]): Promise<void>;
  close(): Promise<void>;
}

/** One counter of a take: its key, cap, the cost to add, its time to live, and its seed (if known). */
export interface CounterTake {
  key: string;
  cap: number;
  cost: number;
  ttlMs: number;
  seed: number | undefined;
}

export interface TakeResult {
  denied: number;
  values: number[];
  needsSeed: number[];
  /** The marker was made within its `freshMs` (the store lost it, or it is new): seeds must be cautious. */
  fresh: boolean;
}

/**
 * A key that says the store kept its data: made (with the time, `now`) when missing, kept alive by every
 * take. Younger than `freshMs`, it tells a seed that the counters were lost lately (a FLUSHDB, a restart
 * without persistence), so the requests in flight before are not in them.
 */
export interface Marker {
  key: string;
  ttlMs: number;
  freshMs: number;
  now: number;
}

// KEYS: counters, then the marker (optional). ARGV: n, then per key: limit, cost, ttl ms, seed ('' when
// none), then for the marker: its ttl ms, now (ms) and fresh window (ms).
const TAKE = `
local n = tonumber(ARGV[1])
local fresh = 0
if #KEYS > n then
  local m = KEYS[n + 1]
  local base = 1 + n * 4
  local now = tonumber(ARGV[base + 2])
  local born = redis.call('GET', m)
  if born then
    redis.call('PEXPIRE', m, ARGV[base + 1])
  else
    redis.call('SET', m, ARGV[base + 2], 'PX', ARGV[base + 1])
    born = now
  end
  if now - tonumber(born) < tonumber(ARGV[base + 3]) then fresh = 1 end
end
local values = {}
local missing = {}
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v then
    values[i] = tonumber(v)
  else
    local seed = ARGV[1 + (i - 1) * 4 + 4]
    if seed == '' then
      table.insert(missing, i - 1)
      values[i] = 0
    else
      redis.call('SET', KEYS[i], seed, 'PX', ARGV[1 + (i - 1) * 4 + 3])
      values[i] = tonumber(seed)
    end
  end
end
if #missing > 0 then return {-2, values, missing, fresh} end
local denied = -1
for i = 1, n do
  local limit = tonumber(ARGV[1 + (i - 1) * 4 + 1])
  local cost = tonumber(ARGV[1 + (i - 1) * 4 + 2])
  if denied == -1 and values[i] + cost > limit then denied = i - 1 end
end
if denied == -1 then
  for i = 1, n do
    local cost = tonumber(ARGV[1 + (i - 1) * 4 + 2])
    values[i] = redis.call('INCRBY', KEYS[i], cost)
    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[1 + (i - 1) * 4 + 3]) end
  end
end
return {denied, values, missing, fresh}
`;

const ADJUST = `
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[i]) end
end
return 0
`;

type RedisWithScripts = Redis & {
  tgTake(numKeys: number, ...args: Array<string | number>): Promise<[number, number[], number[], number]>;
  tgAdjust(numKeys: number, ...args: Array<string | number>): Promise<number>;
};

export class RedisCounterStore implements CounterStore {
  readonly kind = 'redis' as const;
  readonly #redis: RedisWithScripts;

  constructor(url: string) {
    // No offline queue and a short command time-out: an unreachable Redis fails the check at once
    // (fail open or closed per LIMITS_FAIL_OPEN) instead of stalling requests.
    const redis = new Redis(url, {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      commandTimeout: 1000,
      connectTimeout: 2000,
      retryStrategy: (times) => Math.min(times * 200, 2000),
    });
    redis.on('error', () => {});
    redis.defineCommand('tgTake', { lua: TAKE });
    redis.defineCommand('tgAdjust', { lua: ADJUST });
    this.#redis = redis as RedisWithScripts;
  }

  async take(counters: readonly CounterTake[], marker?: Marker): Promise<TakeResult> {
    const keys: string[] = [];
    const args: Array<string | number> = [counters.length];
    for (const c of counters) {
      keys.push(c.key);
      args.push(c.cap, c.cost, c.ttlMs, c.seed ?? '');
    }
    if (marker) {
      keys.push(marker.key);
      args.push(marker.ttlMs, marker.now, marker.freshMs);
    }
    const [denied, values, missing, fresh] = await this.#redis.tgTake(keys.length, ...keys, ...args);
    return {
      denied: denied === -2 ? -1 : denied,
      values: values.map(Number),
      needsSeed: missing,
      fresh: fresh === 1,
    };
  }

  async adjust(keys: string[], deltas: number[]): Promise<void> {
    if (keys.length) await this.#redis.tgAdjust(keys.length, ...keys, ...deltas);
  }

  async forget(keys: string[]): Promise<void> {
    // One key per call: the keys of different users may live on different cluster slots.
    for (const key of keys) await this.#redis.del(key);
  }

  async close(): Promise<void> {
    this.#redis.disconnect();
  }
}

export class MemoryCounterStore implements CounterStore {
  readonly kind = 'memory' as const;
  readonly #counters = new Map<string, { value: number; expires: number }>();
  #sweeps = 0;

  async take(counters: readonly CounterTake[], marker?: Marker): Promise<TakeResult> {
    const now = Date.now();
    if (++this.#sweeps % 1000 === 0) this.#sweep(now);
    let fresh = false;
    if (marker) {
      const entry = this.#live(marker.key, now) ?? { value: marker.now, expires: 0 };
      entry.expires = now + marker.ttlMs;
      this.#counters.set(marker.key, entry);
      fresh = marker.now - entry.value < marker.freshMs;
    }
    const values: number[] = [];
    const needsSeed: number[] = [];
    counters.forEach((c, i) => {
      const entry = this.#live(c.key, now);
      if (entry) values.push(entry.value);
      else if (c.seed !== undefined) {
        this.#counters.set(c.key, { value: c.seed, expires: now + c.ttlMs });
        values.push(c.seed);
      } else {
        needsSeed.push(i);
        values.push(0);
      }
    });
    if (needsSeed.length) return { denied: -1, values, needsSeed, fresh };
    const denied = counters.findIndex((c, i) => values[i]! + c.cost > c.cap);
    if (denied === -1) {
      counters.forEach((c, i) => {
        const entry = this.#live(c.key, now) ?? { value: 0, expires: now + c.ttlMs };
        entry.value += c.cost;
        this.#counters.set(c.key, entry);
        values[i] = entry.value;
      });
    }
    return { denied, values, needsSeed, fresh };
  }

  async adjust(keys: string[], deltas: number[]): Promise<void> {
    const now = Date.now();
    keys.forEach((key, i) => {
      const entry = this.#live(key, now);
      if (entry) entry.value += deltas[i]!;
    });
  }

  async forget(keys: string[]): Promise<void> {
    for (const key of keys) this.#counters.delete(key);
  }

  async close(): Promise<void> {
    this.#counters.clear();
  }

  #live(key: string, now: number) {
    const entry = this.#counters.get(key);
    if (entry && entry.expires <= now) {
      this.#counters.delete(key);
      return undefined;
    }
    return entry;
  }

  #sweep(now: number): void {
    for (const [key, entry] of this.#counters) if (entry.expires <= now) this.#counters.delete(key);
  }
}
