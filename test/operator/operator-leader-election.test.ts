import { type ChildProcess, spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import type { WebhookSubscription } from '../../src/operator/resources/webhook-subscription.ts';
import { type KubeClients, makeClients } from '../../src/operator/runtime/kube.ts';
import { getProject } from '../../src/projects/service.ts';
import { subscriptionsChanged } from '../../src/webhooks/subscriptions.ts';
import { createTestContext, newTestId, realPostgres, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';
import { type KubeTarget, kubeTarget } from '../helpers/fake-kube-apiserver.ts';
import { depositFor, seedProject } from '../helpers/server.ts';
import { createWebhookSubscription } from './fixture.ts';

/**
 * Two and three operator processes against one API server: exactly one leads; kill -9 the leader and
 * another takes the Lease once it expires, and deliveries go on without loss; SIGTERM hands the Lease
 * over at once. Each replica is a real process (test/helpers/operator-child.ts) with the real worker.
 */

const LEASE_SECONDS = 3;
const RETRY_SECONDS = 1;
const LEASE_NAME = 'tollgate-operator';

interface Replica {
  identity: string;
  child: ChildProcess;
  /** The replica runs (it campaigns from here on). */
  started: Promise<void>;
  /** The replica got SIGTERM and shuts down. */
  stopping: Promise<void>;
  exited: Promise<number | null>;
  stderr: string[];
}

interface Received {
  deliveryId: string;
  eventId: string;
  signatureOk: boolean;
}

let target: KubeTarget;
let ctx: AppContext;
let kube: KubeClients;
let ns: string;
let paywallId: string;
let testId: string;
let receiver: Server;
let receiverUrl: string;
const replicas: Replica[] = [];
const leading = new Set<string>();
let mostLeadersAtOnce = 0;

// ---- the webhook receiver --------------------------------------------------------------------------
const receiverEvents = new EventEmitter();
const acked: Received[] = [];
const held: Array<{ res: ServerResponse; record: Received }> = [];
let holding = false;
let signingSecret = '';

function startReceiver(): Promise<void> {
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const body = JSON.parse(raw.toString('utf8')) as { delivery: { id: string }; event: { id: string } };
      const expected = createHmac('sha256', signingSecret).update(raw).digest('hex');
      const record = {
        deliveryId: body.delivery.id,
        eventId: body.event.id,
        signatureOk: req.headers['x-service-signature'] === expected,
      };
      if (holding) {
        held.push({ res, record });
        receiverEvents.emit('change');
        return;
      }
      res.writeHead(200).end('ok');
      acked.push(record);
      receiverEvents.emit('change');
    });
  });
  return new Promise((resolve) =>
    receiver.listen(0, '127.0.0.1', () => {
      receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hooks`;
      resolve();
    }),
  );
}

function receiverUntil(check: () => boolean, what: string, timeoutMs = 15_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      receiverEvents.off('change', attempt);
      reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
    }, timeoutMs);
    function attempt() {
      if (!check()) return;
      clearTimeout(timer);
      receiverEvents.off('change', attempt);
      resolve();
    }
    receiverEvents.on('change', attempt);
    attempt();
  });
}

// ---- replicas -------------------------------------------------------------------------------------

function startReplica(identity: string): Replica {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    LOG_LEVEL: 'warn',
    TEST_ID: testId,
    POD_NAME: identity,
    WATCH_NAMESPACE: ns,
    DATABASE_URL: process.env.TOLLGATE_TEST_PG ?? '',
    REDIS_URL: process.env.TOLLGATE_TEST_REDIS ?? '',
    TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    TOLLGATE_DATA_DIR: `/tmp/tollgate-operator-${testId}`,
    WEBHOOK_ALLOW_HTTP: 'true',
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
    WEBHOOK_CLAIM_LEASE_MS: '1000',
    WEBHOOK_POLL_INTERVAL_MS: '100',
    WEBHOOK_BACKOFF_BASE_MS: '50',
    OPERATOR_LEASE_NAME: LEASE_NAME,
    OPERATOR_LEASE_NAMESPACE: ns,
    OPERATOR_LEASE_DURATION_SECONDS: String(LEASE_SECONDS),
    OPERATOR_RENEW_DEADLINE_SECONDS: '2',
    OPERATOR_RETRY_PERIOD_SECONDS: String(RETRY_SECONDS),
    OPERATOR_STATUS_SYNC_SECONDS: '1',
    OPERATOR_SHUTDOWN_GRACE_SECONDS: '2',
    ...(target.fake ? { FAKE_KUBE_SERVER: target.fake.url } : { KUBECONFIG: process.env.KUBECONFIG ?? '' }),
  };
  const child = spawn(process.execPath, [new URL('../helpers/operator-child.ts', import.meta.url).pathname], {
    env,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const stderr: string[] = [];
  createInterface({ input: child.stderr! }).on('line', (line) => stderr.push(line));
  let onStarted = () => {};
  let onStopping = () => {};
  const started = new Promise<void>((resolve) => {
    onStarted = resolve;
  });
  const stopping = new Promise<void>((resolve) => {
    onStopping = resolve;
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    const report = JSON.parse(line) as {
      identity: string;
      leading?: boolean;
      started?: boolean;
      stopping?: boolean;
    };
    if (report.started) onStarted();
    if (report.stopping) onStopping();
    if (report.leading === true) leading.add(report.identity);
    if (report.leading === false) leading.delete(report.identity);
    mostLeadersAtOnce = Math.max(mostLeadersAtOnce, leading.size);
  });
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => {
      leading.delete(identity);
      resolve(code);
    }),
  );
  const replica = { identity, child, started, stopping, exited, stderr };
  replicas.push(replica);
  return replica;
}

async function holder(): Promise<string | undefined> {
  try {
    const lease = await kube.coordination.readNamespacedLease({ name: LEASE_NAME, namespace: ns });
    return lease.spec?.holderIdentity || undefined;
  } catch {
    return undefined;
  }
}

const untilHolder = (identity: string, timeoutMs?: number) =>
  target.until(async () => (await holder()) === identity, `${identity} to hold the lease`, timeoutMs);

async function depositEvents(count: number): Promise<void> {
  const project = await getProject(ctx.db, paywallId);
  for (let i = 0; i < count; i++)
    await depositFor(ctx, project, 'user-1', '1.00', { source: 'test', actorType: 'admin', actorId: 'test' });
}

async function recordedEventIds(): Promise<string[]> {
  const rows = await ctx.db
    .selectFrom('events')
    .select('id')
    .where('type', '=', 'balance.deposit.created')
    .execute();
  return rows.map((r) => r.id);
}

const ackedEventIds = () => new Set(acked.map((a) => a.eventId));

beforeAll(async () => {
  testId = newTestId();
  target = await kubeTarget('tg-leader');
  ns = target.namespace;
  kube = makeClients(target.kubeConfig);
  ctx = await createTestContext({}, { id: testId });
  ({ projectId: paywallId } = await seedProject(ctx));
  await startReceiver();
});

afterAll(async () => {
  for (const r of replicas)
    if (r.child.exitCode === null && r.child.signalCode === null) r.child.kill('SIGKILL');
  await Promise.all(replicas.map((r) => r.exited));
  for (const h of held) h.res.destroy();
  receiver?.closeAllConnections();
  await new Promise<void>((resolve) => (receiver ? receiver.close(() => resolve()) : resolve()));
  await ctx?.close();
  await target?.close();
});

describe.skipIf(!realPostgres)('operator leader election across processes', () => {
  it('elects exactly one leader, which reconciles and delivers', async () => {
    startReplica('op-a');
    await untilHolder('op-a');
    startReplica('op-b');
    await createWebhookSubscription(kube, ns, 'deliveries', {
      paywallId,
      url: receiverUrl,
      events: ['balance.*'],
    });
    const ready = await target.until(async () => {
      const r = (await kube.custom.getNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns,
        plural: PLURAL,
        name: 'deliveries',
      })) as WebhookSubscription;
      return r.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ? r : undefined;
    }, 'the subscription to be Ready');
    expect(ready.status?.subscriptionId).toMatch(/^whsub_/);
    const secret = await kube.core.readNamespacedSecret({ name: 'deliveries-webhook-secret', namespace: ns });
    signingSecret = Buffer.from(secret.data?.secret ?? '', 'base64').toString();
    await subscriptionsChanged(ctx, paywallId);

    await depositEvents(3);
    await receiverUntil(() => ackedEventIds().size === 3, '3 deliveries');
    expect(acked.every((a) => a.signatureOk)).toBe(true);
    expect(await holder()).toBe('op-a');
    expect(mostLeadersAtOnce).toBe(1);
  });

  it('fails over within the lease duration when the leader is killed, and loses no delivery', async () => {
    const [a] = replicas;
    holding = true;
    await depositEvents(3);
    // The leader has deliveries in flight when it dies.
    await receiverUntil(() => held.length > 0, 'a delivery in flight');
    const killedAt = Date.now();
    a!.child.kill('SIGKILL');
    await a!.exited;
    holding = false;
    for (const h of held.splice(0)) h.res.destroy();

    await untilHolder('op-b', 15_000);
    const takeoverMs = Date.now() - killedAt;
    // The lease expires LEASE_SECONDS after the standby last saw it renewed (at most a retry period
    // before the kill), and the standby notices at its next retry: never before the lease ran out, and
    // within the lease duration plus two retry periods (plus slack for a loaded machine).
    expect(takeoverMs).toBeGreaterThanOrEqual((LEASE_SECONDS - RETRY_SECONDS) * 1000 - 100);
    expect(takeoverMs).toBeLessThan((LEASE_SECONDS + 2 * RETRY_SECONDS) * 1000 + 3000);

    const expected = await recordedEventIds();
    expect(expected).toHaveLength(6);
    await receiverUntil(
      () => expected.every((id) => ackedEventIds().has(id)),
      'every event delivered',
      20_000,
    );
    expect(acked.every((a) => a.signatureOk)).toBe(true);
    expect(mostLeadersAtOnce).toBe(1);
  });

  it('on SIGTERM finishes the delivery in flight, then hands the lease over at once', async () => {
    const b = replicas[1]!;
    const c = startReplica('op-c');
    await c.started;
    holding = true;
    await depositEvents(1);
    await receiverUntil(() => held.length === 1, 'a delivery in flight');
    const inFlight = held.shift()!;
    const stoppedAt = Date.now();
    b.child.kill('SIGTERM');
    await b.stopping;
    // Answered half a second into the 2 s shutdown grace period (no signal marks "in the grace period"
    // from outside the process): the leader waits for it and records it before letting go.
    await new Promise((resolve) => setTimeout(resolve, 500));
    holding = false;
    inFlight.res.writeHead(200).end('ok');
    acked.push(inFlight.record);
    expect(await b.exited).toBe(0);
    // Recorded as sent, once, before the old leader exited.
    const delivery = await ctx.db
      .selectFrom('webhook_deliveries')
      .select(['status', 'attempts'])
      .where('id', '=', inFlight.record.deliveryId)
      .executeTakeFirstOrThrow();
    expect(delivery).toEqual({ status: 'success', attempts: 1 });
    if (target.fake) {
      // It released the lease (no holder) on its way out.
      const release = target.fake.requests.find(
        (r) =>
          r.method === 'PUT' &&
          r.path.endsWith(`/leases/${LEASE_NAME}`) &&
          r.status === 200 &&
          (r.body as { spec?: { holderIdentity?: string } }).spec?.holderIdentity === '',
      );
      expect(release).toBeDefined();
    }
    await untilHolder('op-c', 10_000);
    // Without waiting for the lease to expire (slack for a loaded machine included).
    expect(Date.now() - stoppedAt).toBeLessThan((LEASE_SECONDS + RETRY_SECONDS) * 1000);

    await depositEvents(1);
    const expected = await recordedEventIds();
    await receiverUntil(() => expected.every((id) => ackedEventIds().has(id)), 'the event after hand-over');
    // The delivery finished during the grace period was not sent again by the new leader.
    expect(acked.filter((a) => a.deliveryId === inFlight.record.deliveryId)).toHaveLength(1);
    expect(mostLeadersAtOnce).toBe(1);
  });
});
