import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { eventually } from '../helpers/eventually.ts';
import {
  type Received,
  type Receiver,
  type Reply,
  startReceiver,
  type TestCa,
} from '../helpers/https-receiver.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';
import { startWebhookBench, type WebhookBench } from './fixture.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };

let ca: TestCa;
let server: TestServer;
let receiver: Receiver;
let worker: DeliveryWorker;
const logLines: string[] = [];

/** Per-path scripted answers: each request to the path takes the next reply; the last one repeats. */
const scripts = new Map<string, Reply[]>();
const hits = new Map<string, number>();

let bench: WebhookBench<TestServer>;

beforeAll(async () => {
  bench = await startWebhookBench(
    (env) => startTestServer(env),
    {
      WEBHOOK_ALLOW_HTTP: 'false',
      WEBHOOK_BACKOFF_BASE_MS: '60',
      WEBHOOK_MAX_ATTEMPTS: '3',
      WEBHOOK_TIMEOUT_MS: '800',
      WEBHOOK_POLL_INTERVAL_MS: '200',
    },
    (r) => {
      const path = r.path;
      const n = hits.get(path) ?? 0;
      hits.set(path, n + 1);
      const script = scripts.get(path) ?? [{ status: 200, body: 'thanks' }];
      return script[Math.min(n, script.length - 1)]!;
    },
  );
  ({ ca, receiver, started: server } = bench);
  // Everything the worker logs, at the most verbose level, to check that no secret leaks.
  server.ctx.log = pino(
    { level: 'trace' },
    new Writable({
      write(chunk, _enc, cb) {
        logLines.push(String(chunk));
        cb();
      },
    }),
  );
  worker = startDeliveryWorker(server.ctx);
  await worker.ready;
});

afterAll(async () => {
  await worker?.stop(1000);
  await bench?.close();
});

interface Hook {
  id: string;
  secret: string;
  path: string;
}

async function subscribe(
  p: SeededProject,
  path: string,
  events: string[] = ['balance.*'],
  extra: Record<string, unknown> = {},
): Promise<Hook> {
  const res = await api(server, p.apiKey, 'POST', '/v1/webhooks/subscriptions', {
    url: `${receiver.url}${path}`,
    events,
    ...extra,
  });
  expect(res.status).toBe(201);
  const { id, secret } = res.body.subscription;
  receiver.secrets.set(id, secret);
  return { id, secret, path };
}

async function depositTo(p: SeededProject, user = 'alice', amount = '1.00') {
  const project: Project = await getProject(server.ctx.db, p.projectId);
  return server.ctx.billing.deposit({
    project,
    externalId: user,
    amount,
    source: 'test',
    trigger,
  });
}

const at = (path: string) => (all: Received[]) => all.filter((r) => r.path === path);

async function logOf(p: SeededProject, deliveryId: string) {
  const res = await api(server, p.apiKey, 'GET', `/v1/webhooks/logs/${deliveryId}`);
  expect(res.status).toBe(200);
  return res.body;
}

const finished = (p: SeededProject, id: string) =>
  eventually(async () => {
    const log = await logOf(p, id);
    return log.status !== 'pending' ? log : undefined;
  });

describe('delivery over HTTPS', () => {
  it('POSTs the signed {delivery, event} with custom headers; success updates the subscription', async () => {
    const p = await seedProject(server.ctx);
    const hook = await subscribe(p, '/ok', ['balance.*'], { customHeaders: { 'X-Team': 'billing' } });
    const before = Date.now();
    const { event } = await depositTo(p, 'alice', '2.50');
    expect(event).toBeDefined();
    const [req] = at('/ok')(await receiver.waitFor((all) => at('/ok')(all).length >= 1));
    expect(req!.verified).toBe(true);
    expect(req!.headers['content-type']).toBe('application/json');
    expect(req!.headers['x-service-event']).toBe('balance.deposit.created@1.0');
    expect(req!.headers['x-team']).toBe('billing');
    expect(req!.headers['x-service-signature']).toMatch(/^[0-9a-f]{64}$/);
    const ts = Date.parse(String(req!.headers['x-service-timestamp']));
    expect(ts).toBeGreaterThanOrEqual(before - 1000);
    expect(new Date(ts).toISOString()).toBe(req!.headers['x-service-timestamp']);
    const { delivery, event: sent } = req!.body;
    expect(delivery).toMatchObject({ subscriptionId: hook.id, attempts: 1 });
    expect(delivery.id).toMatch(/^dlv_/);
    expect(Object.keys(delivery).sort()).toEqual([
      'attempts',
      'createdAt',
      'id',
      'subscriptionId',
      'updatedAt',
    ]);
    expect(sent).toMatchObject({
      id: event!.id,
      paywallId: p.projectId,
      type: 'balance.deposit.created',
      version: '1.0',
      status: 'pending',
      trigger,
      data: { amount: '2.50', externalUserId: 'alice' },
    });
    expect(Object.keys(sent)).toEqual([
      'id',
      'paywallId',
      'ownerUserId',
      'type',
      'version',
      'status',
      'createdAt',
      'trigger',
      'subject',
      'data',
      'metadata',
    ]);

    const log = await finished(p, delivery.id);
    expect(log).toMatchObject({
      id: delivery.id,
      subscriptionId: hook.id,
      eventId: event!.id,
      eventType: 'balance.deposit.created',
      status: 'success',
      attempts: 1,
      nextAttemptAt: null,
      lastResponseStatus: 200,
      lastResponseBody: 'thanks',
      lastError: null,
    });
    expect(log.payload).toEqual(sent);
    expect(log.attemptLog).toHaveLength(1);
    expect(log.attemptLog[0]).toMatchObject({ attempt: 1, outcome: 'success', responseStatus: 200 });
    const sub = (await api(server, p.apiKey, 'GET', `/v1/webhooks/subscriptions/${hook.id}`)).body
      .subscription;
    expect(sub.consecutiveFailures).toBe(0);
    expect(Date.parse(sub.lastDeliveredAt)).toBeGreaterThanOrEqual(before - 1000);

    // Neither the secret nor any signature ever reached the logs.
    const text = logLines.join('');
    expect(text).toContain('webhook attempt');
    expect(text).not.toContain(hook.secret);
    expect(text).not.toContain(String(req!.headers['x-service-signature']));
  });

  it.each([400, 401, 403, 404, 410, 422])('ends at once on %i without retrying', async (status) => {
    const p = await seedProject(server.ctx);
    const path = `/permanent-${status}`;
    scripts.set(path, [{ status, body: 'no such hook' }]);
    await subscribe(p, path);
    await depositTo(p);
    const [req] = await receiver.waitFor((all) => at(path)(all).length >= 1);
    const id = at(path)(receiver.received)[0]!.body.delivery.id;
    const log = await finished(p, id);
    expect(log).toMatchObject({ status: 'error', attempts: 1, lastResponseStatus: status });
    expect(log.lastResponseBody).toBe('no such hook');
    expect(req).toBeDefined();
    expect(at(path)(receiver.received)).toHaveLength(1);
    const sub = (await api(server, p.apiKey, 'GET', `/v1/webhooks/subscriptions/${log.subscriptionId}`)).body
      .subscription;
    expect(sub.consecutiveFailures).toBe(1);
  });

  it('retries other failures with growing backoff, same delivery id, and recovers', async () => {
    const p = await seedProject(server.ctx);
    const path = '/flaky';
    scripts.set(path, [{ status: 500 }, { status: 302, headers: { location: '/ok' } }, { status: 204 }]);
    const hook = await subscribe(p, path);
    await depositTo(p);
    const reqs = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 3));
    expect(reqs.map((r) => r.body.delivery.attempts)).toEqual([1, 2, 3]);
    expect(new Set(reqs.map((r) => r.body.delivery.id)).size).toBe(1);
    expect(reqs.every((r) => r.verified)).toBe(true);
    // base 60 ms ±20 %, doubling: ≥ 48 ms, then ≥ 96 ms
    expect(reqs[1]!.at - reqs[0]!.at).toBeGreaterThanOrEqual(45);
    expect(reqs[2]!.at - reqs[1]!.at).toBeGreaterThanOrEqual(90);
    // Redirects are not followed.
    expect(at('/ok')(receiver.received).some((r) => r.body.delivery.subscriptionId === hook.id)).toBe(false);
    const log = await finished(p, reqs[0]!.body.delivery.id);
    expect(log).toMatchObject({ status: 'success', attempts: 3, lastResponseStatus: 204 });
    expect(
      log.attemptLog.map((a: { outcome: string; responseStatus: number }) => [a.outcome, a.responseStatus]),
    ).toEqual([
      ['retry', 500],
      ['retry', 302],
      ['success', 204],
    ]);
    const sub = (await api(server, p.apiKey, 'GET', `/v1/webhooks/subscriptions/${hook.id}`)).body
      .subscription;
    expect(sub.consecutiveFailures).toBe(0);
    expect(sub.lastDeliveredAt).not.toBeNull();
  });

  it('gives up after WEBHOOK_MAX_ATTEMPTS and counts consecutive failures', async () => {
    const p = await seedProject(server.ctx);
    const path = '/down';
    scripts.set(path, [{ status: 503, body: 'x'.repeat(100_000) }]);
    const hook = await subscribe(p, path);
    await depositTo(p);
    const reqs = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 3));
    const log = await finished(p, reqs[0]!.body.delivery.id);
    expect(log).toMatchObject({ status: 'error', attempts: 3, lastResponseStatus: 503 });
    expect(log.lastResponseBody.length).toBe(2048);
    const sub = (await api(server, p.apiKey, 'GET', `/v1/webhooks/subscriptions/${hook.id}`)).body
      .subscription;
    expect(sub.consecutiveFailures).toBe(3);
    expect(sub.lastDeliveredAt).toBeNull();
  });

  it('treats time-outs and refused connections as retryable failures', async () => {
    const p = await seedProject(server.ctx);
    scripts.set('/hang', [{ status: 200, hang: true }]);
    await subscribe(p, '/hang');
    // A port nobody listens on: take a receiver's port, then close it.
    const gone = await startReceiver(ca);
    const deadUrl = gone.url;
    await gone.close();
    const dead = await api(server, p.apiKey, 'POST', '/v1/webhooks/subscriptions', {
      url: `${deadUrl}/nobody`,
      events: ['balance.*'],
    });
    await depositTo(p);
    const reqs = at('/hang')(await receiver.waitFor((all) => at('/hang')(all).length >= 3));
    const hangLog = await finished(p, reqs[0]!.body.delivery.id);
    expect(hangLog).toMatchObject({ status: 'error', attempts: 3, lastResponseStatus: null });
    expect(hangLog.lastError).toMatch(/^timeout/);
    expect(hangLog.durationMs).toBeGreaterThanOrEqual(700);
    const deadLogs = await api(
      server,
      p.apiKey,
      'GET',
      `/v1/webhooks/logs?subscriptionId=${dead.body.subscription.id}`,
    );
    const deadLog = await finished(p, deadLogs.body.data[0].id);
    expect(deadLog).toMatchObject({ status: 'error', attempts: 3 });
    expect(deadLog.lastError).toMatch(/^connection error: ECONNREFUSED/);
  });

  it('honours Retry-After on 429 and 503', async () => {
    const p = await seedProject(server.ctx);
    const path = '/busy';
    scripts.set(path, [{ status: 429, headers: { 'retry-after': '1' } }, { status: 200 }]);
    await subscribe(p, path);
    await depositTo(p);
    const reqs = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 2));
    // The backoff alone would retry after ~60 ms.
    expect(reqs[1]!.at - reqs[0]!.at).toBeGreaterThanOrEqual(950);
    expect((await finished(p, reqs[0]!.body.delivery.id)).status).toBe('success');
  });
});

describe('subscription state and metrics', () => {
  it('ends pending deliveries of a deactivated subscription without sending them', async () => {
    const p = await seedProject(server.ctx);
    const path = '/deactivated';
    // The first attempt is told to come back in 2 s; the subscription is deactivated meanwhile.
    scripts.set(path, [{ status: 503, headers: { 'retry-after': '2' } }, { status: 200 }]);
    const hook = await subscribe(p, path);
    await depositTo(p);
    const [first] = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 1));
    await api(server, p.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${hook.id}`);
    const log = await finished(p, first!.body.delivery.id);
    expect(log).toMatchObject({ status: 'error', lastError: 'the subscription is inactive' });
    expect(at(path)(receiver.received)).toHaveLength(1);
  });

  it('counts deliveries, attempts and fanned-out events in the metrics', async () => {
    const p = await seedProject(server.ctx);
    scripts.set('/metrics-flaky', [{ status: 500 }, { status: 200 }]);
    scripts.set('/metrics-gone', [{ status: 410 }]);
    await subscribe(p, '/metrics-flaky');
    await subscribe(p, '/metrics-gone');
    await depositTo(p);
    const reqs = await receiver.waitFor(
      (all) => at('/metrics-flaky')(all).length >= 2 && at('/metrics-gone')(all).length >= 1,
    );
    await finished(p, at('/metrics-flaky')(reqs)[0]!.body.delivery.id);
    await finished(p, at('/metrics-gone')(reqs)[0]!.body.delivery.id);
    const text = await server.ctx.metrics.registry.metrics();
    expect(text).toMatch(/tollgate_webhook_deliveries_total\{project="pw_[^"]+",outcome="success"\} [1-9]/);
    expect(text).toMatch(/tollgate_webhook_deliveries_total\{project="pw_[^"]+",outcome="retry"\} [1-9]/);
    expect(text).toMatch(/tollgate_webhook_delivery_attempts_count\{outcome="error"\} [1-9]/);
    expect(text).toMatch(/tollgate_events_fanned_out_total [1-9]/);
    expect(text).toMatch(/tollgate_webhook_delivery_duration_seconds_count\{outcome="success"\} [1-9]/);
  });
});

describe('fan-out', () => {
  it('makes one delivery per matching active subscription', async () => {
    const p = await seedProject(server.ctx);
    const hooks = {
      all: await subscribe(p, '/m-all', ['*']),
      group: await subscribe(p, '/m-group', ['balance.*']),
      exact: await subscribe(p, '/m-exact', ['balance.deposit.created']),
      several: await subscribe(p, '/m-several', ['user.connected', 'balance.deposit.created']),
      users: await subscribe(p, '/m-users', ['user.*']),
      charges: await subscribe(p, '/m-charges', ['balance.charge.created']),
      prefix: await subscribe(p, '/m-prefix', ['balance.deposit']),
      inactive: await subscribe(p, '/m-inactive', ['*']),
    };
    await api(server, p.apiKey, 'DELETE', `/v1/webhooks/subscriptions/${hooks.inactive.id}`);
    const { event } = await depositTo(p);
    const wanted = ['/m-all', '/m-group', '/m-exact', '/m-several'];
    await receiver.waitFor((all) =>
      wanted.every((w) => at(w)(all).some((r) => r.body.event.id === event!.id)),
    );
    const rows = await server.ctx.db
      .selectFrom('webhook_deliveries')
      .select('subscription_id')
      .where('event_id', '=', event!.id)
      .execute();
    expect(rows.map((r) => r.subscription_id).sort()).toEqual(
      [hooks.all.id, hooks.group.id, hooks.exact.id, hooks.several.id].sort(),
    );
    const dispatched = await server.ctx.db
      .selectFrom('events')
      .select('dispatched_at')
      .where('id', '=', event!.id)
      .executeTakeFirstOrThrow();
    expect(dispatched.dispatched_at).not.toBeNull();
  });
});

describe('delivery logs', () => {
  it('filters, pages newest first, validates limit, and stays within the project', async () => {
    const p = await seedProject(server.ctx);
    const other = await seedProject(server.ctx);
    scripts.set('/logs-bad', [{ status: 410 }]);
    const good = await subscribe(p, '/logs-good');
    const bad = await subscribe(p, '/logs-bad');
    for (let i = 0; i < 3; i++) await depositTo(p, `u${i}`);
    const ids = await eventually(async () => {
      const res = await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?limit=100');
      const done = res.body.data.filter((d: { status: string }) => d.status !== 'pending');
      return done.length === 6 ? res.body.data.map((d: { id: string }) => d.id) : undefined;
    });
    expect(ids).toEqual([...ids].sort().reverse());

    const byStatus = await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?status=error');
    expect(byStatus.body.data).toHaveLength(3);
    expect(byStatus.body.data.every((d: { subscriptionId: string }) => d.subscriptionId === bad.id)).toBe(
      true,
    );
    const bySub = await api(
      server,
      p.apiKey,
      'GET',
      `/v1/webhooks/logs?subscriptionId=${good.id}&status=success`,
    );
    expect(bySub.body.data).toHaveLength(3);
    const byType = await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?eventType=user.connected');
    expect(byType.body.data).toHaveLength(0);
    const page1 = await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?limit=4');
    expect(page1.body).toMatchObject({ object: 'list', has_more: true });
    const page2 = await api(
      server,
      p.apiKey,
      'GET',
      `/v1/webhooks/logs?limit=4&starting_after=${page1.body.data[3].id}`,
    );
    expect(page2.body.has_more).toBe(false);
    expect([...page1.body.data, ...page2.body.data].map((d: { id: string }) => d.id)).toEqual(ids);

    for (const q of ['limit=0', 'limit=101', 'limit=abc', 'limit=2.5']) {
      const res = await api(server, p.apiKey, 'GET', `/v1/webhooks/logs?${q}`);
      expect(res.status).toBe(400);
      expect(res.body.error.param).toBe('limit');
    }
    expect((await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?status=done')).body.error.param).toBe(
      'status',
    );
    expect((await api(server, p.apiKey, 'GET', '/v1/webhooks/logs?foo=1')).status).toBe(400);

    const theirs = await api(server, other.apiKey, 'GET', '/v1/webhooks/logs?limit=100');
    expect(theirs.body.data).toHaveLength(0);
    expect((await api(server, other.apiKey, 'GET', `/v1/webhooks/logs/${ids[0]}`)).status).toBe(404);
    expect((await api(server, other.apiKey, 'POST', `/v1/webhooks/logs/${ids[0]}/retry`)).status).toBe(404);
  });

  it('re-sends a finished delivery as a new attempt with the same id; refuses a pending one', async () => {
    const p = await seedProject(server.ctx);
    const path = '/manual';
    scripts.set(path, [{ status: 410 }, { status: 200 }]);
    await subscribe(p, path);
    await depositTo(p);
    const [first] = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 1));
    const id = first!.body.delivery.id;
    expect((await finished(p, id)).status).toBe('error');
    const retried = await api(server, p.apiKey, 'POST', `/v1/webhooks/logs/${id}/retry`);
    expect(retried.status).toBe(202);
    expect(retried.body).toMatchObject({ id, status: 'pending' });
    const reqs = at(path)(await receiver.waitFor((all) => at(path)(all).length >= 2));
    expect(reqs[1]!.body.delivery).toMatchObject({ id, attempts: 2 });
    expect(reqs[1]!.verified).toBe(true);
    const log = await finished(p, id);
    expect(log).toMatchObject({ status: 'success', attempts: 2 });
    expect(log.attemptLog.map((a: { outcome: string }) => a.outcome)).toEqual(['error', 'success']);

    scripts.set('/slow-manual', [{ status: 200, hang: true }]);
    await subscribe(p, '/slow-manual', ['user.*']);
    const ping = await api(server, p.apiKey, 'GET', '/v1/webhooks/subscriptions?status=active');
    const slowId = ping.body.data.find((s: { url: string }) => s.url.endsWith('/slow-manual')).id;
    const test = await api(server, p.apiKey, 'POST', `/v1/webhooks/subscriptions/${slowId}/test`);
    await receiver.waitFor((all) => at('/slow-manual')(all).length >= 1);
    const busy = await api(server, p.apiKey, 'POST', `/v1/webhooks/logs/${test.body.id}/retry`);
    expect(busy.status).toBe(409);
    expect(busy.body.error.code).toBe('delivery_pending');
  });

  it('sends a test ping to one subscription only', async () => {
    const p = await seedProject(server.ctx);
    const hook = await subscribe(p, '/ping', ['user.disconnected']);
    await subscribe(p, '/ping-other', ['*']);
    const res = await api(server, p.apiKey, 'POST', `/v1/webhooks/subscriptions/${hook.id}/test`);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ subscriptionId: hook.id, eventType: 'webhook.test', status: 'pending' });
    const [req] = at('/ping')(await receiver.waitFor((all) => at('/ping')(all).length >= 1));
    expect(req!.verified).toBe(true);
    expect(req!.headers['x-service-event']).toBe('webhook.test@1.0');
    expect(req!.body.event.data).toMatchObject({ subscriptionId: hook.id });
    expect((await finished(p, res.body.id)).status).toBe('success');
    expect(at('/ping-other')(receiver.received)).toHaveLength(0);
  });
});
