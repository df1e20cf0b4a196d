import { describe, expect, it } from 'vitest';
import { GroupCommit } from '../../src/billing/group-commit.ts';

/** A batch runner whose batches the test releases one by one. */
function gated() {
  const batches: Array<{ items: Array<{ key: string; n: number }>; release: () => void }> = [];
  const run = (items: Array<{ key: string; n: number }>) =>
    new Promise<number[]>((resolve) => {
      batches.push({ items, release: () => resolve(items.map((i) => i.n)) });
    });
  return { batches, run };
}

/** Submits one item per key, numbered 1, 2, … in order. */
const submitAll = (queue: GroupCommit<{ key: string; n: number }, number>, keys: string[]) =>
  keys.map((key, i) => queue.submit({ key, n: i + 1 }));

const flush = () => new Promise((resolve) => setImmediate(resolve));

describe('group commit', () => {
  it('batches what arrives while a batch is in flight, one item per key per batch, in order', async () => {
    const { batches, run } = gated();
    const queue = new GroupCommit(run, (i: { key: string; n: number }) => i.key);
    const results = submitAll(queue, ['a', 'a', 'b', 'a']);
    await flush();
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1]]);
    batches[0]!.release();
    await flush();
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1], [2, 3]]);
    batches[1]!.release();
    await flush();
    batches[2]!.release();
    expect(await Promise.all(results)).toEqual([1, 2, 3, 4]);
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1], [2, 3], [4]]);
    expect(queue.idle).toBe(true);
  });

  it('runs up to `parallel` batches at once, and never lets a key overtake its earlier item', async () => {
    const { batches, run } = gated();
    const queue = new GroupCommit(run, (i: { key: string; n: number }) => i.key, 512, 2);
    const results = submitAll(queue, ['a', 'b', 'a', 'c']);
    await flush();
    // two batches in flight; 'a' (3) waits for its first item's batch, and 'c' (4) queues behind the limit
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1], [2]]);
    batches[1]!.release(); // b's batch returns first: 'a' is still busy, so only c leaves
    await flush();
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1], [2], [4]]);
    batches[0]!.release();
    await flush();
    expect(batches.map((b) => b.items.map((i) => i.n))).toEqual([[1], [2], [4], [3]]);
    batches[2]!.release();
    batches[3]!.release();
    expect(await Promise.all(results)).toEqual([1, 2, 3, 4]);
  });

  it('keeps a batch within `max` items and rejects every item of a failed batch', async () => {
    const queue = new GroupCommit(
      async (items: number[]) => {
        if (items.includes(13)) throw new Error('unlucky');
        return items.map((i) => i * 2);
      },
      (i) => String(i),
      2,
    );
    const sizes: number[] = [];
    const sized = new GroupCommit(
      async (items: number[]) => {
        sizes.push(items.length);
        return items;
      },
      (i) => String(i),
      2,
    );
    await Promise.all(Array.from({ length: 5 }, (_, i) => sized.submit(i)));
    expect(Math.max(...sizes)).toBeLessThanOrEqual(2);
    const outcomes = await Promise.allSettled([queue.submit(1), queue.submit(13), queue.submit(2)]);
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'rejected', 'rejected']);
  });
});
