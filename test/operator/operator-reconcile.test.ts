import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { buildServer } from '../../src/http/server.ts';
import { FINALIZER, GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import { Manager } from '../../src/operator/manager.ts';
import { Reconciler } from '../../src/operator/reconciler.ts';
import type { RunningOperator } from '../../src/operator/replica.ts';
import {
  type WebhookSubscription,
  webhookSubscriptionHandler,
} from '../../src/operator/resources/webhook-subscription.ts';
import { type KubeClients, makeClients, mergePatch } from '../../src/operator/runtime/kube.ts';
import { subscriptionStore } from '../../src/operator/stores.ts';
import { disableFailingSubscriptions } from '../../src/webhooks/health.ts';
import {
  setSubscriptionActive,
  subscriptionsChanged,
  updateSubscription,
} from '../../src/webhooks/subscriptions.ts';
import { createTestContext } from '../helpers/context.ts';
import {
  type KubeTarget,
  kubeTarget,
  realCluster,
  releaseFinalizers,
} from '../helpers/fake-kube-apiserver.ts';
import { seedProject } from '../helpers/server.ts';
import { createWebhookSubscription, operatorEnv, startLeadingOperator } from './fixture.ts';

/**
 * The operator's reconcile loop end to end: the real operator code and @kubernetes/client-node against
 * the fake API server on loopback (or a real cluster when KUBECONFIG is set), the real subscription
 * service on Postgres.
 */

let target: KubeTarget;
let ctx: AppContext;
let kube: KubeClients;
let operator: RunningOperator;
let paywallId: string;
let apiKey: string;
let ns: string;
let workerStarts = 0;
const workerStops: number[] = [];
let onWorkerStop = () => {};
const workerStopped = new Promise<void>((resolve) => {
  onWorkerStop = resolve;
});

const HOOK = 'http://127.0.0.1:9/hooks';

beforeAll(async () => {
  target = await kubeTarget('tg-reconcile');
  ns = target.namespace;
  ctx = await createTestContext(operatorEnv(ns));
  ({ projectId: paywallId, apiKey } = await seedProject(ctx));
  kube = makeClients(target.kubeConfig);
  operator = await startLeadingOperator(ctx, target, kube, 'operator-under-test', () => {
    workerStarts++;
    return {
      ready: Promise.resolve(),
      wake: () => {},
      stop: async (graceMs?: number) => {
        workerStops.push(graceMs ?? -1);
        onWorkerStop();
      },
    };
  });
});

afterAll(async () => {
  await operator?.shutdown(0);
  await ctx?.close();
  await target?.close();
});

const ref = (name: string) => ({ group: GROUP, version: VERSION, namespace: ns, plural: PLURAL, name });

const apply = (name: string, spec: Record<string, unknown>) =>
  createWebhookSubscription(kube, ns, name, spec);

async function read(name: string): Promise<WebhookSubscription | undefined> {
  try {
    return (await kube.custom.getNamespacedCustomObject(ref(name))) as WebhookSubscription;
  } catch {
    return undefined;
  }
}

async function patchSpec(name: string, spec: Record<string, unknown>): Promise<WebhookSubscription> {
  return (await kube.custom.patchNamespacedCustomObject(
    { ...ref(name), body: { spec } },
    mergePatch,
  )) as WebhookSubscription;
}

const ready = (r: WebhookSubscription | undefined) => r?.status?.conditions?.find((c) => c.type === 'Ready');

/** The resource once its Ready condition has the given reason for its current generation. */
function untilReady(
  name: string,
  reason = 'Synced',
  extra: (r: WebhookSubscription) => boolean = () => true,
) {
  return target.until(async () => {
    const r = await read(name);
    const c = ready(r);
    return r && c?.reason === reason && r.status?.observedGeneration === r.metadata.generation && extra(r)
      ? r
      : undefined;
  }, `${name} to be Ready/${reason}`);
}

async function row(managedBy: string) {
  return ctx.db
    .selectFrom('webhook_subscriptions')
    .selectAll()
    .where('managed_by', '=', managedBy)
    .executeTakeFirst();
}

const rowById = (id: string) =>
  ctx.db.selectFrom('webhook_subscriptions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

async function eventsFor(name: string) {
  const list = await kube.core.listNamespacedEvent({ namespace: ns });
  return list.items.filter((e) => e.involvedObject.name === name);
}

describe('WebhookSubscription reconcile', () => {
  it('creates the row, a generated Secret it owns, a finalizer and a Ready status', async () => {
    const created = await apply('billing', {
      paywallId,
      url: HOOK,
      events: ['balance.*'],
      description: 'Billing events',
      customHeaders: { 'X-Team': 'billing' },
    });
    const r = await untilReady('billing');
    expect(r.metadata.finalizers).toContain(FINALIZER);
    expect(ready(r)).toMatchObject({ status: 'True', observedGeneration: created.metadata.generation });
    expect(r.spec?.active).toBe(true); // defaulted by the schema
    const dbRow = await row(`WebhookSubscription ${ns}/billing`);
    expect(dbRow).toMatchObject({
      id: r.status?.subscriptionId,
      project_id: paywallId,
      url: HOOK,
      events: ['balance.*'],
      description: 'Billing events',
      custom_headers: { 'X-Team': 'billing' },
      is_active: true,
      created_by: `k8s:${ns}/billing`,
    });
    const secret = await kube.core.readNamespacedSecret({ name: 'billing-webhook-secret', namespace: ns });
    expect(secret.metadata?.ownerReferences?.[0]).toMatchObject({
      kind: 'WebhookSubscription',
      name: 'billing',
      uid: r.metadata.uid,
      controller: true,
    });
    const value = Buffer.from(secret.data?.secret ?? '', 'base64').toString();
    expect(ctx.sealer.open(dbRow!.secret_sealed)).toBe(value);
    expect(r.status?.secretSuffix).toBe(value.slice(-4));
    expect((await eventsFor('billing')).map((e) => e.reason)).toContain('Created');
  });

  it('follows spec edits; observedGeneration follows the generation', async () => {
    const before = await untilReady('billing');
    const edited = await patchSpec('billing', { events: ['*'], url: `${HOOK}/v2`, customHeaders: null });
    expect(edited.metadata.generation).toBe((before.metadata.generation ?? 0) + 1);
    const r = await untilReady('billing');
    expect(r.status?.observedGeneration).toBe(edited.metadata.generation);
    expect(r.status?.subscriptionId).toBe(before.status?.subscriptionId);
    expect(await row(`WebhookSubscription ${ns}/billing`)).toMatchObject({
      url: `${HOOK}/v2`,
      events: ['*'],
      custom_headers: {},
    });
  });

  it('takes the signing secret from secretRef and picks up a rotated Secret', async () => {
    await kube.core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: 'audit-secret' }, stringData: { signing: 'first-secret-value-0123456789' } },
    });
    await apply('audit', {
      paywallId,
      url: HOOK,
      events: ['*'],
      secretRef: { name: 'audit-secret', key: 'signing' },
    });
    const first = await untilReady('audit');
    const managedBy = `WebhookSubscription ${ns}/audit`;
    expect(ctx.sealer.open((await row(managedBy))!.secret_sealed)).toBe('first-secret-value-0123456789');

    await kube.core.patchNamespacedSecret(
      {
        name: 'audit-secret',
        namespace: ns,
        body: { stringData: { signing: 'rotated-secret-value-9876543210' } },
      },
      mergePatch,
    );
    const rotated = await untilReady(
      'audit',
      'Synced',
      (r) => r.status?.observedSecret !== first.status?.observedSecret,
    );
    expect(rotated.status?.secretSuffix).toBe('3210');
    expect(ctx.sealer.open((await row(managedBy))!.secret_sealed)).toBe('rotated-secret-value-9876543210');
  });

  it('reports a missing Secret, then recovers when it appears', async () => {
    await apply('late-secret', { paywallId, url: HOOK, events: ['*'], secretRef: { name: 'not-yet' } });
    const r = await untilReady('late-secret', 'SecretNotFound');
    expect(ready(r)).toMatchObject({ status: 'False', message: `Secret ${ns}/not-yet not found` });
    expect(await row(`WebhookSubscription ${ns}/late-secret`)).toBeUndefined();
    const warning = (await eventsFor('late-secret')).find((e) => e.reason === 'SecretNotFound');
    expect(warning?.type).toBe('Warning');
    await kube.core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: 'not-yet' }, stringData: { secret: 'arrived-late-secret-value-000' } },
    });
    await untilReady('late-secret');
    expect(await row(`WebhookSubscription ${ns}/late-secret`)).toMatchObject({ secret_suffix: '-000' });
  });

  it('turns a spec the service refuses into Ready=False/InvalidSpec and a Warning event, then heals', async () => {
    await apply('bad-headers', {
      paywallId,
      url: HOOK,
      events: ['*'],
      customHeaders: { 'X-Service-Signature': 'forged' },
    });
    const r = await untilReady('bad-headers', 'InvalidSpec');
    expect(ready(r)?.status).toBe('False');
    expect(ready(r)?.message).toMatch(/customHeaders/);
    expect(await row(`WebhookSubscription ${ns}/bad-headers`)).toBeUndefined();
    // The spec was checked before anything was made for it: no generated Secret is left behind.
    await expect(
      kube.core.readNamespacedSecret({ name: 'bad-headers-webhook-secret', namespace: ns }),
    ).rejects.toMatchObject({ code: 404 });
    const warning = (await eventsFor('bad-headers')).find((e) => e.reason === 'InvalidSpec');
    expect(warning).toMatchObject({
      type: 'Warning',
      involvedObject: { kind: 'WebhookSubscription', uid: r.metadata.uid },
    });
    await patchSpec('bad-headers', { customHeaders: { 'X-Service-Signature': null, 'X-Team': 'ok' } });
    await untilReady('bad-headers');
    expect(await row(`WebhookSubscription ${ns}/bad-headers`)).toMatchObject({ is_active: true });
  });

  it('puts back a row changed or deactivated out of band, and mirrors delivery stats into status', async () => {
    const managedBy = `WebhookSubscription ${ns}/billing`;
    // So far one update, the spec edit: reconciles that found nothing to do wrote nothing.
    const updates = (await eventsFor('billing')).filter((e) => e.reason === 'Updated');
    expect(updates.map((e) => e.message)).toEqual([expect.stringContaining('(url, events, customHeaders)')]);
    const original = (await row(managedBy))!;
    await ctx.db
      .updateTable('webhook_subscriptions')
      .set({ url: 'http://127.0.0.1:9/elsewhere', is_active: false, consecutive_failures: 3 })
      .where('id', '=', original.id)
      .execute();
    // The periodic resync (1 s here) finds the drift and writes the spec back.
    const restored = await target.until(async () => {
      const current = await row(managedBy);
      return current?.url === original.url && current.is_active ? current : undefined;
    }, 'the row to be put back');
    expect(restored.url).toBe(`${HOOK}/v2`);
    expect(
      (await eventsFor('billing')).some(
        (e) => e.reason === 'DriftCorrected' && /outside the resource/.test(e.message ?? ''),
      ),
    ).toBe(true);
    // Re-activating resets the failure count; the status mirrors what the row says.
    await untilReady(
      'billing',
      'Synced',
      (r) => r.status?.consecutiveFailures === restored.consecutive_failures,
    );
  });

  it('follows a changed paywallId where the API server lets it: the old row released, a new one made', async () => {
    await apply('moving', { paywallId, url: HOOK, events: ['*'] });
    const before = await untilReady('moving');
    const other = await seedProject(ctx);
    try {
      await patchSpec('moving', { paywallId: other.projectId });
    } catch (err) {
      // A real API server evaluates the CRD's CEL transition rule and refuses the edit itself.
      expect((err as { code?: number }).code).toBe(422);
      const body = (err as { body?: unknown }).body;
      expect(typeof body === 'string' ? body : JSON.stringify(body)).toContain('paywallId cannot change');
      return;
    }
    const moved = await untilReady(
      'moving',
      'Synced',
      (r) => r.status?.subscriptionId !== before.status?.subscriptionId,
    );
    expect(await row(`WebhookSubscription ${ns}/moving`)).toMatchObject({
      id: moved.status?.subscriptionId,
      project_id: other.projectId,
      is_active: true,
    });
    // the old row: inactive, and the REST API's again
    expect(await rowById(before.status!.subscriptionId!)).toMatchObject({
      project_id: paywallId,
      is_active: false,
      managed_by: null,
    });
    expect((await eventsFor('moving')).map((e) => e.reason)).toContain('ProjectChanged');
  });

  it('pauses with active: false and re-enables with active: true', async () => {
    const managedBy = `WebhookSubscription ${ns}/billing`;
    await patchSpec('billing', { active: false });
    await untilReady('billing');
    expect(await row(managedBy)).toMatchObject({ is_active: false });
    await patchSpec('billing', { active: true });
    await untilReady('billing');
    expect(await row(managedBy)).toMatchObject({ is_active: true });
  });

  it('lets the REST side refuse to change or delete a managed row, naming the resource', async () => {
    const dbRow = (await row(`WebhookSubscription ${ns}/billing`))!;
    await expect(setSubscriptionActive(ctx, paywallId, dbRow.id, false)).rejects.toMatchObject({
      status: 409,
      message: expect.stringContaining(`WebhookSubscription ${ns}/billing`),
    });
    await expect(
      updateSubscription(ctx, paywallId, dbRow.id, { url: HOOK, events: ['*'] }, {}),
    ).rejects.toMatchObject({
      status: 409,
    });
    const app = await buildServer(ctx);
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const { port } = app.server.address() as AddressInfo;
      const res = await fetch(`http://127.0.0.1:${port}/v1/webhooks/subscriptions/${dbRow.id}`, {
        method: 'DELETE',
        headers: { authorization: `Bearer ${apiKey}` },
      });
      expect(res.status).toBe(409);
      const body = (await res.json()) as { error: { message: string; code: string } };
      expect(body.error.code).toBe('managed_by_resource');
      expect(body.error.message).toContain(`WebhookSubscription ${ns}/billing`);
    } finally {
      await app.close();
    }
    expect(await row(`WebhookSubscription ${ns}/billing`)).toMatchObject({ is_active: true });
  });

  it('releases the row through the finalizer when the resource is deleted: inactive, the REST API’s again', async () => {
    const managedBy = `WebhookSubscription ${ns}/audit`;
    const managed = await row(managedBy);
    expect(managed).toMatchObject({ is_active: true });
    await kube.custom.deleteNamespacedCustomObject(ref('audit'));
    await target.until(async () => !(await read('audit')), 'audit to be gone');
    expect(await rowById(managed!.id)).toMatchObject({ is_active: false, managed_by: null });
    // no 409 any more: the REST side may enable it again
    await setSubscriptionActive(ctx, paywallId, managed!.id, true);
    expect(await rowById(managed!.id)).toMatchObject({ is_active: true });
  });

  it('shows a subscription disabled by endpoint health as Ready=False/EndpointDisabled until the spec changes', async () => {
    await apply('unhealthy', { paywallId, url: HOOK, events: ['*'] });
    const synced = await untilReady('unhealthy');
    const id = synced.status!.subscriptionId!;
    await ctx.db
      .updateTable('webhook_subscriptions')
      .set({ failing_since: new Date(Date.now() - 200 * 3600_000), consecutive_failures: 40 })
      .where('id', '=', id)
      .execute();
    expect(await disableFailingSubscriptions(ctx)).toBe(1);
    // The change notice brings the resource back at once; the condition says why, and the row stays off.
    const r = await untilReady('unhealthy', 'EndpointDisabled');
    expect(ready(r)).toMatchObject({
      status: 'False',
      message: expect.stringMatching(/was disabled: every delivery attempt failed for 120 hours/),
    });
    expect(r.status?.consecutiveFailures).toBe(40);
    const warning = (await eventsFor('unhealthy')).find((e) => e.reason === 'EndpointDisabled');
    expect(warning?.type).toBe('Warning');
    // Later passes (status sync every second here) leave it disabled.
    const passes = async () =>
      (await ctx.metrics.reconciles.get()).values.find((v) => v.labels.result === 'success')?.value ?? 0;
    const seen = await passes();
    await target.until(async () => (await passes()) >= seen + 3, 'three more reconciles');
    expect(await row(`WebhookSubscription ${ns}/unhealthy`)).toMatchObject({ is_active: false });
    // A spec change re-enables it, and clears the reason.
    await patchSpec('unhealthy', { description: 'endpoint fixed' });
    await untilReady('unhealthy');
    expect(await row(`WebhookSubscription ${ns}/unhealthy`)).toMatchObject({
      is_active: true,
      disabled_reason: null,
      failing_since: null,
      consecutive_failures: 0,
    });
  });

  it('reports DatabaseUnavailable with a retry when the database cannot be reached', async () => {
    await apply('db-down', { paywallId, url: HOOK, events: ['*'] });
    await untilReady('db-down');
    const down = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
    const store = { ...subscriptionStore(ctx), findByManager: () => Promise.reject(down) };
    const resource = (await read('db-down'))!;
    const reconciler = new Reconciler({
      kube,
      handler: webhookSubscriptionHandler(store),
      log: ctx.log,
      identity: 'probe',
      getResource: () => resource,
    });
    const result = await reconciler.reconcile(`${ns}/db-down`);
    expect(result).toEqual({ outcome: 'failed', requeue: true });
    // The running operator may already have put Ready back (its next resync finds the database fine);
    // the Warning event and the status write stay.
    const warning = (await eventsFor('db-down')).find((e) => e.reason === 'DatabaseUnavailable');
    expect(warning).toMatchObject({ type: 'Warning', message: expect.stringContaining('ECONNREFUSED') });
    if (target.fake) {
      const write = target.fake.requests.findLast(
        (w) =>
          w.method === 'PATCH' &&
          w.path.endsWith('/db-down/status') &&
          JSON.stringify(w.body).includes('DatabaseUnavailable'),
      );
      expect(write?.body).toMatchObject({
        status: { conditions: [{ type: 'Ready', status: 'False', reason: 'DatabaseUnavailable' }] },
      });
    }
  });
});

describe.skipIf(realCluster)('against the fake API server only', () => {
  it('writes status with a JSON merge patch on the status subresource', () => {
    const statusWrites = target.fake!.requests.filter(
      (r) => r.method === 'PATCH' && r.path.endsWith('/status'),
    );
    expect(statusWrites.length).toBeGreaterThan(0);
    for (const write of statusWrites) {
      expect(write.contentType).toBe('application/merge-patch+json');
      expect(Object.keys(write.body as object)).toEqual(['status']);
    }
  });

  it('lists again after 410 Gone and reconciles what it missed', async () => {
    const fake = target.fake!;
    const listsBefore = fake.requests.filter(
      (r) => r.method === 'GET' && r.path.endsWith(`/${PLURAL}`) && !r.query.watch,
    ).length;
    fake.muteWatches();
    await apply('missed', { paywallId, url: HOOK, events: ['*'] });
    fake.compact();
    fake.closeWatches();
    await untilReady('missed');
    const listsAfter = fake.requests.filter(
      (r) => r.method === 'GET' && r.path.endsWith(`/${PLURAL}`) && !r.query.watch,
    ).length;
    expect(listsAfter).toBeGreaterThan(listsBefore);
  });

  it('requeues a failed reconcile with backoff until it succeeds', async () => {
    const fake = target.fake!;
    // Four refusals: each failed pass tries the Synced status, then the ReconcileError status.
    fake.failNext('PATCH', /\/flaky\/status$/, 500, 4);
    const errorsBefore =
      (await ctx.metrics.reconciles.get()).values.find((v) => v.labels.result === 'error')?.value ?? 0;
    await apply('flaky', { paywallId, url: HOOK, events: ['*'] });
    await untilReady('flaky');
    const statusWrites = fake.requests.filter(
      (r) => r.method === 'PATCH' && r.path.endsWith('/flaky/status'),
    );
    expect(statusWrites.map((w) => w.status).slice(0, 5)).toEqual([500, 500, 500, 500, 200]);
    const errorsAfter =
      (await ctx.metrics.reconciles.get()).values.find((v) => v.labels.result === 'error')?.value ?? 0;
    expect(errorsAfter - errorsBefore).toBeGreaterThanOrEqual(2);
    // One row however many passes it took.
    const rows = await ctx.db
      .selectFrom('webhook_subscriptions')
      .select('id')
      .where('managed_by', '=', `WebhookSubscription ${ns}/flaky`)
      .execute();
    expect(rows).toHaveLength(1);
  });

  it('turns a Kubernetes API error into Ready=False/ReconcileError and a Warning Event, then recovers', async () => {
    const fake = target.fake!;
    // The API server refuses to create the generated Secret (RBAC, say), twice.
    fake.failNext('POST', /\/namespaces\/[^/]+\/secrets$/, 403, 2);
    await apply('forbidden', { paywallId, url: HOOK, events: ['*'] });
    const failed = await target.until(() => {
      const write = fake.requests.find(
        (w) =>
          w.method === 'PATCH' &&
          w.path.endsWith('/forbidden/status') &&
          JSON.stringify(w.body).includes('ReconcileError'),
      );
      return write?.body as { status: { conditions: Array<Record<string, unknown>> } } | undefined;
    }, 'the ReconcileError status');
    expect(failed.status.conditions[0]).toMatchObject({
      type: 'Ready',
      status: 'False',
      reason: 'ReconcileError',
      message: expect.stringContaining('403'),
    });
    const warning = (await eventsFor('forbidden')).find((e) => e.reason === 'ReconcileError');
    expect(warning).toMatchObject({ type: 'Warning', message: expect.stringContaining('403') });
    // Retried with backoff: once the API server lets it, the resource becomes Ready.
    await untilReady('forbidden');
    expect(await row(`WebhookSubscription ${ns}/forbidden`)).toMatchObject({ is_active: true });
  });

  it('garbage-collects the generated Secret with its resource', async () => {
    const managed = await row(`WebhookSubscription ${ns}/billing`);
    await kube.custom.deleteNamespacedCustomObject(ref('billing'));
    await target.until(async () => !(await read('billing')), 'billing to be gone');
    expect(target.fake!.get('', 'secrets', ns, 'billing-webhook-secret')).toBeUndefined();
    expect(await rowById(managed!.id)).toMatchObject({ is_active: false, managed_by: null });
  });
});

describe('losing the lease', () => {
  it('stops the controller and the delivery worker at once, without grace', async () => {
    expect(workerStarts).toBe(1);
    // The leader renews meanwhile: a replace carrying the resourceVersion read may meet a 409, so read
    // again and retry (as any Lease writer must).
    for (let tries = 1; ; tries++) {
      const lease = await kube.coordination.readNamespacedLease({ name: 'tollgate-operator', namespace: ns });
      try {
        await kube.coordination.replaceNamespacedLease({
          name: 'tollgate-operator',
          namespace: ns,
          body: { ...lease, spec: { ...lease.spec, holderIdentity: 'another-replica' } },
        });
        break;
      } catch (err) {
        if ((err as { code?: number }).code !== 409 || tries >= 10) throw err;
      }
    }
    await workerStopped;
    expect(workerStops).toEqual([0]);
    expect(operator.isLeader()).toBe(false);
    expect((await ctx.metrics.leader.get()).values[0]?.value).toBe(0);
    // The controller's informers are gone: no watch is open any more.
    if (target.fake) await target.until(() => target.fake!.openWatches === 0, 'the watches to close');
  });
});

describe('change notices from the database', () => {
  it("reconcile the paywall's resources at once, without waiting for the resync", async () => {
    const ns2 = `${ns}-notices`;
    if (!target.fake) await kube.core.createNamespace({ body: { metadata: { name: ns2 } } });
    const controller = new Manager({
      kube,
      handlers: [webhookSubscriptionHandler(subscriptionStore(ctx))],
      log: ctx.log,
      metrics: ctx.metrics,
      namespaces: [ns2],
      identity: 'notices',
      resyncMs: 3_600_000,
    });
    try {
      await controller.start();
      await createWebhookSubscription(kube, ns2, 'noticed', { paywallId, url: HOOK, events: ['*'] });
      const managedBy = `WebhookSubscription ${ns2}/noticed`;
      await target.until(async () => (await row(managedBy))?.is_active, 'the row');
      await target.until(async () => {
        const list = await kube.core.listNamespacedEvent({ namespace: ns2 });
        return list.items.some((e) => e.reason === 'Created');
      }, 'the Created event');
      await ctx.db
        .updateTable('webhook_subscriptions')
        .set({ is_active: false })
        .where('managed_by', '=', managedBy)
        .execute();
      await subscriptionsChanged(ctx, paywallId);
      await target.until(async () => {
        const list = await kube.core.listNamespacedEvent({ namespace: ns2 });
        return list.items.some((e) => e.reason === 'DriftCorrected');
      }, 'the row to be put back');
      expect(await row(managedBy)).toMatchObject({ is_active: true });
    } finally {
      await controller.stop();
      if (!target.fake) {
        await releaseFinalizers(kube.config, ns2);
        await kube.core.deleteNamespace({ name: ns2 }).catch(() => {});
      }
    }
  });
});
