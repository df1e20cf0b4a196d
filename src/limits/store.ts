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
  /**
   * Adds `delta` to each existing key (a correction; a key that expired stays gone). With a `guard`, only
   * when the key is still the one the request was counted in (its birth), or — seeded again since — when
   * the request settled well after that seed read the ledger (see `Guard`).
   */
  adjust(keys: string[], deltas: number[], guards?: ReadonlyArray<Guard | undefined>): Promise<void>;
  /** Removes keys (counters that missed changes while the store was unreachable: seeded again). */
  forget(keys: string[]): Promise<void>;
  close(): Promise<void>;
}

/**
 * One counter of a take: its key, cap, the cost to add, its time to live, and its seed (if known) with
 * its birth (when the seed was read: kept beside the counter, for `Guard`).
 */
export interface CounterTake {
  key: string;
  cap: number;
  cost: number;
  ttlMs: number;
  seed: number | undefined;
  /** When its seed was read (ms, as a string); `-` for a counter that has a birth but no seed yet. */
  birth?: string | undefined;
}

/**
 * A correction's guard: the birth of the counter the request was counted in, and when it settled (ms).
 * A counter seeded again since (Redis lost it) already holds the request's reservation when the request
 * was still in flight at the seed (the seed counts the open slices), or its charge when it had settled
 * (the seed counts the ledger): the correction applies only when the request settled more than
 * `GUARD_MARGIN_MS` after the seed read, and is skipped otherwise (the counter stays above the truth).
 */
export interface Guard {
  birth: string;
  settledAt: number;
}

/** The margin of `Guard`: clock skew between pods and the time from a charge's commit to its correction. */
export const GUARD_MARGIN_MS = 2000;

export interface TakeResult {
  denied: number;
  values: number[];
  needsSeed: number[];
  /** Each counter's birth ('' when it has none, or was not asked: a counter without a `birth`). */
  births: string[];
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
// none), birth ('' when the counter has none, '-' when it is not seeded by this take), then for the marker: its ttl ms, now (ms) and fresh window (ms). A
// counter's birth lives beside it, at `<key>:b`.
const TAKE = `
local n = tonumber(ARGV[1])
local fresh = 0
if #KEYS > n then
  local m = KEYS[n + 1]
  local base = 1 + n * 5
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
    local seed = ARGV[1 + (i - 1) * 5 + 4]
    if seed == '' then
      table.insert(missing, i - 1)
      values[i] = 0
    else
      redis.call('SET', KEYS[i], seed, 'PX', ARGV[1 + (i - 1) * 5 + 3])
      local birth = ARGV[1 + (i - 1) * 5 + 5]
      if birth ~= '' and birth ~= '-' then redis.call('SET', KEYS[i] .. ':b', birth, 'PX', ARGV[1 + (i - 1) * 5 + 3]) end
      values[i] = tonumber(seed)
    end
  end
end
if #missing > 0 then return {-2, values, missing, fresh, {}} end
local denied = -1
for i = 1, n do
  local limit = tonumber(ARGV[1 + (i - 1) * 5 + 1])
  local cost = tonumber(ARGV[1 + (i - 1) * 5 + 2])
  if denied == -1 and values[i] + cost > limit then denied = i - 1 end
end
if denied == -1 then
  for i = 1, n do
    local cost = tonumber(ARGV[1 + (i - 1) * 5 + 2])
    values[i] = redis.call('INCRBY', KEYS[i], cost)
    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[1 + (i - 1) * 5 + 3]) end
  end
end
local births = {}
for i = 1, n do
  births[i] = ''
  if ARGV[1 + (i - 1) * 5 + 5] ~= '' then births[i] = redis.call('GET', KEYS[i] .. ':b') or '' end
end
return {denied, values, missing, fresh, births}
`;

// KEYS: counters. ARGV: the margin (ms), then per key: delta, birth ('' for no guard), settled at (ms).
const ADJUST = `
local margin = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local apply = true
    local birth = ARGV[2 + (i - 1) * 3 + 1]
    if birth ~= '' then
      local now = redis.call('GET', KEYS[i] .. ':b')
      if now and now ~= birth and tonumber(ARGV[2 + (i - 1) * 3 + 2]) < tonumber(now) + margin then apply = false end
    end
    if apply then redis.call('INCRBY', KEYS[i], ARGV[2 + (i - 1) * 3]) end
  end
end
return 0
`;

type RedisWithScripts = Redis & {
  tgTake(
    numKeys: number,
    ...args: Array<string | number>
  ): Promise<[number, number[], number[], number, Array<string | null>]>;
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
      args.push(c.cap, c.cost, c.ttlMs, c.seed ?? '', c.birth ?? '');
    }
    if (marker) {
      keys.push(marker.key);
      args.push(marker.ttlMs, marker.now, marker.freshMs);
    }
    const [denied, values, missing, fresh, births] = await this.#redis.tgTake(keys.length, ...keys, ...args);
    return {
      denied: denied === -2 ? -1 : denied,
      values: values.map(Number),
      needsSeed: missing,
      births: counters.map((_, i) => births[i] || ''),
      fresh: fresh === 1,
    };
  }

  async adjust(keys: string[], deltas: number[], guards?: ReadonlyArray<Guard | undefined>): Promise<void> {
    if (!keys.length) return;
    const args: Array<string | number> = [GUARD_MARGIN_MS];
    keys.forEach((_, i) => {
      const guard = guards?.[i];
      args.push(deltas[i]!, guard?.birth ?? '', guard?.settledAt ?? 0);
    });
    await this.#redis.tgAdjust(keys.length, ...keys, ...args);
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
  readonly #counters = new Map<string, { value: number; expires: number; birth?: string }>();
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
        this.#counters.set(c.key, {
          value: c.seed,
          expires: now + c.ttlMs,
          ...(c.birth && c.birth !== '-' ? { birth: c.birth } : {}),
        });
        values.push(c.seed);
      } else {
        needsSeed.push(i);
        values.push(0);
      }
    });
    if (needsSeed.length) return { denied: -1, values, needsSeed, births: [], fresh };
    const denied = counters.findIndex((c, i) => values[i]! + c.cost > c.cap);
    if (denied === -1) {
      counters.forEach((c, i) => {
        const entry = this.#live(c.key, now) ?? { value: 0, expires: now + c.ttlMs };
        entry.value += c.cost;
        this.#counters.set(c.key, entry);
        values[i] = entry.value;
      });
    }
    const births = counters.map((c) => this.#live(c.key, now)?.birth ?? '');
    return { denied, values, needsSeed, births, fresh };
  }

  async adjust(keys: string[], deltas: number[], guards?: ReadonlyArray<Guard | undefined>): Promise<void> {
    const now = Date.now();
    keys.forEach((key, i) => {
      const entry = this.#live(key, now);
      const guard = guards?.[i];
      if (!entry) return;
      if (guard && entry.birth && entry.birth !== guard.birth)
        if (guard.settledAt < Number(entry.birth) + GUARD_MARGIN_MS) return;
      entry.value += deltas[i]!;
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
