import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Principal } from '../../src/admin/accounts.ts';
import { applyModels, connectProvider } from '../../src/admin/service.ts';
import type { AppContext } from '../../src/app/context.ts';
import { sha256Hex } from '../../src/core/crypto.ts';
import { GROUP, VERSION } from '../../src/operator/api.ts';
import type { RunningOperator } from '../../src/operator/replica.ts';
import type { KubeClients } from '../../src/operator/runtime/kube.ts';
import type { Resource } from '../../src/operator/status.ts';
import { setSubscriptionActive } from '../../src/webhooks/subscriptions.ts';
import type { KubeTarget } from '../helpers/fake-kube-apiserver.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { readResource, resourceRef, startOperatorSuite, stopOperatorSuite } from './fixture.ts';

/**
 * A Project deleted and applied again by name (`kubectl apply -k`, a GitOps self-heal) is a new project;
 * every dependent kind (PriceList, ModelProvider, LimitPolicy, ApiKey, WebhookSubscription) follows it —
 * its rows made in the new project, those of the old one released as deleting the resource would — so
 * the old project is left editable through the admin API. Then `kubectl delete tollgate --all`: no row
 * keeps naming a resource that is gone, no project stays read-only. The running operator against the
 * fake API server (CRD schemas and CEL rules applied), the real services on Postgres.
 */

let target: KubeTarget;
let ctx: AppContext;
let kube: KubeClients;
let operator: RunningOperator;
let upstream: MockUpstream;
let ns: string;
const admin: Principal = { developerId: null, email: null, actorType: 'admin_token', actorId: 'test' };

beforeAll(async () => {
  ({ target, ctx, kube, operator, upstream, ns } = await startOperatorSuite(
    'tg-recreate',
    'operator-recreate',
  ));
});
afterAll(() => stopOperatorSuite({ target, ctx, operator, upstream }));

const ref = (kind: string, name: string) => resourceRef(ns, kind, name);
const apply = (kind: string, name: string, spec: Record<string, unknown>) =>
  kube.custom.createNamespacedCustomObject({
    ...ref(kind, name),
    body: { apiVersion: `${GROUP}/${VERSION}`, kind, metadata: { name }, spec },
  });
const read = (kind: string, name: string) => readResource(kube, ns, kind, name);
const ready = (r: Resource | undefined) => r?.status?.conditions?.find((c) => c.type === 'Ready');
async function reasons(name: string): Promise<string[]> {
  const list = await kube.core.listNamespacedEvent({ namespace: ns });
  return list.items.filter((e) => e.involvedObject.name === name).map((e) => e.reason ?? '');
}

const pricing = { mode: 'per_request', perRequest: '0.01' };
const DEPENDENTS: Array<[kind: string, spec: Record<string, unknown>]> = [
  ['PriceList', { currency: 'usd', models: [{ id: 'm', pricing }] }],
  ['ModelProvider', { providerName: 'default', baseUrl: '', secretRef: { name: 'phoenix-provider' } }],
  ['LimitPolicy', { user: { rpm: 60 } }],
  ['ApiKey', {}],
  ['WebhookSubscription', { url: 'http://127.0.0.1:9/hooks', events: ['*'] }],
];
/** Every resource of the set is named `phoenix`. */
const NAME = 'phoenix';
const managedBy = (kind: string) => `${kind} ${ns}/${NAME}`;

/** Every dependent Ready/Synced on the project `projectId`. */
const allOn = (projectId: string) =>
  Promise.all(
    DEPENDENTS.map(([kind]) =>
      target.until(async () => {
        const r = await read(kind, NAME);
        return ready(r)?.reason === 'Synced' && r?.status?.projectId === projectId ? r : undefined;
      }, `${kind} to be Synced on ${projectId}`),
    ),
  );

async function rowsOf(projectId: string) {
  const db = ctx.db;
  const [project, models, providers, keys, subscriptions] = await Promise.all([
    db.selectFrom('projects').selectAll().where('id', '=', projectId).executeTakeFirstOrThrow(),
    db.selectFrom('models').select('id').where('project_id', '=', projectId).execute(),
    db.selectFrom('providers').select(['name', 'managed_by']).where('project_id', '=', projectId).execute(),
    db.selectFrom('api_keys').selectAll().where('project_id', '=', projectId).execute(),
    db.selectFrom('webhook_subscriptions').selectAll().where('project_id', '=', projectId).execute(),
  ]);
  return { project, models, providers, keys, subscriptions };
}

/** Rows anywhere that still name a resource of the set as their manager. */
async function stillManaged(): Promise<string[]> {
  const names = ['Project', ...DEPENDENTS.map(([kind]) => kind)].map(managedBy);
  const db = ctx.db;
  const found = await Promise.all([
    db
      .selectFrom('projects')
      .select('id')
      .where((eb) =>
        eb.or([
          eb('managed_by', 'in', names),
          eb('pricing_managed_by', 'in', names),
          eb('limits_managed_by', 'in', names),
        ]),
      )
      .execute(),
    db.selectFrom('providers').select('project_id as id').where('managed_by', 'in', names).execute(),
    db
      .selectFrom('api_keys')
      .select('id')
      .where('managed_by', 'in', names)
      .where('revoked_at', 'is', null)
      .execute(),
    db.selectFrom('webhook_subscriptions').select('id').where('managed_by', 'in', names).execute(),
  ]);
  return found.flat().map((r) => r.id);
}

let oldId: string;
let newId: string;

describe('a Project deleted and applied again by name', () => {
  it('is a new project, and every dependent kind follows it', async () => {
    await kube.core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: 'phoenix-provider' }, stringData: { apiKey: 'sk-provider' } },
    });
    await apply('Project', NAME, { currency: 'usd' });
    for (const [kind, spec] of DEPENDENTS)
      await apply(kind, NAME, {
        projectRef: { name: NAME },
        ...spec,
        ...(kind === 'ModelProvider' ? { baseUrl: upstream.baseUrl, apiKey: 'sk-by-hand' } : {}),
      });
    oldId = (await target.until(
      async () => (await read('Project', NAME))?.status?.projectId,
      'the project',
    )) as string;
    await allOn(oldId);

    await kube.custom.deleteNamespacedCustomObject(ref('Project', NAME));
    await target.until(async () => !(await read('Project', NAME)), 'the Project to go');
    await apply('Project', NAME, { currency: 'usd' });
    newId = (await target.until(async () => {
      const id = (await read('Project', NAME))?.status?.projectId;
      return id && id !== oldId ? id : undefined;
    }, 'the new project')) as string;
    const [, , , apiKey, subscription] = await allOn(newId);

    // the new project has every row, each managed by its resource
    const now = await rowsOf(newId);
    expect(now.project.managed_by).toBe(managedBy('Project'));
    expect(now.project.pricing_managed_by).toBe(managedBy('PriceList'));
    expect(now.project.limits_managed_by).toBe(managedBy('LimitPolicy'));
    expect(now.project.limits).toEqual({ user: { rpm: 60 } });
    expect(now.models.map((m) => m.id)).toEqual(['m']);
    expect(now.providers).toEqual([{ name: 'default', managed_by: managedBy('ModelProvider') }]);
    const active = now.keys.filter((k) => !k.revoked_at);
    expect(active.map((k) => k.id)).toEqual([apiKey!.status?.keyId]);
    const secret = await kube.core.readNamespacedSecret({ name: `${NAME}-api-key`, namespace: ns });
    const value = Buffer.from(secret.data!.apiKey!, 'base64').toString('utf8');
    expect(sha256Hex(value)).toBe(active[0]!.key_hash);
    expect(now.subscriptions).toMatchObject([
      {
        id: subscription!.status?.subscriptionId,
        is_active: true,
        managed_by: managedBy('WebhookSubscription'),
      },
    ]);

    // the old one: released as deleting each resource would
    const before = await rowsOf(oldId);
    expect(before.project).toMatchObject({
      managed_by: null,
      pricing_managed_by: null,
      limits_managed_by: null,
      limits: null,
    });
    expect(before.models).toEqual([]);
    expect(before.providers).toEqual([]);
    expect(before.keys.every((k) => k.revoked_at !== null)).toBe(true);
    expect(before.subscriptions).toMatchObject([{ is_active: false, managed_by: null }]);

    // each dependent says what happened
    expect(await reasons(NAME)).toEqual(expect.arrayContaining(['ProjectChanged']));
    const list = await kube.core.listNamespacedEvent({ namespace: ns });
    const moved = list.items.filter((e) => e.reason === 'ProjectChanged').map((e) => e.involvedObject.kind);
    expect(new Set(moved)).toEqual(new Set(DEPENDENTS.map(([kind]) => kind)));
  });

  it('leaves the old project writable through the admin API', async () => {
    const file = {
      currency: 'usd',
      models: [{ id: 'by-hand', pricing: { mode: 'per_request' as const, perRequest: '0.02' } }],
      limits: { user: { rpm: 5 } },
    };
    await expect(applyModels(ctx, admin, oldId, file)).resolves.toBeDefined();
    const provider = await connectProvider(ctx, admin, oldId, {
      baseUrl: upstream.baseUrl,
      apiKey: 'sk-by-hand',
    });
    expect(provider.baseUrl).toBe(upstream.baseUrl);
    const sub = (await rowsOf(oldId)).subscriptions[0]!;
    await setSubscriptionActive(ctx, oldId, sub.id, true);
    // the new project stays the resources' own
    await expect(applyModels(ctx, admin, newId, file)).rejects.toMatchObject({
      status: 409,
      message: expect.stringContaining(managedBy('PriceList')),
    });
  });
});

describe('deleting every resource at once (kubectl delete tollgate --all)', () => {
  it('leaves no row managed and no project read-only', async () => {
    await Promise.all(
      ['Project', ...DEPENDENTS.map(([kind]) => kind)].map((kind) =>
        kube.custom.deleteNamespacedCustomObject(ref(kind, NAME)),
      ),
    );
    for (const kind of ['Project', ...DEPENDENTS.map(([k]) => k)])
      await target.until(async () => !(await read(kind, NAME)), `${kind} to go`);
    expect(await stillManaged()).toEqual([]);
    const file = {
      currency: 'usd',
      models: [{ id: 'after', pricing: { mode: 'per_request' as const, perRequest: '0.03' } }],
      limits: { user: { rpm: 7 } },
    };
    for (const id of [oldId, newId]) {
      await expect(applyModels(ctx, admin, id, file)).resolves.toBeDefined();
      await expect(
        connectProvider(ctx, admin, id, { baseUrl: upstream.baseUrl, apiKey: 'sk-by-hand' }),
      ).resolves.toBeDefined();
    }
  });
});
