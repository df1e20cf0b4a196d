import { type Actor, operatorActor, recordAudit } from '../audit/index.ts';
import type { Bus } from '../bus/index.ts';
import type { Sealer } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import type { ProjectLimits } from '../db/schema.ts';
import { endpointsOf, type PricingFile, pricingOf } from '../models/pricing.ts';
import { applyPricing, deleteAllModels, type PricingAudit, setProjectLimits } from '../models/service.ts';
import { loadProviders } from '../projects/directory.ts';
import { createKey, findKeyByManager } from '../projects/keys.ts';
import {
  auditedProject,
  createManagedProject,
  findProjectByManager,
  releaseProject,
  updateProject,
} from '../projects/service.ts';
import { removeProvider, upsertProvider } from '../routing/providers.ts';
import { subscriptionsChangedChannel } from '../webhooks/filter.ts';
import {
  createSubscription,
  findSubscriptionByManager,
  releaseSubscription,
  setSubscriptionActive,
  updateSubscription,
  validateSubscriptionInput,
} from '../webhooks/subscriptions.ts';
import type { ApiKeyStore } from './resources/api-key.ts';
import type { ProjectLookup } from './resources/common.ts';
import type { LimitPolicyStore } from './resources/limit-policy.ts';
import type { ModelProviderStore } from './resources/model-provider.ts';
import type { PriceListStore } from './resources/price-list.ts';
import type { ProjectStore } from './resources/project.ts';
import type { SubscriptionStore } from './resources/webhook-subscription.ts';

/**
 * The stores the kinds' handlers are built with (src/operator/resources), over the services the admin
 * API, dashboard and CLI write through — so the rows are the same, with `managedBy` making them
 * read-only elsewhere (src/core/managed.ts). Every write is audited with the resource as the actor, and
 * a write to a project's rows is published to every pod (the project directory).
 */

/** What the stores use of the process's services (the app context, structurally). */
export interface OperatorServices {
  db: Database;
  sealer: Sealer;
  bus: Bus;
  /** The project directory: a project's rows changed (every pod reloads them). */
  projects: { changed(projectId: string): Promise<void> };
  /** The key directory: revokes a key on every pod. */
  keys: { revoke(keyId: string, opts: { managedBy?: string }): Promise<unknown> };
}

/** What the subscription service takes (the app context until it takes a narrower one). */
export type SubscriptionServices = Parameters<typeof createSubscription>[0] &
  Pick<OperatorServices, 'db' | 'bus'>;

/** The checks the admin surface makes before a write, which the operator makes too. */
export interface AdminChecks {
  /** Lists a provider's models; throws, with a readable message, when it does not answer. */
  checkProvider(input: { baseUrl: string; apiKey?: string }): Promise<{ models: string[] }>;
  /** The audit of a pricing change, written in its transaction. */
  pricingAudit(
    actor: Actor,
    project: { id: string; currency: string },
    action: string,
    modelId: null,
  ): PricingAudit;
}

export interface OperatorStores {
  projects: ProjectStore;
  apiKeys: ApiKeyStore;
  providers: ModelProviderStore;
  priceLists: PriceListStore;
  limitPolicies: LimitPolicyStore;
  subscriptions: SubscriptionStore;
}

export function operatorStores(
  services: OperatorServices & SubscriptionServices,
  admin: AdminChecks,
): OperatorStores {
  const lookup = projectLookup(services.db);
  return {
    projects: projectStore(services),
    apiKeys: { ...lookup, ...apiKeyStore(services) },
    providers: { ...lookup, ...providerStore(services, admin) },
    priceLists: { ...lookup, ...priceListStore(services, admin) },
    limitPolicies: { ...lookup, ...limitPolicyStore(services) },
    subscriptions: subscriptionStore(services),
  };
}

function projectLookup(db: Database): ProjectLookup {
  return {
    projectByManager: async (managedBy) => {
      const row = await findProjectByManager(db, managedBy);
      return row && { id: row.id, currency: row.currency };
    },
  };
}

/** An audit entry of the operator: the actor is the resource (`Kind/namespace/name`) that changed it. */
function audit(
  db: Database,
  managedBy: string,
  projectId: string,
  target: { action: string; type: string; id: string | null },
  before: unknown,
  after: unknown,
): Promise<string> {
  const actor = operatorActor(managedBy);
  return recordAudit(db, {
    actor,
    projectId,
    action: target.action,
    targetType: target.type,
    targetId: target.id,
    before,
    after,
  });
}

function projectStore({ db, sealer, projects }: OperatorServices): ProjectStore {
  return {
    findByManager: (managedBy) => findProjectByManager(db, managedBy),
    async create(input, managedBy) {
      const row = await createManagedProject(db, sealer, input, managedBy);
      await projects.changed(row.id);
      return row;
    },
    async update(before, input, managedBy) {
      const opts = { managedBy, replaceSettings: true };
      const row = await updateProject(db, sealer, before.id, input, opts);
      const target = { action: 'project.update', type: 'project', id: row.id };
      await audit(db, managedBy, row.id, target, auditedProject(before), auditedProject(row));
      await projects.changed(row.id);
      return row;
    },
    async release(row, managedBy) {
      await releaseProject(db, row.id, managedBy);
      const target = { action: 'project.release', type: 'project', id: row.id };
      await audit(db, managedBy, row.id, target, { managedBy }, { managedBy: null });
      await projects.changed(row.id);
    },
  };
}

function apiKeyStore({ db, keys }: OperatorServices): Omit<ApiKeyStore, keyof ProjectLookup> {
  return {
    findByManager: async (managedBy) => (await findKeyByManager(db, managedBy)) ?? undefined,
    async issue(projectId, name, managedBy) {
      const created = await createKey(db, projectId, name, { managedBy });
      const target = { action: 'api_key.create', type: 'api_key', id: created.id };
      await audit(db, managedBy, projectId, target, null, { name, prefix: created.prefix });
      return created;
    },
    async revoke(key, managedBy) {
      await keys.revoke(key.id, { managedBy });
      const target = { action: 'api_key.revoke', type: 'api_key', id: key.id };
      await audit(
        db,
        managedBy,
        key.project_id,
        target,
        { prefix: key.prefix, revoked: false },
        { prefix: key.prefix, revoked: true },
      );
    },
  };
}

function providerStore(
  { db, sealer, projects }: OperatorServices,
  admin: AdminChecks,
): Omit<ModelProviderStore, keyof ProjectLookup> {
  return {
    find: async (projectId, name) => (await loadProviders(db, sealer, projectId)).get(name),
    async upsert(projectId, provider, managedBy) {
      await upsertProvider(db, sealer, projectId, provider, { managedBy, actor: operatorActor(managedBy) });
      await projects.changed(projectId);
    },
    async release(managedBy, keep) {
      let query = db
        .selectFrom('providers')
        .select(['project_id', 'name'])
        .where('managed_by', '=', managedBy);
      if (keep)
        query = query.where((eb) =>
          eb.not(eb.and([eb('project_id', '=', keep.projectId), eb('name', '=', keep.name)])),
        );
      const rows = await query.orderBy('project_id').orderBy('name').execute();
      for (const row of rows) {
        await removeProvider(db, row.project_id, row.name, { managedBy, actor: operatorActor(managedBy) });
        await projects.changed(row.project_id);
      }
      return rows.map((row) => ({ projectId: row.project_id, name: row.name }));
    },
    check: (input) => admin.checkProvider(input),
  };
}

function priceListStore(
  { db, projects }: OperatorServices,
  admin: AdminChecks,
): Omit<PriceListStore, keyof ProjectLookup> {
  return {
    async current(projectId) {
      const [rows, project] = await Promise.all([
        db.selectFrom('models').selectAll().where('project_id', '=', projectId).execute(),
        db
          .selectFrom('projects')
          .select('pricing_managed_by')
          .where('id', '=', projectId)
          .executeTakeFirstOrThrow(),
      ]);
      const models = rows.map((m) => ({
        id: m.id,
        upstreamModel: m.upstream_model,
        endpoints: endpointsOf(m),
        pricing: pricingOf(m),
        ...(m.routes ? { routes: m.routes } : {}),
      }));
      return { models: models as PricingFile['models'], managedBy: project.pricing_managed_by };
    },
    async apply(project, file, managedBy) {
      const pricingAudit = admin.pricingAudit(operatorActor(managedBy), project, 'pricing.apply', null);
      const result = await applyPricing(db, project.id, file, { managedBy, audit: pricingAudit });
      await projects.changed(project.id);
      return result;
    },
    async providerNames(projectId) {
      const rows = await db
        .selectFrom('providers')
        .select('name')
        .where('project_id', '=', projectId)
        .execute();
      return new Set(rows.map((p) => p.name));
    },
    async release(managedBy, keep) {
      const released: string[] = [];
      for (const projectId of await managedProjects(db, 'pricing_managed_by', managedBy, keep)) {
        const models = await db
          .selectFrom('models')
          .select('id')
          .where('project_id', '=', projectId)
          .orderBy('id')
          .execute();
        await deleteAllModels(db, projectId, { managedBy });
        const target = { action: 'pricing.delete', type: 'pricing', id: null };
        await audit(db, managedBy, projectId, target, { models: models.map((m) => m.id) }, null);
        await projects.changed(projectId);
        released.push(projectId);
      }
      return released;
    },
  };
}

/** The projects whose pricing (or limits) `managedBy` manages, but `keep`. */
async function managedProjects(
  db: Database,
  column: 'pricing_managed_by' | 'limits_managed_by',
  managedBy: string,
  keep: string | undefined,
): Promise<string[]> {
  let query = db.selectFrom('projects').select('id').where(column, '=', managedBy);
  if (keep) query = query.where('id', '!=', keep);
  return (await query.orderBy('id').execute()).map((p) => p.id);
}

function limitPolicyStore({ db, projects }: OperatorServices): Omit<LimitPolicyStore, keyof ProjectLookup> {
  const limitsAudit = { action: 'limits.update', type: 'limits', id: null };
  const read = (projectId: string) =>
    db.selectFrom('projects').select(['limits', 'limits_managed_by']).where('id', '=', projectId);
  return {
    async current(projectId) {
      const row = await read(projectId).executeTakeFirstOrThrow();
      return { limits: (row.limits ?? null) as ProjectLimits | null, managedBy: row.limits_managed_by };
    },
    async set(projectId, limits, managedBy, replaced) {
      await setProjectLimits(db, projectId, limits, { managedBy });
      if (replaced !== undefined) await audit(db, managedBy, projectId, limitsAudit, replaced, limits);
      await projects.changed(projectId);
    },
    async release(managedBy, keep) {
      const released: string[] = [];
      for (const projectId of await managedProjects(db, 'limits_managed_by', managedBy, keep)) {
        const row = await read(projectId).executeTakeFirstOrThrow();
        await setProjectLimits(db, projectId, null, { managedBy, release: true });
        if (row.limits) await audit(db, managedBy, projectId, limitsAudit, row.limits, null);
        await projects.changed(projectId);
        released.push(projectId);
      }
      return released;
    },
  };
}

/** The subscription service the REST API uses, bound to the process's services. */
export function subscriptionStore(services: SubscriptionServices): SubscriptionStore {
  return {
    ...projectLookup(services.db),
    findByManager: (managedBy) => findSubscriptionByManager(services, managedBy),
    create: async (projectId, input, opts) =>
      (await createSubscription(services, projectId, input, opts)).subscription,
    update: (projectId, id, input, opts) => updateSubscription(services, projectId, id, input, opts),
    setActive: (projectId, id, active, opts) => setSubscriptionActive(services, projectId, id, active, opts),
    release: (projectId, id, managedBy) => releaseSubscription(services, projectId, id, managedBy),
    validate: (input) => validateSubscriptionInput(services, input),
    watchChanges: (onProject) => services.bus.subscribe(subscriptionsChangedChannel, onProject),
  };
}
