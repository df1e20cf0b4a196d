import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AppContext, createContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { fanOut } from '../../src/webhooks/fanout.ts';
import { claimDue, recordResult } from '../../src/webhooks/queue.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { createTestContext, realPostgres } from '../helpers/context.ts';
import type { Receiver, TestCa } from '../helpers/https-receiver.ts';
import { seedProject } from '../helpers/server.ts';
import { startWebhookBench, type WebhookBench } from './fixture.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };

let ca: TestCa;
let ctx: AppContext;
let receiver: Receiver;
const hangOnce = new Set<string>();
const hung = new Set<string>();
const SLOW = '/slow-receiver';
const slow = { now: 0, max: 0 };

let bench: WebhookBench<AppContext>;
beforeAll(async () => {
  const env = {
    WEBHOOK_CLAIM_LEASE_MS: '1000',
    WEBHOOK_POLL_INTERVAL_MS: '50',
    WEBHOOK_BACKOFF_BASE_MS: '50',
  };
  bench = await startWebhookBench(
    (e) => createTestContext(e),
    env,
    async (r) => {
      if (r.path === SLOW) {
        // A slow receiver that counts the requests it holds at once.
        slow.now++;
        slow.max = Math.max(slow.max, slow.now);
        await new Promise((resolve) => setTimeout(resolve, 15));
        slow.now--;
        return { status: 200 };
      }
      if (hangOnce.has(r.path) && !hung.has(r.path)) {
        hung.add(r.path);
        return { status: 200, hang: true };
      }
      return { status: 200 };
    },
  );
  ({ ca, receiver, started: ctx } = bench);
});
afterAll(() => bench?.close());

async function subscribeAndDeposit(c: AppContext, path: string, deposits = 1, subscriptions = 1) {
  const p = await seedProject(c);
  const ids: string[] = [];
  for (let i = 0; i < subscriptions; i++) {
    const { subscription, secret } = await createSubscription(
      c,
      p.projectId,
      { url: `${receiver.url}${path}`, events: ['balance.*'] },
      { createdBy: 'test' },
    );
    receiver.secrets.set(subscription.id, secret);
    ids.push(subscription.id);
  }
  const project = await getProject(c.db, p.projectId);
  for (let i = 0; i < deposits; i++)
    await c.billing.deposit({ project, externalId: `u${i}`, amount: '1', source: 'test', trigger });
  return { projectId: p.projectId, subscriptionIds: ids };
}

async function deliveryRows(c: AppContext, subscriptionIds: string[]) {
  return c.db
    .selectFrom('webhook_deliveries')
    .selectAll()
    .where('subscription_id', 'in', subscriptionIds)
    .execute();
}

describe.runIf(realPostgres)('workers in separate processes', () => {
  it('delivers after the worker holding the claim is killed with SIGKILL mid-request', async () => {
    const path = '/killed';
    hangOnce.add(path);
    const schema = ctx.database.schema!;
    const child: ChildProcess = spawn(
      process.execPath,
      [join(import.meta.dirname, '../helpers/worker-child.ts')],
      {
        env: {
          ...process.env,
          LOG_LEVEL: 'silent',
          DATABASE_URL: process.env.TOLLGATE_TEST_PG,
          REDIS_URL: process.env.TOLLGATE_TEST_REDIS || '',
          TOLLGATE_ENCRYPTION_KEY: 'a'.repeat(64),
          WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
          WEBHOOK_CA_FILE: ca.caFile,
          WEBHOOK_CLAIM_LEASE_MS: '1000',
          WEBHOOK_POLL_INTERVAL_MS: '50',
          TEST_SCHEMA: schema,
          TEST_BUS_PREFIX: `child-${schema}:`,
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on('data', (d: Buffer) => {
          if (d.toString().includes('ready')) resolve();
        });
        child.once('exit', (code) => reject(new Error(`worker child exited early (${code})`)));
      });
      const { subscriptionIds } = await subscribeAndDeposit(ctx, path);
      const [first] = await receiver.waitFor((all) => all.some((r) => r.path === path));
      const firstReq = receiver.received.find((r) => r.path === path)!;
      expect(first).toBeDefined();
      expect(firstReq.body.delivery.attempts).toBe(1);
      const exited = once(child, 'exit');
      child.kill('SIGKILL');
      const [, signal] = await exited;
      expect(signal).toBe('SIGKILL');
      const [row] = await deliveryRows(ctx, subscriptionIds);
      expect(row).toMatchObject({ status: 'pending', attempts: 1 });
      expect(row!.claim_id).not.toBeNull();

      // A fresh worker takes over once the dead worker's lease has run out.
      const worker = startDeliveryWorker(ctx);
      try {
        const reqs = (await receiver.waitFor((all) => all.filter((r) => r.path === path).length >= 2)).filter(
          (r) => r.path === path,
        );
        expect(reqs[1]!.body.delivery).toMatchObject({ id: firstReq.body.delivery.id, attempts: 2 });
        expect(reqs[1]!.verified).toBe(true);
        // Not before the dead worker's lease ran out (the row's next_attempt_at while it was claimed).
        expect(reqs[1]!.at).toBeGreaterThanOrEqual(row!.next_attempt_at.getTime() - 50);
        const deadline = Date.now() + 5000;
        let done = (await deliveryRows(ctx, subscriptionIds))[0]!;
        while (done.status === 'pending' && Date.now() < deadline) {
          await new Promise((r) => setTimeout(r, 20));
          done = (await deliveryRows(ctx, subscriptionIds))[0]!;
        }
        expect(done).toMatchObject({ status: 'success', attempts: 2, last_status: 200 });
      } finally {
        await worker.stop(1000);
      }
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });

  it('keeps the per-subscription limit across workers: one subscription, three workers, at most 2 at once', async () => {
    const other = await createContext(ctx.config, {
      schema: ctx.database.schema!,
      busPrefix: 'limit-other:',
    });
    const options = { concurrency: 16, perSubscription: 2, leaseMs: 60_000 };
    const workers = [
      startDeliveryWorker(ctx, options),
      startDeliveryWorker(ctx, options),
      startDeliveryWorker(other, options),
    ];
    try {
      await Promise.all(workers.map((w) => w.ready));
      const { subscriptionIds } = await subscribeAndDeposit(ctx, SLOW, 60);
      await receiver.waitFor((rs) => rs.filter((r) => r.path === SLOW).length >= 60, 25_000);
      // Each worker alone keeps 2 in flight; without one owner per subscription, three would reach 6.
      expect(slow.max).toBe(2);
      const owners = await ctx.db
        .selectFrom('webhook_subscription_owners')
        .selectAll()
        .where('subscription_id', 'in', subscriptionIds)
        .execute();
      expect(owners).toHaveLength(1);
    } finally {
      await Promise.all(workers.map((w) => w.stop(1000)));
      await other.close();
    }
    // Stopped workers give their ownership up at once.
    const held = await ctx.db
      .selectFrom('webhook_subscription_owners')
      .select('owner')
      .where('owner', 'is not', null)
      .execute();
    expect(held).toEqual([]);
  });

  it('never sends an attempt twice with three workers on two connection pools racing', async () => {
    const path = '/race';
    const other = await createContext(ctx.config, { schema: ctx.database.schema!, busPrefix: 'race-other:' });
    // Leases long enough that no claim expires on a busy machine: every delivery takes exactly one attempt.
    const options = { concurrency: 8, leaseMs: 60_000 };
    const workers = [
      startDeliveryWorker(ctx, options),
      startDeliveryWorker(ctx, options),
      startDeliveryWorker(other, options),
    ];
    try {
      const { subscriptionIds } = await subscribeAndDeposit(ctx, path, 25, 12);
      const expected = 25 * 12;
      const all = await receiver.waitFor(
        (rs) => rs.filter((r) => r.path === path).length >= expected,
        25_000,
      );
      // Give a duplicate, were there one, the chance to arrive: wait until every delivery is recorded.
      const deadline = Date.now() + 10_000;
      let rows = await deliveryRows(ctx, subscriptionIds);
      while (rows.some((r) => r.status !== 'success') && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 25));
        rows = await deliveryRows(ctx, subscriptionIds);
      }
      const mine = all.filter((r) => r.path === path);
      const keys = mine.map((r) => `${r.body.delivery.id}#${r.body.delivery.attempts}`);
      expect(new Set(keys).size).toBe(keys.length);
      expect(mine).toHaveLength(expected);
      expect(mine.every((r) => r.verified)).toBe(true);
      expect(rows).toHaveLength(expected);
      expect(rows.every((r) => r.status === 'success' && r.attempts === 1)).toBe(true);
    } finally {
      await Promise.all(workers.map((w) => w.stop(1000)));
      await other.close();
    }
  });
});

const claimOptions = {
  limit: 10,
  leaseMs: 60_000,
  perSubscription: 4,
  owner: 'fence-worker',
  ownerLeaseMs: 60_000,
};

describe('claims and fences', () => {
  it('a worker whose lease ran out cannot record over the next claimant', async () => {
    const { subscriptionIds } = await subscribeAndDeposit(ctx, '/fence');
    await fanOut(ctx);
    const [first] = await claimDue(ctx.db, claimOptions);
    expect(first).toBeDefined();
    expect(first!.subscription_id).toBe(subscriptionIds[0]);
    // Not due while the lease holds.
    expect(await claimDue(ctx.db, claimOptions)).toHaveLength(0);
    await sql`UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second' WHERE id = ${first!.id}`.execute(
      ctx.db,
    );
    const [second] = await claimDue(ctx.db, claimOptions);
    expect(second).toMatchObject({ id: first!.id, attempts: 2 });
    expect(second!.claim_id).not.toBe(first!.claim_id);
    const startedAt = new Date();
    expect(
      await recordResult(ctx.db, first!, { outcome: 'success', status: 200, durationMs: 1, startedAt }),
    ).toBe(false);
    expect(
      await recordResult(ctx.db, second!, { outcome: 'error', status: 410, durationMs: 1, startedAt }),
    ).toBe(true);
    const [row] = await deliveryRows(ctx, subscriptionIds);
    expect(row).toMatchObject({ status: 'error', attempts: 2, last_status: 410, claim_id: null });
  });

  it('fans each event out once however many fan-outs run at the same time', async () => {
    const other = await createContext(ctx.config, { schema: ctx.database.schema!, busPrefix: 'fan-other:' });
    try {
      const { subscriptionIds } = await subscribeAndDeposit(ctx, '/fan', 30, 3);
      const results = await Promise.all([fanOut(ctx, 7), fanOut(other, 7), fanOut(ctx, 7), fanOut(other, 7)]);
      let total = results.reduce((n, r) => n + r.events, 0);
      for (let r = await fanOut(ctx, 7); r.events > 0; r = await fanOut(ctx, 7)) total += r.events;
      expect(total).toBeGreaterThanOrEqual(30);
      const rows = await deliveryRows(ctx, subscriptionIds);
      expect(rows).toHaveLength(90);
      expect(new Set(rows.map((r) => `${r.subscription_id}/${r.event_id}`)).size).toBe(90);
    } finally {
      await other.close();
    }
  });

  it('rolls a failed fan-out back whole: events stay undispatched, no delivery half-made', async () => {
    const { subscriptionIds } = await subscribeAndDeposit(ctx, '/fan-fail', 3, 2);
    // The second delivery insert of the batch fails, as a crash between the statements would.
    await sql
      .raw(`CREATE FUNCTION fail_fanout() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'fan-out interrupted'; END $$`)
      .execute(ctx.db);
    await sql
      .raw(
        `CREATE TRIGGER fail_fanout BEFORE INSERT ON webhook_deliveries FOR EACH ROW
         WHEN (NEW.subscription_id = '${subscriptionIds[1]}') EXECUTE FUNCTION fail_fanout()`,
      )
      .execute(ctx.db);
    try {
      await expect(fanOut(ctx)).rejects.toThrow(/fan-out interrupted/);
      expect(await deliveryRows(ctx, subscriptionIds)).toHaveLength(0);
      const undispatched = await ctx.db
        .selectFrom('events')
        .select('id')
        .where('dispatched_at', 'is', null)
        .execute();
      expect(undispatched.length).toBeGreaterThanOrEqual(3);
    } finally {
      await sql.raw('DROP TRIGGER fail_fanout ON webhook_deliveries').execute(ctx.db);
      await sql.raw('DROP FUNCTION fail_fanout()').execute(ctx.db);
    }
    while ((await fanOut(ctx)).events > 0) {}
    const rows = await deliveryRows(ctx, subscriptionIds);
    expect(rows).toHaveLength(6);
    expect(new Set(rows.map((r) => `${r.subscription_id}/${r.event_id}`)).size).toBe(6);
  });

  it('stop() lets a request finish within the grace period, then aborts it for a later retry', async () => {
    const path = '/stop-grace';
    hangOnce.add(path);
    const worker = startDeliveryWorker(ctx);
    const { subscriptionIds } = await subscribeAndDeposit(ctx, path);
    await receiver.waitFor((all) => all.some((r) => r.path === path));
    const started = Date.now();
    await worker.stop(300);
    expect(Date.now() - started).toBeLessThan(3000);
    const [row] = await deliveryRows(ctx, subscriptionIds);
    expect(row).toMatchObject({ status: 'pending', attempts: 1, claim_id: null });
    expect(row!.last_error).toMatch(/^aborted/);
    expect(row!.next_attempt_at.getTime()).toBeLessThanOrEqual(Date.now());
  });
});
