import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { eventually } from '../helpers/eventually.ts';
import { haveRedisServer, type PrivateRedis, startPrivateRedis } from '../helpers/private-services.ts';
import { type Pods, startPricedPods } from './fixture.ts';

/**
 * Spend caps when Redis loses its counters or goes away, under concurrent load on a private
 * redis-server (a spare loopback port, never the shared one): a cap of 0.50 at 0.10 a request (its hold:
 * its worst case) is exceeded by at most one request's worst case — here, with every hold equal to its
 * charge, not at all. After a FLUSHDB the counter is seeded from the ledger plus the open slices (the
 * requests in flight); with Redis down the cap is checked against Postgres, and requests under the cap
 * are still served.
 */
const MODELS: ModelSpec[] = [
  { id: 'flat', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.1' } },
];
const CAP = '0.5';
const WORST = '0.1';
const messages = [{ role: 'user' as const, content: 'Say hello' }];

/** A loopback TCP relay to Redis that a test can cut (a partition: Redis keeps its data) and heal. */
async function startRelay(target: number) {
  const sockets = new Set<Socket>();
  let cut = false;
  const server: Server = createServer((client) => {
    if (cut) return client.destroy();
    const upstream = createConnection(target, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {});
    }
    client.pipe(upstream).pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `redis://127.0.0.1:${(server.address() as { port: number }).port}`,
    cut() {
      cut = true;
      for (const s of sockets) s.destroy();
    },
    heal() {
      cut = false;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

describe.skipIf(!haveRedisServer())('spend caps when Redis loses its counters (private redis-server)', () => {
  let redis: PrivateRedis;
  let relay: Awaited<ReturnType<typeof startRelay>>;
  let p: Pods;
  let client: OpenAI;

  beforeAll(async () => {
    redis = await startPrivateRedis();
    relay = await startRelay(redis.port);
    p = await startPricedPods({ REDIS_URL: relay.url }, 1, MODELS);
    await applyPricing(p.ctx.db, p.projectId, {
      currency: 'usd',
      models: MODELS,
      limits: { spend: { daily: CAP } },
    });
    await p.ctx.projects.changed(p.projectId);
    client = new OpenAI({ baseURL: `${p.pods[0]!.url}/v1`, apiKey: p.apiKey, maxRetries: 0 });
  }, 60_000);
  afterEach(() => {
    p.mock.defaults.chunkDelayMs = undefined;
  });
  afterAll(async () => {
    await p?.close();
    await relay?.close();
    await redis?.destroy();
  });

  /** Spend checks this pod made against Postgres so far. */
  async function checkedInPostgres(): Promise<number> {
    const text = await p.pods[0]!.ctx.metrics.registry.getSingleMetricAsString(
      'tollgate_limits_backend_errors_total',
    );
    return Number(/outcome="postgres"} (\d+)/.exec(text)?.[1] ?? 0);
  }

  /** One streamed chat: true when it was served, false when it got the cap's message. */
  async function ask(user: string): Promise<boolean> {
    const stream = await client.chat.completions.create({ model: 'flat', user, messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    if (text.includes('spending limit')) return false;
    expect(text).toBe(' hello'.repeat(5));
    return true;
  }

  async function charged(user: string) {
    await p.pods[0]!.app.metering.idle();
    const rows = await p.ctx.db
      .selectFrom('ledger_entries as l')
      .innerJoin('end_users as e', 'e.id', 'l.user_id')
      .select('l.amount')
      .where('e.project_id', '=', p.projectId)
      .where('e.external_id', '=', user)
      .where('l.kind', '=', 'charge')
      .execute();
    const total = rows.reduce((s, r) => s.minus(r.amount), new Money(0));
    return { count: rows.length, total: total.toFixed() };
  }

  /** Starts `n` slow requests and resolves once all of them are at the upstream (holding). */
  async function inFlight(user: string, n: number) {
    p.mock.defaults.chunkDelayMs = 150;
    const before = p.mock.inFlight;
    const asked = Array.from({ length: n }, () => ask(user));
    await eventually(async () => p.mock.inFlight >= before + n);
    return asked;
  }

  it('FLUSHDB mid-run: the counter is seeded from the ledger plus the requests in flight; the cap holds', async () => {
    await p.fund('flushed', '100.00');
    const first = await inFlight('flushed', 3);
    const admin = new Redis(redis.url, { maxRetriesPerRequest: 1 });
    await admin.flushdb();
    await admin.quit();
    // Ten more at once, while the three are in flight: two fit under the cap.
    const second = Array.from({ length: 10 }, () => ask('flushed'));
    const served = [...(await Promise.all(first)), ...(await Promise.all(second))];
    p.mock.defaults.chunkDelayMs = undefined;
    for (let i = 0; i < 3; i++) served.push(await ask('flushed'));
    const spent = await charged('flushed');
    expect(new Money(spent.total).lte(new Money(CAP).plus(WORST))).toBe(true);
    expect(spent).toEqual({ count: 5, total: '0.5' });
    expect(served.filter(Boolean)).toHaveLength(5);
  });

  it('Redis unreachable, then back with its data: the counters that missed the outage are seeded afresh', async () => {
    await p.fund('partitioned', '100.00');
    await p.fund('probe', '100.00');
    expect([await ask('partitioned'), await ask('partitioned')]).toEqual([true, true]);
    relay.cut();
    const before = await checkedInPostgres();
    expect([await ask('partitioned'), await ask('partitioned')]).toEqual([true, true]);
    expect(await checkedInPostgres()).toBe(before + 2);
    relay.heal();
    // Until this pod's Redis connection is back, checks go to Postgres; a probe user's request shows when.
    await eventually(async () => {
      const was = await checkedInPostgres();
      await ask('probe');
      return (await checkedInPostgres()) === was;
    }, 20_000);
    // Redis still counts 0.20 for the user; the ledger says 0.40: one more fits, not three.
    const after: boolean[] = [];
    for (let i = 0; i < 3; i++) after.push(await ask('partitioned'));
    expect(after).toEqual([true, false, false]);
    expect(await charged('partitioned')).toEqual({ count: 5, total: '0.5' });
  });

  it('Redis killed mid-run: checked against Postgres, still served under the cap, bounded at it', async () => {
    await p.fund('outage', '100.00');
    expect(await ask('outage')).toBe(true);
    const first = await inFlight('outage', 2);
    await redis.stop();
    const checked = await checkedInPostgres();
    // Ten at once while Redis is gone and two are in flight: Postgres lets through what fits (the
    // open holds of the two count, and each admitted request's reservation as soon as it is made).
    const second = Array.from({ length: 10 }, () => ask('outage'));
    expect(await Promise.all(first)).toEqual([true, true]);
    const during = await Promise.all(second);
    p.mock.defaults.chunkDelayMs = undefined;
    // Then one at a time, Redis still down: served from Postgres until the cap, then refused.
    const after: boolean[] = [];
    for (let i = 0; i < 4; i++) after.push(await ask('outage'));
    expect(after.at(-1)).toBe(false);
    // Three were admitted through Redis; the two that fit under the cap after it died were served.
    expect([...during, ...after].filter(Boolean)).toHaveLength(2);
    expect(await checkedInPostgres()).toBe(checked + 14);
    expect(await charged('outage')).toEqual({ count: 5, total: '0.5' });
    const open = await p.ctx.db.selectFrom('spend_reservations').select('id').execute();
    expect(open).toEqual([]);

    // Redis back, empty: the counter is seeded afresh; the cap still holds.
    await redis.start();
    await eventually(async () => {
      const ping = new Redis(redis.url, { maxRetriesPerRequest: 0, lazyConnect: true });
      const ok = await ping.ping().then(
        () => true,
        () => false,
      );
      ping.disconnect();
      return ok;
    });
    expect(await ask('outage')).toBe(false);
    expect(await charged('outage')).toEqual({ count: 5, total: '0.5' });
  });
});
