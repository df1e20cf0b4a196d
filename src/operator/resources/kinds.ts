import type { V1Secret } from '@kubernetes/client-node';
import { checkProvider, pricingAudit, projectAudit } from '../../admin/service.ts';
import { type AuditEntry, operatorActor, recordAudit } from '../../audit/index.ts';
import { sha256Hex } from '../../core/crypto.ts';
import { parseInput } from '../../core/validation.ts';
import type { ProjectLimits, ProjectSettings } from '../../db/schema.ts';
import {
  DEFAULT_ENDPOINTS,
  endpointsOf,
  limitsSchema,
  type PricingFile,
  pricingFileSchema,
  pricingOf,
} from '../../models/pricing.ts';
import { applyPricing, deleteAllModels, setProjectLimits } from '../../models/service.ts';
import { loadProviders } from '../../projects/directory.ts';
import { createKey, findKeyByManager } from '../../projects/keys.ts';
import {
  createManagedProject,
  findProjectByManager,
  releaseProject,
  updateProject,
} from '../../projects/service.ts';
import { removeProvider, upsertProvider } from '../../routing/providers.ts';
import { API_VERSION, GROUP } from '../api.ts';
import { FIELD_MANAGER, statusOf } from '../runtime/kube.ts';
import { Failure, type Helpers, type KindHandler, type Resource, type Synced } from './framework.ts';

/**
 * The kinds of group tollgate.dev/v1alpha1 that declare a deployment (crds/*.tollgate.dev.yaml): each
 * reconciled into the rows the admin API, dashboard and CLI write, through the same service functions,
 * with `managedBy` so that those rows are read-only elsewhere (src/core/managed.ts).
 */

interface ProjectRef {
  projectRef?: { name?: string };
}

const finalizerOf = (kind: string) => `${GROUP}/${kind.toLowerCase()}`;
const projectRefOf = (r: Resource<ProjectRef>) => r.spec?.projectRef?.name;
const synced = (message: string, rest: Omit<Synced, 'reason' | 'message'> = {}): Synced => ({
  reason: 'Synced',
  message,
  ...rest,
});
const normal = (reason: string, message: string) => ({ type: 'Normal' as const, reason, message });
const specChanged = (r: Resource<unknown>) => r.status?.observedGeneration !== r.metadata.generation;
/** "Updated" after a spec change; "Put back" when the rows changed outside the resource (drift). */
const updateEvent = (r: Resource, what: string) =>
  specChanged(r)
    ? normal('Updated', `Updated ${what}`)
    : normal('DriftCorrected', `Put back ${what} changed outside the resource`);

/** The status' project id, for finalizers: the Project resource may be gone already. */
const statusProject = (r: Resource) =>
  typeof r.status?.projectId === 'string' ? r.status.projectId : undefined;

function secretValue(secret: V1Secret, key: string): string | undefined {
  const encoded = secret.data?.[key];
  const value =
    encoded !== undefined ? Buffer.from(encoded, 'base64').toString('utf8') : secret.stringData?.[key];
  return value === '' ? undefined : value;
}

// ---- Project ----------------------------------------------------------------------------------------

export interface ProjectSpec {
  displayName?: string;
  currency?: string;
  ownerUserId?: string;
  settings?: ProjectSettings;
}

export const projectHandler: KindHandler<ProjectSpec> = {
  kind: 'Project',
  plural: 'projects',
  finalizer: finalizerOf('Project'),
  async sync(r, h) {
    const spec = r.spec ?? {};
    if (!spec.currency) throw new Failure('InvalidSpec', 'spec.currency is required', false);
    const name = spec.displayName ?? r.metadata.name;
    const settings = spec.settings ?? {};
    const { ctx } = h;
    let row = await findProjectByManager(ctx.db, h.managedBy);
    const events = [];
    if (!row) {
      row = await createManagedProject(
        ctx.db,
        ctx.sealer,
        {
          name,
          currency: spec.currency,
          settings,
          ...(spec.ownerUserId ? { ownerUserId: spec.ownerUserId } : {}),
        },
        h.managedBy,
      );
      events.push(normal('Created', `Created project ${row.id}`));
    } else {
      if (row.currency !== spec.currency)
        throw new Failure(
          'InvalidSpec',
          `spec.currency cannot change (project ${row.id} holds balances in ${row.currency}); delete and re-create the resource to change it`,
          false,
        );
      const drift = [
        ...(row.name !== name ? ['name'] : []),
        ...(canonical(row.settings) !== canonical(settings) ? ['settings'] : []),
      ];
      if (drift.length) {
        const before = row;
        row = await updateProject(
          ctx.db,
          ctx.sealer,
          row.id,
          { name, settings },
          { managedBy: h.managedBy, replaceSettings: true },
        );
        await audit(h, row.id, 'project.update', 'project', row.id, projectAudit(before), projectAudit(row));
        events.push(updateEvent(r, `project ${row.id} (${drift.join(', ')})`));
      }
    }
    if (events.length) await ctx.projects.changed(row.id);
    return synced(`Project ${row.id} is in sync`, {
      status: { projectId: row.id, currency: row.currency },
      events,
    });
  },
  async finalize(_r, h) {
    const row = await findProjectByManager(h.ctx.db, h.managedBy);
    if (!row) return undefined;
    await releaseProject(h.ctx.db, row.id, h.managedBy);
    await audit(
      h,
      row.id,
      'project.release',
      'project',
      row.id,
      { managedBy: h.managedBy },
      { managedBy: null },
    );
    await h.ctx.projects.changed(row.id);
    return `Released project ${row.id}: its balances and ledger stay; it is editable by hand again`;
  },
};

/** An audit entry of the operator: the actor is the resource (`Kind/namespace/name`) that changed it. */
function audit(
  h: Helpers,
  projectId: string,
  action: string,
  targetType: string,
  targetId: string | null,
  before: unknown,
  after: unknown,
): Promise<string> {
  const entry: AuditEntry = {
    actor: operatorActor(h.managedBy),
    projectId,
    action,
    targetType,
    targetId,
    before,
    after,
  };
  return recordAudit(h.ctx.db, entry);
}

/** JSON with sorted keys, to compare settings and limits whatever their key order. */
function canonical(value: unknown): string {
  return JSON.stringify(value ?? null, (_k, v) =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)))
      : v,
  );
}

// ---- ApiKey -----------------------------------------------------------------------------------------

export interface ApiKeySpec extends ProjectRef {
  /** The key's name in the project (default: the resource's name). */
  keyName?: string;
  /** The Secret the key is written to (default `<name>-api-key`), owned by the resource. */
  secretName?: string;
}

/** Keys of the Secret an ApiKey writes. */
export const API_KEY_SECRET_KEY = 'apiKey';
const apiKeySecretName = (r: Resource<ApiKeySpec>) => r.spec?.secretName || `${r.metadata.name}-api-key`;

export const apiKeyHandler: KindHandler<ApiKeySpec> = {
  kind: 'ApiKey',
  plural: 'apikeys',
  finalizer: finalizerOf('ApiKey'),
  projectOf: projectRefOf,
  secretsOf: (r) => [apiKeySecretName(r)],
  async sync(r, h) {
    const namespace = r.metadata.namespace ?? '';
    const project = await h.project(namespace, projectRefOf(r));
    const secretName = apiKeySecretName(r);
    const keyName = r.spec?.keyName || r.metadata.name;
    const { ctx } = h;
    let key = await findKeyByManager(ctx.db, h.managedBy);
    if (key && key.project_id !== project.id)
      throw new Failure(
        'InvalidSpec',
        `spec.projectRef cannot change (key ${key.id} belongs to ${key.project_id}); delete and re-create the resource`,
        false,
      );
    let secret = await h.secret(namespace, secretName);
    let value = secret ? secretValue(secret, API_KEY_SECRET_KEY) : undefined;
    if (key && (!value || sha256Hex(value) !== key.key_hash)) {
      // The cache may not have seen our last write yet: only the API server's copy proves a drift.
      secret = await h.secret(namespace, secretName, { fresh: true });
      value = secret ? secretValue(secret, API_KEY_SECRET_KEY) : undefined;
    }
    const ownedByUs = secret?.metadata?.ownerReferences?.some((o) => o.uid === r.metadata.uid) ?? false;
    if (secret && !ownedByUs)
      throw new Failure(
        'SecretConflict',
        `Secret ${namespace}/${secretName} exists and is not owned by this ApiKey; choose another spec.secretName`,
        true,
      );
    const events = [];
    if (!key || !value || sha256Hex(value) !== key.key_hash) {
      // The value is shown once and only its hash is stored: a key whose Secret is gone or altered cannot be
      // written back, so it is revoked and a new one issued (as cert-manager re-issues a certificate).
      if (key) {
        await ctx.keys.revoke(key.id, { managedBy: h.managedBy });
        await audit(
          h,
          project.id,
          'api_key.revoke',
          'api_key',
          key.id,
          { prefix: key.prefix, revoked: false },
          {
            prefix: key.prefix,
            revoked: true,
          },
        );
        events.push(
          normal(
            'Revoked',
            `Revoked key ${key.prefix}… (${key.id}): Secret ${secretName} was missing or changed`,
          ),
        );
      }
      const created = await createKey(ctx.db, project.id, keyName, { managedBy: h.managedBy });
      await audit(h, project.id, 'api_key.create', 'api_key', created.id, null, {
        name: keyName,
        prefix: created.prefix,
      });
      await writeKeySecret(h, r, secretName, secret, {
        [API_KEY_SECRET_KEY]: created.key,
        projectId: project.id,
      });
      events.push(
        normal(
          key ? 'Reissued' : 'Created',
          `Issued key ${created.prefix}… (${created.id}) into Secret ${secretName}`,
        ),
      );
      key = (await findKeyByManager(ctx.db, h.managedBy)) ?? undefined;
    }
    if (!key) throw new Failure('ReconcileError', 'the key just issued is not found', true);
    return synced(`Key ${key.prefix}… is active; its value is in Secret ${secretName}`, {
      status: { projectId: project.id, keyId: key.id, prefix: key.prefix, secretName },
      events,
    });
  },
  async finalize(_r, h) {
    const key = await findKeyByManager(h.ctx.db, h.managedBy);
    if (!key) return undefined;
    await h.ctx.keys.revoke(key.id, { managedBy: h.managedBy });
    await audit(
      h,
      key.project_id,
      'api_key.revoke',
      'api_key',
      key.id,
      { prefix: key.prefix, revoked: false },
      {
        prefix: key.prefix,
        revoked: true,
      },
    );
    return `Revoked key ${key.prefix}… (${key.id})`;
  },
  async orphan(managedBy, h) {
    const key = await findKeyByManager(h.ctx.db, managedBy);
    if (key) {
      await h.ctx.keys.revoke(key.id, { managedBy });
      await recordAudit(h.ctx.db, {
        actor: operatorActor(managedBy),
        projectId: key.project_id,
        action: 'api_key.revoke',
        targetType: 'api_key',
        targetId: key.id,
        before: { prefix: key.prefix, revoked: false },
        after: { prefix: key.prefix, revoked: true },
      });
    }
  },
};

async function writeKeySecret(
  h: Helpers,
  r: Resource,
  name: string,
  existing: V1Secret | undefined,
  values: Record<string, string>,
): Promise<void> {
  const namespace = r.metadata.namespace ?? '';
  const body: V1Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'Opaque',
    metadata: {
      name,
      namespace,
      labels: { 'app.kubernetes.io/managed-by': FIELD_MANAGER, 'tollgate.dev/api-key': r.metadata.name },
      ownerReferences: [
        {
          apiVersion: API_VERSION,
          kind: 'ApiKey',
          name: r.metadata.name,
          uid: r.metadata.uid ?? '',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
      ...(existing?.metadata?.resourceVersion ? { resourceVersion: existing.metadata.resourceVersion } : {}),
    },
    data: Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
  };
  if (existing) {
    await h.kube.core.replaceNamespacedSecret({ name, namespace, body, fieldManager: FIELD_MANAGER });
    return;
  }
  try {
    await h.kube.core.createNamespacedSecret({ namespace, body, fieldManager: FIELD_MANAGER });
  } catch (err) {
    if (statusOf(err) !== 409) throw err;
    const current = await h.kube.core.readNamespacedSecret({ name, namespace });
    await h.kube.core.replaceNamespacedSecret({
      name,
      namespace,
      fieldManager: FIELD_MANAGER,
      body: { ...body, metadata: { ...body.metadata, resourceVersion: current.metadata?.resourceVersion } },
    });
  }
}

// ---- ModelProvider ----------------------------------------------------------------------------------

export interface ModelProviderSpec extends ProjectRef {
  /** `openai-compatible` (the only one today; `anthropic` is reserved). */
  type?: string;
  /** The provider's name in the project, which routes refer to (default: the resource's name). */
  providerName?: string;
  baseUrl?: string;
  secretRef?: { name?: string; key?: string };
  timeouts?: { connectMs?: number; responseMs?: number };
}

const PROVIDER_SECRET_KEY = 'apiKey';
const providerNameOf = (r: Resource<ModelProviderSpec>) => r.spec?.providerName || r.metadata.name;

export const modelProviderHandler: KindHandler<ModelProviderSpec> = {
  kind: 'ModelProvider',
  plural: 'modelproviders',
  finalizer: finalizerOf('ModelProvider'),
  projectOf: projectRefOf,
  secretsOf: (r) => (r.spec?.secretRef?.name ? [r.spec.secretRef.name] : []),
  async sync(r, h) {
    const spec = r.spec ?? {};
    const namespace = r.metadata.namespace ?? '';
    if ((spec.type ?? 'openai-compatible') !== 'openai-compatible')
      throw new Failure(
        'InvalidSpec',
        `spec.type ${spec.type} is not supported yet (openai-compatible is)`,
        false,
      );
    if (!spec.baseUrl) throw new Failure('InvalidSpec', 'spec.baseUrl is required', false);
    const project = await h.project(namespace, projectRefOf(r));
    const name = providerNameOf(r);
    let apiKey: string | null = null;
    if (spec.secretRef?.name) {
      const secretKey = spec.secretRef.key || PROVIDER_SECRET_KEY;
      const secret = await h.secret(namespace, spec.secretRef.name);
      if (!secret)
        throw new Failure('SecretNotFound', `Secret ${namespace}/${spec.secretRef.name} not found`, true);
      apiKey = secretValue(secret, secretKey) ?? null;
      if (!apiKey)
        throw new Failure(
          'SecretNotFound',
          `Secret ${namespace}/${spec.secretRef.name} has no key "${secretKey}"`,
          true,
        );
    }
    const { ctx } = h;
    const current = (await loadProviders(ctx.db, ctx.sealer, project.id)).get(name);
    const baseUrl = spec.baseUrl.replace(/\/+$/, '');
    const drift = !current
      ? []
      : [
          ...(current.baseUrl !== baseUrl ? ['baseUrl'] : []),
          ...((current.apiKey ?? null) !== apiKey ? ['key'] : []),
          ...((current.connectMs ?? null) !== (spec.timeouts?.connectMs ?? null) ||
          (current.responseMs ?? null) !== (spec.timeouts?.responseMs ?? null)
            ? ['timeouts']
            : []),
        ];
    const previous = r.status?.conditions?.find((c) => c.type === 'Ready');
    const events = [];
    if (!current || drift.length || previous?.reason !== 'Synced') {
      await upsertProvider(
        ctx.db,
        ctx.sealer,
        project.id,
        { name, baseUrl, key: apiKey, ...(spec.timeouts ? { timeouts: spec.timeouts } : {}) },
        { managedBy: h.managedBy, actor: operatorActor(h.managedBy) },
      );
      if (!current) events.push(normal('Created', `Created provider ${name} in ${project.id}`));
      else if (drift.length) events.push(updateEvent(r, `provider ${name} (${drift.join(', ')})`));
      await ctx.projects.changed(project.id);
    }
    const status = { projectId: project.id, providerName: name, keySet: apiKey !== null };
    // Reachability is checked when the provider is written or was not reachable, not on every resync.
    if (!current || drift.length || previous?.reason !== 'Synced') {
      try {
        const { models } = await checkProvider(ctx, { baseUrl, ...(apiKey ? { apiKey } : {}) });
        return synced(`Provider ${name} answers (${models.length} models listed)`, { status, events });
      } catch (err) {
        return {
          reason: 'ProviderUnreachable',
          message: (err as Error).message,
          notReady: true,
          status,
          events: [
            ...events,
            { type: 'Warning', reason: 'ProviderUnreachable', message: (err as Error).message },
          ],
        };
      }
    }
    return synced(previous.message, { status, events });
  },
  async finalize(r, h) {
    const projectId = statusProject(r);
    if (!projectId) return undefined;
    const removed = await removeProvider(h.ctx.db, projectId, providerNameOf(r), {
      managedBy: h.managedBy,
      actor: operatorActor(h.managedBy),
    });
    await h.ctx.projects.changed(projectId);
    return removed ? `Removed provider ${providerNameOf(r)} from ${projectId}` : undefined;
  },
};

// ---- PriceList --------------------------------------------------------------------------------------

export interface PriceListSpec extends ProjectRef {
  currency?: string;
  models?: PricingFile['models'];
}

/** Decimal strings compared by value ("0.150000" from the database equals "0.15"). */
const decimal = (v: string | undefined) =>
  v === undefined ? undefined : v.includes('.') ? v.replace(/0+$/, '').replace(/\.$/, '') : v;

function normalModels(models: PricingFile['models']): string {
  return canonical(
    [...models]
      .sort((a, b) => a.id.localeCompare(b.id))
      .map((m) => ({
        id: m.id,
        upstreamModel: m.upstreamModel ?? m.id,
        endpoints: m.endpoints ?? DEFAULT_ENDPOINTS,
        routes: m.routes ?? null,
        pricing: Object.fromEntries(
          Object.entries({
            ...(m.pricing.mode === 'per_token' ? { outputPerMillion: '0' } : {}),
            ...m.pricing,
          }).map(([k, v]) => [k, k === 'mode' || k === 'period' ? v : decimal(String(v))]),
        ),
      })),
  );
}

export const priceListHandler: KindHandler<PriceListSpec> = {
  kind: 'PriceList',
  plural: 'pricelists',
  finalizer: finalizerOf('PriceList'),
  invalidReason: 'InvalidPrice',
  projectOf: projectRefOf,
  async sync(r, h) {
    const namespace = r.metadata.namespace ?? '';
    const project = await h.project(namespace, projectRefOf(r));
    let file: PricingFile;
    try {
      file = parseInput(pricingFileSchema, { currency: r.spec?.currency, models: r.spec?.models }, 'spec');
    } catch (err) {
      throw new Failure('InvalidPrice', (err as Error).message, false);
    }
    if (file.currency !== project.currency)
      throw new Failure(
        'InvalidPrice',
        `spec.currency ${file.currency} differs from the project's currency ${project.currency}`,
        false,
      );
    const { ctx } = h;
    const [rows, row] = await Promise.all([
      ctx.db.selectFrom('models').selectAll().where('project_id', '=', project.id).execute(),
      ctx.db
        .selectFrom('projects')
        .select('pricing_managed_by')
        .where('id', '=', project.id)
        .executeTakeFirstOrThrow(),
    ]);
    const current = rows.map((m) => ({
      id: m.id,
      upstreamModel: m.upstream_model,
      endpoints: endpointsOf(m),
      pricing: pricingOf(m),
      ...(m.routes ? { routes: m.routes } : {}),
    }));
    const events = [];
    if (
      row.pricing_managed_by !== h.managedBy ||
      normalModels(current as never) !== normalModels(file.models)
    ) {
      const result = await applyPricing(ctx.db, project.id, file, {
        managedBy: h.managedBy,
        audit: pricingAudit(operatorActor(h.managedBy), project, 'pricing.apply', null),
      });
      await ctx.projects.changed(project.id);
      const what = `the prices of ${project.id} (created ${result.created.length}, updated ${result.updated.length}, deleted ${result.deleted.length})`;
      events.push(
        row.pricing_managed_by !== h.managedBy ? normal('Applied', `Applied ${what}`) : updateEvent(r, what),
      );
    }
    const status = { projectId: project.id, models: file.models.length };
    // Routes naming a provider the project lacks would fail at request time: say so now.
    const providers = new Set(
      (
        await ctx.db.selectFrom('providers').select('name').where('project_id', '=', project.id).execute()
      ).map((p) => p.name),
    );
    const missing = [
      ...new Set(
        file.models.flatMap((m) =>
          (m.routes ?? [{ provider: 'default' }])
            .map((route) => route.provider)
            .filter((p) => !providers.has(p)),
        ),
      ),
    ];
    if (missing.length)
      return {
        reason: 'ProviderNotFound',
        message: `prices applied, but the project has no provider ${missing.join(', ')} (declare a ModelProvider with that providerName)`,
        notReady: true,
        status,
        events,
      };
    return synced(`${file.models.length} models priced in ${file.currency}`, { status, events });
  },
  async finalize(r, h) {
    const projectId = statusProject(r);
    if (!projectId) return undefined;
    const row = await h.ctx.db
      .selectFrom('projects')
      .select('pricing_managed_by')
      .where('id', '=', projectId)
      .executeTakeFirst();
    if (row?.pricing_managed_by !== h.managedBy) return undefined;
    const models = await h.ctx.db
      .selectFrom('models')
      .select('id')
      .where('project_id', '=', projectId)
      .orderBy('id')
      .execute();
    await deleteAllModels(h.ctx.db, projectId, { managedBy: h.managedBy });
    await audit(h, projectId, 'pricing.delete', 'pricing', null, { models: models.map((m) => m.id) }, null);
    await h.ctx.projects.changed(projectId);
    return `Deleted the models of ${projectId}`;
  },
};

// ---- LimitPolicy ------------------------------------------------------------------------------------

export interface LimitPolicySpec extends ProjectRef, ProjectLimits {}

export const limitPolicyHandler: KindHandler<LimitPolicySpec> = {
  kind: 'LimitPolicy',
  plural: 'limitpolicies',
  finalizer: finalizerOf('LimitPolicy'),
  projectOf: projectRefOf,
  async sync(r, h) {
    const namespace = r.metadata.namespace ?? '';
    const project = await h.project(namespace, projectRefOf(r));
    const { projectRef: _ref, ...declared } = r.spec ?? {};
    let limits: ProjectLimits;
    try {
      limits = parseInput(limitsSchema, declared, 'spec') as ProjectLimits;
    } catch (err) {
      throw new Failure('InvalidSpec', (err as Error).message, false);
    }
    const { ctx } = h;
    const row = await ctx.db
      .selectFrom('projects')
      .select(['limits', 'limits_managed_by'])
      .where('id', '=', project.id)
      .executeTakeFirstOrThrow();
    const events = [];
    if (row.limits_managed_by !== h.managedBy || canonical(row.limits) !== canonical(limits)) {
      await setProjectLimits(ctx.db, project.id, limits, { managedBy: h.managedBy });
      if (canonical(row.limits) !== canonical(limits))
        await audit(h, project.id, 'limits.update', 'limits', null, row.limits ?? null, limits);
      await ctx.projects.changed(project.id);
      events.push(
        row.limits_managed_by !== h.managedBy
          ? normal('Applied', `Applied the limits of ${project.id}`)
          : updateEvent(r, `the limits of ${project.id}`),
      );
    }
    return synced(`Limits of ${project.id} are in sync`, { status: { projectId: project.id }, events });
  },
  async finalize(r, h) {
    const projectId = statusProject(r);
    if (!projectId) return undefined;
    const row = await h.ctx.db
      .selectFrom('projects')
      .select('limits_managed_by')
      .where('id', '=', projectId)
      .executeTakeFirst();
    if (row?.limits_managed_by !== h.managedBy) return undefined;
    const was = await h.ctx.db
      .selectFrom('projects')
      .select('limits')
      .where('id', '=', projectId)
      .executeTakeFirst();
    await setProjectLimits(h.ctx.db, projectId, null, { managedBy: h.managedBy, release: true });
    if (was?.limits) await audit(h, projectId, 'limits.update', 'limits', null, was.limits, null);
    await h.ctx.projects.changed(projectId);
    return `Removed the limits of ${projectId}`;
  },
};

export const RESOURCE_HANDLERS = [
  projectHandler,
  apiKeyHandler,
  modelProviderHandler,
  priceListHandler,
  limitPolicyHandler,
] as Array<KindHandler<never>>;
