import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Principal } from '../../src/admin/accounts.ts';
import { applyModels, connectProvider, revokeApiKey, updateOwnedProject } from '../../src/admin/service.ts';
import type { AppContext } from '../../src/app/context.ts';
import { applyPricing } from '../../src/models/service.ts';
import { GROUP, VERSION } from '../../src/operator/api.ts';
import type { RunningOperator } from '../../src/operator/replica.ts';
import { type KubeClients, mergePatch } from '../../src/operator/runtime/kube.ts';
import type { Resource } from '../../src/operator/status.ts';
import { removeProvider, upsertProvider } from '../../src/routing/providers.ts';
import type { KubeTarget } from '../helpers/fake-kube-apiserver.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { PLURALS, readResource, resourceRef, startOperatorSuite, stopOperatorSuite } from './fixture.ts';

/**
 * The deployment's resources (Project, ApiKey, ModelProvider, PriceList, LimitPolicy, and WebhookSubscription
 * by projectRef) reconciled by the running operator: the real operator code and @kubernetes/client-node
 * against the fake API server on loopback (CRD schemas and their CEL rules applied), the real services on
 * Postgres, a loopback provider. Create, update, delete, drift, missing Secret, invalid spec.
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
    'tg-resources',
    'operator-under-test',
  ));
});
afterAll(() => stopOperatorSuite({ target, ctx, operator, upstream }));

const ref = (kind: string, name: string) => resourceRef(ns, kind, name);

function apply(kind: string, name: string, spec: Record<string, unknown>): Promise<Resource> {
  return kube.custom.createNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace: ns,
    plural: PLURALS[kind]!,
    body: { apiVersion: `${GROUP}/${VERSION}`, kind, metadata: { name }, spec },
  }) as Promise<Resource>;
}

const read = (kind: string, name: string) => readResource(kube, ns, kind, name);

const patchSpec = (kind: string, name: string, spec: Record<string, unknown>) =>
  kube.custom.patchNamespacedCustomObject(
    { ...ref(kind, name), body: { spec } },
    mergePatch,
  ) as Promise<Resource>;
const remove = (kind: string, name: string) => kube.custom.deleteNamespacedCustomObject(ref(kind, name));
const ready = (r: Resource | undefined) => r?.status?.conditions?.find((c) => c.type === 'Ready');

/** The resource once Ready has this reason for its current generation (and `extra` holds). */
function untilReason(
  kind: string,
  name: string,
  reason = 'Synced',
  extra: (r: Resource) => unknown = () => true,
) {
  return target.until(async () => {
    const r = await read(kind, name);
    return r &&
      ready(r)?.reason === reason &&
      r.status?.observedGeneration === r.metadata.generation &&
      extra(r)
      ? r
      : undefined;
  }, `${kind} ${name} to be Ready/${reason}`);
}

async function eventsFor(name: string) {
  const list = await kube.core.listNamespacedEvent({ namespace: ns });
  return list.items.filter((e) => e.involvedObject.name === name).map((e) => e.reason);
}

const project = (managedBy: string) =>
  ctx.db.selectFrom('projects').selectAll().where('managed_by', '=', managedBy).executeTakeFirst();
const projectById = (id: string) =>
  ctx.db.selectFrom('projects').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

let projectId: string;

describe('Project', () => {
  it('refuses an invalid spec at the API server: currency pattern, missing currency', async () => {
    await expect(apply('Project', 'bad-currency', { currency: 'USD' })).rejects.toMatchObject({ code: 422 });
    await expect(apply('Project', 'no-currency', { displayName: 'x' })).rejects.toMatchObject({ code: 422 });
  });

  it('creates the project row, managed, with its settings; Ready with its id', async () => {
    await apply('Project', 'acme', {
      displayName: 'Acme',
      currency: 'usd',
      settings: { connectMessage: 'Connect to chat', maxCompletionTokens: 1000 },
    });
    const r = await untilReason('Project', 'acme');
    expect(r.metadata.finalizers).toContain('tollgate.dev/project');
    const row = await project(`Project ${ns}/acme`);
    expect(row).toMatchObject({
      id: r.status?.projectId,
      name: 'Acme',
      currency: 'usd',
      settings: { connectMessage: 'Connect to chat', maxCompletionTokens: 1000 },
    });
    projectId = row!.id;
    expect(await eventsFor('acme')).toContain('Created');
    // the audit log names the resource as the actor, once (resyncs are not changes)
    const audited = await ctx.db
      .selectFrom('audit_log')
      .selectAll()
      .where('project_id', '=', projectId)
      .where('action', '=', 'project.create')
      .execute();
    expect(audited).toMatchObject([
      { actor_type: 'operator', actor_id: `Project ${ns}/acme`, via: 'operator', target_id: projectId },
    ]);
    // No first key for a declared project: its keys are ApiKey resources.
    expect(
      await ctx.db.selectFrom('api_keys').where('project_id', '=', projectId).selectAll().execute(),
    ).toEqual([]);
  });

  it('follows spec edits, settings replaced as a whole', async () => {
    // A merge patch: null removes a setting.
    await patchSpec('Project', 'acme', {
      displayName: 'Acme Chat',
      settings: { connectMessage: null, maxCompletionTokens: null, topupMessage: 'Top up' },
    });
    await untilReason('Project', 'acme', 'Synced', (r) => r.metadata.generation === 2);
    await target.until(async () => (await projectById(projectId)).name === 'Acme Chat', 'the new name');
    expect((await projectById(projectId)).settings).toEqual({ topupMessage: 'Top up' });
  });

  it('is read-only elsewhere: a 409 naming the resource', async () => {
    await expect(updateOwnedProject(ctx, admin, projectId, { name: 'by hand' })).rejects.toMatchObject({
      status: 409,
      code: 'managed_by_resource',
      message: expect.stringContaining(`Project ${ns}/acme`),
    });
  });

  it('puts back a row changed outside the resource (drift)', async () => {
    await ctx.db.updateTable('projects').set({ name: 'drifted' }).where('id', '=', projectId).execute();
    await target.until(async () => (await projectById(projectId)).name === 'Acme Chat', 'the name put back');
    await target.until(async () => (await eventsFor('acme')).includes('DriftCorrected'), 'a drift event');
  });

  it('refuses a currency change (CEL transition rule)', async () => {
    await expect(patchSpec('Project', 'acme', { currency: 'eur' })).rejects.toMatchObject({ code: 422 });
  });
});

describe('ModelProvider', () => {
  it('reports a missing Secret, then syncs when it appears', async () => {
    await apply('ModelProvider', 'openai', {
      projectRef: { name: 'acme' },
      providerName: 'default',
      baseUrl: upstream.baseUrl,
      secretRef: { name: 'openai-credentials' },
      timeouts: { connectMs: 2000 },
    });
    const r = await untilReason('ModelProvider', 'openai', 'SecretNotFound');
    expect(ready(r)).toMatchObject({ status: 'False', message: `Secret ${ns}/openai-credentials not found` });
    await kube.core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: 'openai-credentials' }, stringData: { apiKey: 'sk-first' } },
    });
    const synced = await untilReason('ModelProvider', 'openai');
    expect(synced.spec).toMatchObject({ type: 'openai-compatible' }); // defaulted by the schema
    const row = await ctx.db
      .selectFrom('providers')
      .selectAll()
      .where('project_id', '=', projectId)
      .where('name', '=', 'default')
      .executeTakeFirstOrThrow();
    expect(row).toMatchObject({
      base_url: upstream.baseUrl,
      connect_timeout_ms: 2000,
      managed_by: `ModelProvider ${ns}/openai`,
    });
    expect(ctx.sealer.open(row.key_sealed!)).toBe('sk-first');
  });

  it('picks up a rotated key and puts back a changed row', async () => {
    await kube.core.patchNamespacedSecret(
      { name: 'openai-credentials', namespace: ns, body: { stringData: { apiKey: 'sk-rotated' } } },
      mergePatch,
    );
    const keyOf = async () =>
      ctx.sealer.open(
        (
          await ctx.db
            .selectFrom('providers')
            .select('key_sealed')
            .where('project_id', '=', projectId)
            .where('name', '=', 'default')
            .executeTakeFirstOrThrow()
        ).key_sealed!,
      );
    await target.until(async () => (await keyOf()) === 'sk-rotated', 'the rotated key');
    // a rotation is named as one, not as a drift put back
    await target.until(async () => (await eventsFor('openai')).includes('SecretRotated'), 'SecretRotated');
    expect(await eventsFor('openai')).not.toContain('DriftCorrected');
    await ctx.db
      .updateTable('providers')
      .set({ base_url: 'http://127.0.0.1:9/v1' })
      .where('project_id', '=', projectId)
      .execute();
    await target.until(
      async () =>
        (
          await ctx.db
            .selectFrom('providers')
            .select('base_url')
            .where('project_id', '=', projectId)
            .executeTakeFirst()
        )?.base_url === upstream.baseUrl,
      'the base URL put back',
    );
    await target.until(async () => (await eventsFor('openai')).includes('DriftCorrected'), 'DriftCorrected');
  });

  it('is read-only elsewhere', async () => {
    await expect(
      upsertProvider(ctx.db, ctx.sealer, projectId, { name: 'default', baseUrl: 'https://example.com/v1' }),
    ).rejects.toMatchObject({ status: 409, message: expect.stringContaining(`ModelProvider ${ns}/openai`) });
    await expect(removeProvider(ctx.db, projectId, 'default')).rejects.toMatchObject({ status: 409 });
    // PUT …/provider: the 409 names the ModelProvider that manages the provider, not the Project
    const put = connectProvider(ctx, admin, projectId, { baseUrl: upstream.baseUrl, apiKey: 'sk-hand' });
    await expect(put).rejects.toMatchObject({
      status: 409,
      message: expect.stringContaining(`ModelProvider ${ns}/openai`),
    });
  });

  it('reports an unreachable provider; refuses an unknown type at the API server', async () => {
    await apply('ModelProvider', 'down', {
      projectRef: { name: 'acme' },
      baseUrl: 'http://127.0.0.1:9/v1',
    });
    const r = await untilReason('ModelProvider', 'down', 'ProviderUnreachable');
    expect(ready(r)?.message).toMatch(/could not (reach|connect)/);
    await expect(
      apply('ModelProvider', 'claude', {
        projectRef: { name: 'acme' },
        type: 'anthropic',
        baseUrl: 'https://x/v1',
      }),
    ).rejects.toMatchObject({ code: 422 });
    await remove('ModelProvider', 'down');
    await target.until(async () => !(await read('ModelProvider', 'down')), 'the provider resource to go');
    expect(
      await ctx.db
        .selectFrom('providers')
        .select('name')
        .where('project_id', '=', projectId)
        .where('name', '=', 'down')
        .executeTakeFirst(),
    ).toBeUndefined();
  });
});

describe('PriceList', () => {
  const models = [
    { id: 'gpt-4o-mini', pricing: { mode: 'per_token', inputPerMillion: '0.15', outputPerMillion: '0.60' } },
    { id: 'quick', upstreamModel: 'gpt-4o-mini', pricing: { mode: 'per_request', perRequest: '0.01' } },
  ];

  it.each([
    ['a malformed price', [{ id: 'm', pricing: { mode: 'per_request', perRequest: '0.1x' } }]],
    ['a negative price', [{ id: 'm', pricing: { mode: 'per_request', perRequest: '-1' } }]],
    [
      'a price of another mode',
      [{ id: 'm', pricing: { mode: 'per_token', inputPerMillion: '1', perRequest: '1' } }],
    ],
    ['a mode without its price', [{ id: 'm', pricing: { mode: 'subscription', fee: '1' } }]],
    ['an unknown mode', [{ id: 'm', pricing: { mode: 'free' } }]],
  ])('refuses %s at the API server', async (_what, bad) => {
    await expect(
      apply('PriceList', `bad-${Math.random().toString(36).slice(2, 8)}`, {
        projectRef: { name: 'acme' },
        currency: 'usd',
        models: bad,
      }),
    ).rejects.toMatchObject({ code: 422 });
  });

  it('makes the project models exactly the list', async () => {
    await apply('PriceList', 'prices', { projectRef: { name: 'acme' }, currency: 'usd', models });
    const r = await untilReason('PriceList', 'prices');
    expect(r.status).toMatchObject({ projectId, models: 2 });
    const rows = await ctx.db
      .selectFrom('models')
      .selectAll()
      .where('project_id', '=', projectId)
      .orderBy('id')
      .execute();
    expect(rows.map((m) => [m.id, m.pricing_mode, m.upstream_model])).toEqual([
      ['gpt-4o-mini', 'per_token', 'gpt-4o-mini'],
      ['quick', 'per_request', 'gpt-4o-mini'],
    ]);
    expect((await projectById(projectId)).pricing_managed_by).toBe(`PriceList ${ns}/prices`);
    const audited = await ctx.db
      .selectFrom('audit_log')
      .selectAll()
      .where('project_id', '=', projectId)
      .where('action', '=', 'pricing.apply')
      .execute();
    expect(audited).toHaveLength(1);
    expect(audited[0]).toMatchObject({ actor_type: 'operator', actor_id: `PriceList ${ns}/prices` });
    expect((audited[0]!.after as Array<{ id: string }>).map((m) => m.id)).toEqual(['gpt-4o-mini', 'quick']);
  });

  it('follows a price edit and puts back a price changed by hand in the database', async () => {
    await patchSpec('PriceList', 'prices', {
      models: [models[0], { ...models[1], pricing: { mode: 'per_request', perRequest: '0.02' } }],
    });
    const perRequest = async () =>
      Number(
        (
          await ctx.db
            .selectFrom('models')
            .select('per_request')
            .where('project_id', '=', projectId)
            .where('id', '=', 'quick')
            .executeTakeFirst()
        )?.per_request,
      );
    await target.until(async () => (await perRequest()) === 0.02, 'the new price');
    await ctx.db
      .updateTable('models')
      .set({ per_request: '0.5' })
      .where('project_id', '=', projectId)
      .where('id', '=', 'quick')
      .execute();
    await target.until(async () => (await perRequest()) === 0.02, 'the price put back');
  });

  it('is read-only elsewhere', async () => {
    await expect(
      applyModels(ctx, admin, projectId, { currency: 'usd', models: [models[0]] as never }),
    ).rejects.toMatchObject({ status: 409, message: expect.stringContaining(`PriceList ${ns}/prices`) });
  });

  it('refuses a second PriceList for the project (ManagedElsewhere), and reports routes to a missing provider', async () => {
    await apply('PriceList', 'second', { projectRef: { name: 'acme' }, currency: 'usd', models });
    const second = await untilReason('PriceList', 'second', 'ManagedElsewhere');
    expect(ready(second)?.message).toContain(`PriceList ${ns}/prices`);
    await remove('PriceList', 'second');
    await target.until(async () => !(await read('PriceList', 'second')), 'the second list to go');
    // Its deletion left the first list's models alone.
    expect(
      await ctx.db.selectFrom('models').select('id').where('project_id', '=', projectId).execute(),
    ).toHaveLength(2);

    const routed = [{ ...models[0], routes: [{ provider: 'backup', model: 'gpt-4o-mini' }] }, models[1]];
    await patchSpec('PriceList', 'prices', { models: routed });
    const r = await untilReason('PriceList', 'prices', 'ProviderNotFound');
    expect(ready(r)?.message).toContain('backup');
    await apply('ModelProvider', 'backup', { projectRef: { name: 'acme' }, baseUrl: 'echo://local' });
    await untilReason(
      'PriceList',
      'prices',
      'Synced',
      (x) => x.metadata.generation === r.metadata.generation,
    );
    await remove('ModelProvider', 'backup');
    await patchSpec('PriceList', 'prices', { models });
    await untilReason('PriceList', 'prices');
  });

  it('reports a list the service refuses (another currency) as InvalidPrice', async () => {
    await apply('PriceList', 'euros', { projectRef: { name: 'acme' }, currency: 'eur', models });
    const r = await untilReason('PriceList', 'euros', 'InvalidPrice');
    expect(ready(r)?.message).toMatch(/currency/);
    expect(await eventsFor('euros')).toContain('InvalidPrice');
    await remove('PriceList', 'euros');
  });
});

describe('LimitPolicy', () => {
  it('sets the limits, follows edits, corrects drift', async () => {
    await apply('LimitPolicy', 'limits', {
      projectRef: { name: 'acme' },
      user: { rpm: 60 },
      spend: { daily: '5.00' },
    });
    await untilReason('LimitPolicy', 'limits');
    expect((await projectById(projectId)).limits).toEqual({ user: { rpm: 60 }, spend: { daily: '5' } });
    await patchSpec('LimitPolicy', 'limits', { user: { rpm: 30 } });
    await target.until(async () => (await projectById(projectId)).limits?.user?.rpm === 30, 'the new limit');
    await ctx.db.updateTable('projects').set({ limits: null }).where('id', '=', projectId).execute();
    await target.until(
      async () => (await projectById(projectId)).limits?.user?.rpm === 30,
      'the limits put back',
    );
  });

  it('is read-only elsewhere: a pricing file with limits is refused', async () => {
    await remove('PriceList', 'prices');
    await target.until(async () => !(await read('PriceList', 'prices')), 'the price list to go');
    // The price list's models went with it; the project's pricing is editable by hand again.
    expect(
      await ctx.db.selectFrom('models').select('id').where('project_id', '=', projectId).execute(),
    ).toEqual([]);
    const file = {
      currency: 'usd',
      models: [{ id: 'm', pricing: { mode: 'per_request' as const, perRequest: '1' } }],
    };
    await expect(
      applyPricing(ctx.db, projectId, { ...file, limits: { user: { rpm: 1 } } }),
    ).rejects.toMatchObject({
      status: 409,
      message: expect.stringContaining(`LimitPolicy ${ns}/limits`),
    });
    await applyPricing(ctx.db, projectId, file); // no limits in the file: the policy's stay
    expect((await projectById(projectId)).limits?.user?.rpm).toBe(30);
  });

  it('refuses a malformed spend cap at the API server; removes the limits when deleted', async () => {
    await expect(
      apply('LimitPolicy', 'bad', { projectRef: { name: 'acme' }, spend: { daily: '5,00' } }),
    ).rejects.toMatchObject({ code: 422 });
    await remove('LimitPolicy', 'limits');
    await target.until(async () => !(await read('LimitPolicy', 'limits')), 'the policy to go');
    expect(await projectById(projectId)).toMatchObject({ limits: null, limits_managed_by: null });
  });
});

describe('ApiKey', () => {
  const secretValue = async (name: string) => {
    const s = await kube.core.readNamespacedSecret({ name, namespace: ns });
    return Buffer.from(s.data?.apiKey ?? '', 'base64').toString();
  };

  it('waits for its Project, then writes the key to a Secret it owns', async () => {
    await apply('ApiKey', 'early', { projectRef: { name: 'later' } });
    await untilReason('ApiKey', 'early', 'ProjectNotFound');
    await apply('Project', 'later', { currency: 'usd' });
    const r = await untilReason('ApiKey', 'early');
    const secret = await kube.core.readNamespacedSecret({ name: 'early-api-key', namespace: ns });
    expect(secret.metadata?.ownerReferences?.[0]).toMatchObject({
      kind: 'ApiKey',
      uid: r.metadata.uid,
      controller: true,
    });
    const key = await secretValue('early-api-key');
    expect(key).toMatch(/^tg_/);
    expect(r.status?.prefix).toBe(key.slice(0, 11));
    expect(await ctx.keys.resolve(key)).toMatchObject({
      id: r.status?.keyId,
      projectId: r.status?.projectId,
    });
  });

  it('is read-only elsewhere', async () => {
    const r = await read('ApiKey', 'early');
    await expect(
      revokeApiKey(ctx, admin, r!.status!.projectId!, r!.status!.keyId as string),
    ).rejects.toMatchObject({
      status: 409,
      message: expect.stringContaining(`ApiKey ${ns}/early`),
    });
  });

  it('re-issues the key when its Secret is deleted (the old one is revoked)', async () => {
    const before = await read('ApiKey', 'early');
    const oldKey = await secretValue('early-api-key');
    await kube.core.deleteNamespacedSecret({ name: 'early-api-key', namespace: ns });
    const after = await untilReason(
      'ApiKey',
      'early',
      'Synced',
      (r) => r.status?.keyId !== before?.status?.keyId,
    );
    const newKey = await secretValue('early-api-key');
    expect(newKey).not.toBe(oldKey);
    expect(await ctx.keys.resolve(oldKey)).toBeUndefined();
    expect(await ctx.keys.resolve(newKey)).toMatchObject({ id: after.status?.keyId });
    expect(await eventsFor('early')).toEqual(expect.arrayContaining(['Revoked', 'Reissued']));
  });

  it('revokes the key when deleted; its Secret goes with it', async () => {
    const key = await secretValue('early-api-key');
    await remove('ApiKey', 'early');
    await target.until(async () => !(await read('ApiKey', 'early')), 'the key resource to go');
    expect(await ctx.keys.resolve(key)).toBeUndefined();
    await expect(
      kube.core.readNamespacedSecret({ name: 'early-api-key', namespace: ns }),
    ).rejects.toMatchObject({
      code: 404,
    });
  });
});

describe('WebhookSubscription by projectRef', () => {
  it('subscribes the project its Project resource manages', async () => {
    await apply('WebhookSubscription', 'hooks', {
      projectRef: { name: 'acme' },
      url: 'http://127.0.0.1:9/hooks',
      events: ['balance.*'],
    });
    const r = await target.until(async () => {
      const got = await read('WebhookSubscription', 'hooks');
      return ready(got)?.reason === 'Synced' ? got : undefined;
    }, 'the subscription to sync');
    const row = await ctx.db
      .selectFrom('webhook_subscriptions')
      .select(['id', 'project_id'])
      .where('managed_by', '=', `WebhookSubscription ${ns}/hooks`)
      .executeTakeFirstOrThrow();
    expect(row).toEqual({ id: r.status?.subscriptionId, project_id: projectId });
    await expect(
      apply('WebhookSubscription', 'both', {
        projectRef: { name: 'acme' },
        paywallId: projectId,
        url: 'http://127.0.0.1:9/hooks',
        events: ['*'],
      }),
    ).rejects.toMatchObject({ code: 422 });
  });
});

describe('WebhookSubscription by projectRef, before its Project', () => {
  it('reports ProjectNotFound, then syncs once the Project is there', async () => {
    await apply('WebhookSubscription', 'early-hooks', {
      projectRef: { name: 'hooked' },
      url: 'http://127.0.0.1:9/hooks',
      events: ['*'],
    });
    await target.until(
      async () => ready(await read('WebhookSubscription', 'early-hooks'))?.reason === 'ProjectNotFound',
      'ProjectNotFound',
    );
    await apply('Project', 'hooked', { currency: 'usd' });
    await target.until(
      async () => ready(await read('WebhookSubscription', 'early-hooks'))?.reason === 'Synced',
      'the subscription to sync',
    );
  });
});

describe('Project deletion', () => {
  it('hands the row back (balances and ledger stay): editable by hand again', async () => {
    await remove('Project', 'acme');
    await target.until(async () => !(await read('Project', 'acme')), 'the project resource to go');
    const row = await projectById(projectId);
    expect(row.managed_by).toBeNull();
    await updateOwnedProject(ctx, admin, projectId, { name: 'by hand now' });
    expect((await projectById(projectId)).name).toBe('by hand now');
  });
});
