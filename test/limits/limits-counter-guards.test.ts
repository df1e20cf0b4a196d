import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CounterStore,
  type CounterTake,
  GUARD_MARGIN_MS,
  MemoryCounterStore,
  RedisCounterStore,
} from '../../src/limits/store.ts';
import { eventually } from '../helpers/eventually.ts';

/**
 * The counter stores' guards, on both stores: a spend counter keeps the birth of its seed; a correction
 * of a request counted in an earlier birth of the counter (Redis lost it and it was seeded again)
 * applies only when the request settled well after the new seed read the ledger — before that, the seed
 * already holds the request's charge or its reservation, and the correction would count it twice or
 * take back what the seed never had. The project's marker says when the counters were lost lately.
 */
const redisUrl = process.env.TOLLGATE_TEST_REDIS;
const stores: Array<[string, () => CounterStore]> = [['memory', () => new MemoryCounterStore()]];
if (redisUrl) stores.push(['redis', () => new RedisCounterStore(redisUrl)]);
const opened: CounterStore[] = [];
afterAll(async () => {
  for (const s of opened) await s.close();
});

describe.each(stores)('the %s store', (_name, make) => {
  const store = make();
  opened.push(store);
  // Redis's connection is up when a take answers (no offline queue).
  beforeAll(() =>
    eventually(() =>
      store.take([]).then(
        () => true,
        () => false,
      ),
    ),
  );
  const key = `test:guards:{${randomBytes(6).toString('hex')}}:spend`;
  const counter = (seed: number | undefined, birth: string): CounterTake => ({
    key,
    cap: 1000,
    cost: 10,
    ttlMs: 60_000,
    seed,
    birth,
  });
  const value = async () => (await store.take([{ ...counter(undefined, '-'), cost: 0 }])).values[0];

  it('applies a correction of its own birth, and of an earlier one only when it settled after the seed', async () => {
    const first = await store.take([counter(100, '1000')]);
    expect(first).toMatchObject({ denied: -1, values: [110], births: ['1000'] });
    await store.adjust([key], [-4], [{ birth: '1000', settledAt: 1500 }]);
    expect(await value()).toBe(106);

    // Lost and seeded again at 5000: a request counted before settles.
    await store.forget([key]);
    expect((await store.take([counter(200, '5000')])).births).toEqual(['5000']);
    await store.adjust([key], [-10], [{ birth: '1000', settledAt: 5000 + GUARD_MARGIN_MS - 1 }]);
    expect(await value()).toBe(210);
    await store.adjust([key], [-10], [{ birth: '1000', settledAt: 5000 + GUARD_MARGIN_MS }]);
    expect(await value()).toBe(200);
    // No guard (a token counter): applied as it comes.
    await store.adjust([key], [5]);
    expect(await value()).toBe(205);
  });

  it('says when a project’s marker is fresh: made lately, or lost and made again', async () => {
    const marker = { key: `${key}:alive`, ttlMs: 60_000, freshMs: 1000, now: 10_000 };
    const rate: CounterTake = { key: `${key}:r`, cap: 10, cost: 1, ttlMs: 60_000, seed: 0 };
    expect((await store.take([rate], marker)).fresh).toBe(true);
    expect((await store.take([rate], { ...marker, now: 10_999 })).fresh).toBe(true);
    expect((await store.take([rate], { ...marker, now: 11_000 })).fresh).toBe(false);
    await store.forget([marker.key]);
    expect((await store.take([rate], { ...marker, now: 20_000 })).fresh).toBe(true);
  });
});
