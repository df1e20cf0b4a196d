import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { disableFailingSubscriptions } from '../../src/webhooks/health.ts';
import {
  createSubscription,
  getSubscription,
  setSubscriptionActive,
} from '../../src/webhooks/subscriptions.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { createTestContext } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * Endpoint health: a subscription failing continuously for WEBHOOK_DISABLE_AFTER_HOURS is disabled with
 * a reason, an event and a metric; re-enabling clears it. Real worker, real Postgres, HTTP on loopback.
 */

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
let ctx: AppContext;
let server: Server;
let base: string;
let worker: DeliveryWorker;
let downAnswers = 500;
const watched: Array<{ type: string; data: Record<string, unknown> }> = [];
const listeners = new Set<() => void>();

function until<T>(check: () => Promise<T | undefined | false>, what: string, timeoutMs = 10_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + timeoutMs;
    const attempt = async () => {
      const value = await check();
      if (value !== undefined && value !== false) return resolve(value);
      if (Date.now() > deadline) return reject(new Error(`timed out waiting for ${what}`));
      // Re-checked on every request the receiver answers, and by the worker's poll.
      const once = () => {
        listeners.delete(once);
        clearTimeout(timer);
        void attempt();
      };
      const timer = setTimeout(once, 100);
      listeners.add(once);
    };
    void attempt();
  });
}

beforeAll(async () => {
  ctx = await createTestContext({
    WEBHOOK_BACKOFF_BASE_MS: '20',
    WEBHOOK_MAX_ATTEMPTS: '2',
    WEBHOOK_POLL_INTERVAL_MS: '50',
    WEBHOOK_DISABLE_AFTER_HOURS: '120',
  });
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/watcher') {
        const { event } = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        watched.push({ type: event.type, data: event.data });
        res.writeHead(200).end();
      } else res.writeHead(req.url === '/down' ? downAnswers : 200).end();
      for (const l of [...listeners]) l();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  worker = startDeliveryWorker(ctx, { statsIntervalMs: 3_600_000 });
  await worker.ready;
});

afterAll(async () => {
  await worker?.stop(1000);
  server?.close();
  await ctx?.close();
});

const row = (id: string) =>
  ctx.db.selectFrom('webhook_subscriptions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

describe('endpoint health', () => {
  it('disables a subscription failing for WEBHOOK_DISABLE_AFTER_HOURS, with an event and a metric; re-enabling clears it', async () => {
    const p = await seedProject(ctx);
    const project = await getProject(ctx.db, p.projectId);
    const { subscription: down } = await createSubscription(
      ctx,
      p.projectId,
      { url: `${base}/down`, events: ['balance.*'] },
      { createdBy: 'test' },
    );
    await createSubscription(
      ctx,
      p.projectId,
      { url: `${base}/watcher`, events: ['webhook.subscription.*'] },
      { createdBy: 'test' },
    );
    await ctx.billing.deposit({ project, externalId: 'u1', amount: '1', source: 'test', trigger });
    ctx.events.wake();

    // Two failed attempts: failing since the first one.
    const failing = await until(async () => {
      const r = await row(down.id);
      return r.consecutive_failures >= 2 ? r : undefined;
    }, 'two failed attempts');
    expect(failing.failing_since).not.toBeNull();
    expect(failing.is_active).toBe(true);

    // Not failing long enough yet.
    expect(await disableFailingSubscriptions(ctx)).toBe(0);

    await sql`UPDATE webhook_subscriptions SET failing_since = now() - interval '121 hours' WHERE id = ${down.id}`.execute(
      ctx.db,
    );
    const before = (await ctx.metrics.subscriptionsDisabled.get()).values.reduce((n, v) => n + v.value, 0);
    expect(await disableFailingSubscriptions(ctx)).toBe(1);
    const after = (await ctx.metrics.subscriptionsDisabled.get()).values.reduce((n, v) => n + v.value, 0);
    expect(after - before).toBe(1);

    const view = await getSubscription(ctx, p.projectId, down.id);
    expect(view.isActive).toBe(false);
    expect(view.disabledReason).toMatch(/^every delivery attempt failed for 120 hours \(since .+Z\)$/);
    expect(view.disabledAt).not.toBeNull();
    // Run again: nothing more to disable.
    expect(await disableFailingSubscriptions(ctx)).toBe(0);

    // The event reaches the project's other subscribers.
    const event = await until(
      async () => watched.find((e) => e.type === 'webhook.subscription.disabled'),
      'the webhook.subscription.disabled event',
    );
    expect(event.data).toMatchObject({
      subscriptionId: down.id,
      url: `${base}/down`,
      reason: view.disabledReason,
      consecutiveFailures: 2,
    });

    // Re-enabling (the CLI's `tollgate webhooks enable`, or isActive: true through the API) clears it.
    await setSubscriptionActive(ctx, p.projectId, down.id, true);
    expect(await row(down.id)).toMatchObject({
      is_active: true,
      consecutive_failures: 0,
      failing_since: null,
      disabled_at: null,
      disabled_reason: null,
    });

    // A success ends the failing streak.
    downAnswers = 200;
    await ctx.billing.deposit({ project, externalId: 'u2', amount: '1', source: 'test', trigger });
    ctx.events.wake();
    const healthy = await until(async () => {
      const r = await row(down.id);
      return r.last_delivered_at ? r : undefined;
    }, 'a successful delivery');
    expect(healthy).toMatchObject({ failing_since: null, consecutive_failures: 0 });
  });

  it('never disables when WEBHOOK_DISABLE_AFTER_HOURS is 0', async () => {
    const never = { ...ctx, config: { ...ctx.config, WEBHOOK_DISABLE_AFTER_HOURS: 0 } } as AppContext;
    const p = await seedProject(ctx);
    const { subscription } = await createSubscription(
      ctx,
      p.projectId,
      { url: `${base}/down`, events: ['balance.*'] },
      { createdBy: 'test' },
    );
    await sql`UPDATE webhook_subscriptions SET failing_since = now() - interval '9999 hours' WHERE id = ${subscription.id}`.execute(
      ctx.db,
    );
    expect(await disableFailingSubscriptions(never)).toBe(0);
    expect((await row(subscription.id)).is_active).toBe(true);
    expect(await disableFailingSubscriptions(ctx)).toBe(1);
  });
});
