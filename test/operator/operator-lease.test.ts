import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { V1MicroTime } from '@kubernetes/client-node';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import type { WebhookSubscription } from '../../src/operator/resources/webhook-subscription.ts';
import { type KubeClients, makeClients } from '../../src/operator/runtime/kube.ts';
import { LeaderElector } from '../../src/operator/runtime/leader-election.ts';
import { bundledCommand } from '../helpers/bundle.ts';
import { childEnv, createTestContext, newTestId, realPostgres } from '../helpers/context.ts';
import { type KubeTarget, kubeTarget, realCluster } from '../helpers/fake-kube-apiserver.ts';
import { seedProject } from '../helpers/server.ts';
import { createWebhookSubscription } from './fixture.ts';

/**
 * Leader election on a coordination.k8s.io/v1 Lease, in process with short (millisecond) timings, and
 * the `tollgate operator` entry point as a process: flags, KUBECONFIG, /healthz, /readyz, /metrics,
 * SIGTERM releasing the lease.
 */

let target: KubeTarget;
let kube: KubeClients;
const log = pino({ level: 'silent' });
const electors: LeaderElector[] = [];

beforeAll(async () => {
  target = await kubeTarget('tg-lease');
  kube = makeClients(target.kubeConfig);
});

afterAll(async () => {
  await Promise.all(electors.map((e) => e.stop({ release: false })));
  await target?.close();
});

function candidate(
  lease: string,
  identity: string,
  timings: Partial<Record<'lease' | 'deadline' | 'retry', number>> = {},
) {
  const transitions: string[] = [];
  let onStarted = () => {};
  let onStopped = () => {};
  const started = new Promise<void>((resolve) => {
    onStarted = resolve;
  });
  const stopped = new Promise<void>((resolve) => {
    onStopped = resolve;
  });
  const elector = new LeaderElector({
    api: kube.coordination,
    name: lease,
    namespace: target.namespace,
    identity,
    leaseDurationMs: timings.lease ?? 1000,
    renewDeadlineMs: timings.deadline ?? 600,
    retryPeriodMs: timings.retry ?? 100,
    log,
    onStartedLeading: () => {
      transitions.push('started');
      onStarted();
    },
    onStoppedLeading: () => {
      transitions.push('stopped');
      onStopped();
    },
  });
  electors.push(elector);
  return { elector, transitions, started, stopped };
}

async function readLease(name: string) {
  return kube.coordination.readNamespacedLease({ name, namespace: target.namespace });
}

describe('leader election', () => {
  it('elects exactly one of two candidates and records it in the Lease', async () => {
    const a = candidate('pair', 'a');
    const b = candidate('pair', 'b');
    a.elector.start();
    b.elector.start();
    const leader = await Promise.race([a.started.then(() => 'a'), b.started.then(() => 'b')]);
    // Several renewals later there is still exactly one.
    const lease = await readLease('pair');
    await target.until(
      async () => (await readLease('pair')).metadata?.resourceVersion !== lease.metadata?.resourceVersion,
      'a renewal',
    );
    expect([a.elector.isLeader, b.elector.isLeader].filter(Boolean)).toHaveLength(1);
    const after = await readLease('pair');
    expect(after.spec).toMatchObject({
      holderIdentity: leader,
      leaseDurationSeconds: 1,
      leaseTransitions: 0,
    });
    await a.elector.stop();
    await b.elector.stop();
  });

  it('refuses a replace carrying a stale resourceVersion (409), so a slow candidate cannot win', async () => {
    const a = candidate('stale', 'a');
    a.elector.start();
    await a.started;
    const stale = await readLease('stale');
    await target.until(
      async () => (await readLease('stale')).metadata?.resourceVersion !== stale.metadata?.resourceVersion,
      'a renewal',
    );
    await expect(
      kube.coordination.replaceNamespacedLease({
        name: 'stale',
        namespace: target.namespace,
        body: { ...stale, spec: { ...stale.spec, holderIdentity: 'thief' } },
      }),
    ).rejects.toMatchObject({ code: 409 });
    expect((await readLease('stale')).spec?.holderIdentity).toBe('a');
    await a.elector.stop();
  });

  it('stops leading at once when another holder takes the lease', async () => {
    const a = candidate('stolen', 'a', { lease: 5000, deadline: 3000 });
    a.elector.start();
    await a.started;
    const current = await readLease('stolen');
    await kube.coordination.replaceNamespacedLease({
      name: 'stolen',
      namespace: target.namespace,
      body: {
        ...current,
        spec: { ...current.spec, holderIdentity: 'intruder', renewTime: new V1MicroTime() },
      },
    });
    const stolenAt = Date.now();
    await a.stopped;
    expect(a.elector.isLeader).toBe(false);
    // Noticed at the next retry, long before the renew deadline.
    expect(Date.now() - stolenAt).toBeLessThan(2000);
    expect(a.transitions).toEqual(['started', 'stopped']);
    await a.elector.stop();
  });

  it('releases the lease on stop so the other candidate takes over without waiting for expiry', async () => {
    const a = candidate('handover', 'a', { lease: 10_000, deadline: 5000 });
    a.elector.start();
    await a.started;
    const b = candidate('handover', 'b', { lease: 10_000, deadline: 5000 });
    b.elector.start();
    await target.until(
      async () => (await readLease('handover')).metadata?.resourceVersion,
      'b to read the lease',
    );
    const stoppedAt = Date.now();
    await a.elector.stop();
    expect((await readLease('handover')).spec?.holderIdentity).not.toBe('a');
    await b.started;
    expect(Date.now() - stoppedAt).toBeLessThan(2000);
    expect((await readLease('handover')).spec).toMatchObject({ holderIdentity: 'b', leaseTransitions: 1 });
    await b.elector.stop();
  });

  it.skipIf(realCluster)('keeps leading through a 409 on renewal: reads again and retries', async () => {
    const a = candidate('conflict', 'a', { lease: 3000, deadline: 2000, retry: 200 });
    a.elector.start();
    await a.started;
    const fake = target.fake!;
    const puts = () => fake.requests.filter((r) => r.method === 'PUT' && r.path.endsWith('/leases/conflict'));
    const before = puts().length;
    fake.failNext('PUT', /\/leases\/conflict$/, 409, 2);
    // Two refused replaces, then the retry within the same round succeeds.
    const renewed = await target.until(() => {
      const after = puts().slice(before);
      return after.length >= 3 ? after : undefined;
    }, 'the renewal after two conflicts');
    expect(renewed.slice(0, 3).map((r) => r.status)).toEqual([409, 409, 200]);
    expect(a.elector.isLeader).toBe(true);
    expect(a.transitions).toEqual(['started']);
    expect((await readLease('conflict')).spec?.holderIdentity).toBe('a');
    await a.elector.stop();
  });

  it.skipIf(realCluster)('steps down when it cannot renew within the renew deadline', async () => {
    const a = candidate('deadline', 'a', { lease: 2000, deadline: 600, retry: 100 });
    a.elector.start();
    await a.started;
    const failingSince = Date.now();
    target.fake!.failNext('PUT', /\/leases\/deadline$/, 500, 1000);
    target.fake!.failNext('GET', /\/leases\/deadline$/, 500, 1000);
    await a.stopped;
    const elapsed = Date.now() - failingSince;
    expect(elapsed).toBeGreaterThanOrEqual(500);
    expect(elapsed).toBeLessThan(2000);
    expect(a.transitions).toEqual(['started', 'stopped']);
    await a.elector.stop({ release: false });
  });
});

/**
 * The entry point twice: from source, as the tests and `npm run tollgate` run it, and as the container
 * image runs it — rolldown's bundle (rolldown.config.ts, built by ./helpers/bundle.ts) under
 * `node --max-semi-space-size=16` — where the operator's chunk, the Kubernetes client (CommonJS) and the
 * rest load as bundled. Each has its own Lease, pod name and resource.
 */
const entryPoints = [
  {
    name: 'from source',
    args: async () => [new URL('../../cmd/tollgate.ts', import.meta.url).pathname],
    lease: 'tollgate-operator',
    pod: 'entrypoint-pod',
    resource: 'from-the-cli',
  },
  {
    name: 'bundled, as the image runs it',
    args: async () => ['--max-semi-space-size=16', await bundledCommand()],
    lease: 'tollgate-operator-bundled',
    pod: 'bundled-pod',
    resource: 'from-the-bundle',
  },
];

describe.skipIf(!realPostgres).each(entryPoints)('tollgate operator (the entry point, $name)', (entry) => {
  let command: string[];
  beforeAll(async () => {
    command = await entry.args(); // the bundle is built here, within the hook's time-out
  });

  it('serves /healthz, /readyz and /metrics, leads, reconciles, and releases the lease on SIGTERM', async () => {
    const id = newTestId();
    const ctx = await createTestContext({}, { id }); // the schema, migrated
    const { projectId } = await seedProject(ctx);
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-operator-'));
    let child: ChildProcess | undefined;
    try {
      let kubeconfig = process.env.KUBECONFIG ?? '';
      if (target.fake) {
        kubeconfig = join(dir, 'kubeconfig');
        writeFileSync(
          kubeconfig,
          [
            'apiVersion: v1',
            'kind: Config',
            `clusters: [{name: fake, cluster: {server: "${target.fake.url}", insecure-skip-tls-verify: true}}]`,
            'users: [{name: test, user: {}}]',
            'contexts: [{name: fake, context: {cluster: fake, user: test}}]',
            'current-context: fake',
          ].join('\n'),
        );
      }
      const proc = spawn(
        process.execPath,
        [
          ...command,
          'operator',
          // Against the fake server it watches every namespace; a real cluster is limited to the test's.
          ...(target.fake ? [] : ['--namespace', target.namespace]),
        ],
        {
          env: {
            ...childEnv(`tgt_${id}`, dir),
            KUBECONFIG: kubeconfig,
            HOST: '127.0.0.1',
            OPERATOR_PORT: '0',
            WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
            POD_NAME: entry.pod,
            // From source the Lease keeps its default name (tollgate-operator).
            ...(entry.lease === 'tollgate-operator' ? {} : { OPERATOR_LEASE_NAME: entry.lease }),
            OPERATOR_LEASE_NAMESPACE: target.namespace,
            OPERATOR_LEASE_DURATION_SECONDS: '3',
            OPERATOR_RENEW_DEADLINE_SECONDS: '2',
            OPERATOR_RETRY_PERIOD_SECONDS: '1',
            OPERATOR_SHUTDOWN_GRACE_SECONDS: '1',
            LOG_LEVEL: 'info',
          },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      child = proc;
      const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
      const stderr: string[] = [];
      createInterface({ input: proc.stderr! }).on('line', (l) => stderr.push(l));
      const port = await new Promise<number>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`no port announced; stderr: ${stderr.join('\n')}`)),
          15_000,
        );
        createInterface({ input: proc.stdout! }).on('line', (line) => {
          const match = /health and metrics on port (\d+)/.exec(line);
          if (match) {
            clearTimeout(timer);
            resolve(Number(match[1]));
          }
        });
      });
      const base = `http://127.0.0.1:${port}`;
      expect((await fetch(`${base}/healthz`)).status).toBe(200);
      const readyz = await fetch(`${base}/readyz`);
      expect(readyz.status).toBe(200);
      expect(await readyz.json()).toMatchObject({
        status: 'ready',
        identity: entry.pod,
        migrations: 'ok',
      });

      const lease = await target.until(async () => {
        try {
          const l = await kube.coordination.readNamespacedLease({
            name: entry.lease,
            namespace: target.namespace,
          });
          return l.spec?.holderIdentity === entry.pod ? l : undefined;
        } catch {
          return undefined;
        }
      }, 'the entry point to lead');
      expect(lease.spec?.leaseDurationSeconds).toBe(3);
      const metrics = await target.until(async () => {
        const text = await (await fetch(`${base}/metrics`)).text();
        return /^tollgate_operator_leader 1$/m.test(text) ? text : undefined;
      }, 'the leader gauge');
      expect(metrics).toContain('tollgate_operator_reconcile_total');

      await createWebhookSubscription(kube, target.namespace, entry.resource, {
        paywallId: projectId,
        url: 'https://127.0.0.1:9/hooks',
        events: ['*'],
      });
      const ready = await target.until(async () => {
        const r = (await kube.custom.getNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace: target.namespace,
          plural: PLURAL,
          name: entry.resource,
        })) as WebhookSubscription;
        return r.status?.conditions?.some((c) => c.reason === 'Synced') ? r : undefined;
      }, 'the resource to be reconciled');
      const row = await ctx.db
        .selectFrom('webhook_subscriptions')
        .selectAll()
        .where('id', '=', ready.status!.subscriptionId!)
        .executeTakeFirst();
      expect(row).toMatchObject({
        project_id: projectId,
        created_by: `k8s:${target.namespace}/${entry.resource}`,
      });

      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      const released = await kube.coordination.readNamespacedLease({
        name: entry.lease,
        namespace: target.namespace,
      });
      expect(released.spec?.holderIdentity ?? '').toBe('');
    } finally {
      if (child && child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await new Promise((resolve) => child!.once('exit', resolve));
      }
      rmSync(dir, { recursive: true, force: true });
      await ctx.close();
    }
  });
});

// Inside a pod the service account would be found: nothing to test there.
const inPod = existsSync('/var/run/secrets/kubernetes.io/serviceaccount/token');

describe.skipIf(inPod)('tollgate operator without a cluster', () => {
  it('exits with a message naming what to configure', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-operator-'));
    try {
      const child = spawn(
        process.execPath,
        [new URL('../../cmd/tollgate.ts', import.meta.url).pathname, 'operator'],
        {
          env: { PATH: process.env.PATH ?? '', HOME: dir, TOLLGATE_DATA_DIR: dir, LOG_LEVEL: 'silent' },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      let stderr = '';
      child.stderr!.on('data', (c: Buffer) => {
        stderr += c.toString();
      });
      const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
      expect(code).toBe(1);
      expect(stderr).toContain('no Kubernetes cluster configured: set KUBECONFIG');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
