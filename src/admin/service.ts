import type { Transaction } from 'kysely';
import type { Logger } from 'pino';
import { request } from 'undici';
import { z } from 'zod';
import { type Actor, recordAudit } from '../audit/index.ts';
import type { KeyDirectory } from '../auth/key-directory.ts';
import type { BillingService } from '../billing/service.ts';
import type { Config } from '../config/index.ts';
import type { Sealer } from '../core/crypto.ts';
import { ApiError, badRequest, notFound } from '../core/errors.ts';
import { storableText } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { DB, Project } from '../db/schema.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { ModelSpec, PricingFile } from '../models/pricing.ts';
import { type ApplyResult, applyPricing, editPricing, listedModel, readPricing } from '../models/service.ts';
import { checkDestination, DestinationError } from '../net/destination.ts';
import type { ProjectDirectory } from '../projects/directory.ts';
import { createKey, listKeys } from '../projects/keys.ts';
import {
  assertConnectionWritable,
  auditedProject,
  baseUrlProblem,
  type CreateProjectInput,
  createProject,
  DEFAULT_PROVIDER,
  ECHO_UPSTREAM,
  type UpdateProjectInput,
  updateProject,
} from '../projects/service.ts';
import { PROVIDER_KINDS, upsertProvider } from '../routing/providers.ts';
import { ANTHROPIC_VERSION } from '../upstream/anthropic/provider.ts';
import { createUpstreamAgent } from '../upstream/openai-compatible.ts';
import { actorOf, type Principal } from './accounts.ts';

/**
 * What the admin API and the dashboard do, on plain inputs. Every function that takes a project id first
 * checks that the principal may see it (`ownedProject`): a developer sees only the projects they own,
 * and a project of someone else answers 404 as if it did not exist. End users and their
 * money: ./end-users.ts. Revocations go through the key directory.
 */

/** What the admin operations use of the process (the app context passes as it is). */
export interface AdminServices {
  config: Config;
  log: Logger;
  db: Database;
  sealer: Sealer;
  events: EventRecorder;
  billing: BillingService;
  keys: Pick<KeyDirectory, 'revoke' | 'revokeUserKey'>;
  projects: Pick<ProjectDirectory, 'changed'>;
  publicBaseUrl: string;
}

// ---- projects ----

export interface ProjectView {
  id: string;
  object: 'project';
  name: string;
  currency: string;
  ownerId: string;
  provider: { baseUrl: string | null; keySet: boolean; connected: boolean };
  settings: Project['settings'];
  /** The Kubernetes resources managing the project, its prices and its limits (read-only here), or null. */
  managedBy: { project: string | null; pricing: string | null; limits: string | null };
  createdAt: string;
  updatedAt: string;
}

export function projectView(p: Project): ProjectView {
  return {
    id: p.id,
    object: 'project',
    name: p.name,
    currency: p.currency,
    ownerId: p.owner_user_id,
    provider: {
      baseUrl: p.upstream_base_url,
      keySet: p.upstream_key_sealed !== null,
      connected: p.upstream_base_url !== null,
    },
    settings: p.settings,
    managedBy: { project: p.managed_by, pricing: p.pricing_managed_by, limits: p.limits_managed_by },
    createdAt: p.created_at.toISOString(),
    updatedAt: p.updated_at.toISOString(),
  };
}

/** The project when the principal may see it; 404 otherwise (another developer's project does not exist). */
export async function ownedProject(
  ctx: Pick<AdminServices, 'db'>,
  principal: Principal,
  projectId: string,
): Promise<Project> {
  const project = await ctx.db
    .selectFrom('projects')
    .selectAll()
    .where('id', '=', projectId)
    .executeTakeFirst();
  if (!project || (principal.developerId !== null && project.owner_user_id !== principal.developerId)) {
    throw notFound(`No project ${projectId}.`, 'project_not_found', 'project');
  }
  return project;
}

export interface Page {
  limit: number;
  startingAfter?: string | undefined;
}

export async function listProjects(ctx: AdminServices, principal: Principal, page: Page) {
  let query = ctx.db
    .selectFrom('projects')
    .selectAll()
    .orderBy('id')
    .limit(page.limit + 1);
  if (principal.developerId !== null) query = query.where('owner_user_id', '=', principal.developerId);
  if (page.startingAfter) query = query.where('id', '>', page.startingAfter);
  const rows = await query.execute();
  return list(rows.slice(0, page.limit).map(projectView), rows.length > page.limit);
}

/** The audited view of a project's settings and connection (no secret: the key is `keySet`). */
export function projectAudit(p: Project) {
  return auditedProject(p);
}

export function list<T>(data: T[], hasMore: boolean) {
  return { object: 'list' as const, data, has_more: hasMore };
}

export const createProjectBody = z.strictObject({
  name: storableText(200),
  currency: z
    .string()
    .regex(/^[a-z]{3}$/, { message: 'must be a lowercase three-letter currency code such as usd' })
    .default('usd'),
  /** Begin on the built-in echo provider with a starter price list (./starter.ts); connect one later. */
  starter: z.boolean().optional(),
});

/** Creates a project owned by the developer (full access: owned by no account), with its first API key. */
export async function createOwnedProject(
  ctx: AdminServices,
  principal: Principal,
  input: Pick<CreateProjectInput, 'name' | 'currency' | 'upstreamUrl'>,
) {
  // the project, its first key and their audit entries: one transaction
  const created = await createProject(
    ctx.db,
    ctx.sealer,
    {
      name: input.name,
      currency: input.currency ?? 'usd',
      ...(input.upstreamUrl ? { upstreamUrl: input.upstreamUrl } : {}),
      ...(principal.developerId ? { ownerUserId: principal.developerId } : {}),
    },
    { actor: actorOf(principal) },
  );
  return {
    project: projectView(created.project),
    apiKey: { id: created.apiKeyId, key: created.apiKey, prefix: created.apiKey.slice(0, 11) },
  };
}

export async function updateOwnedProject(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  input: Pick<UpdateProjectInput, 'name' | 'settings'>,
): Promise<ProjectView> {
  const before = await ownedProject(ctx, principal, projectId);
  const project = await ctx.db.transaction().execute(async (tx) => {
    const updated = await updateProject(tx, ctx.sealer, projectId, input);
    await recordAudit(tx, {
      actor: actorOf(principal),
      projectId,
      action: 'project.update',
      targetType: 'project',
      targetId: projectId,
      before: projectAudit(before),
      after: projectAudit(updated),
    });
    return updated;
  });
  await ctx.projects.changed(projectId);
  return projectView(project);
}

// ---- the provider connection ----

export const providerBody = z.strictObject({
  baseUrl: z
    .string()
    .trim()
    .refine((v) => v === ECHO_UPSTREAM || (/^https?:\/\/[^\s]+$/.test(v) && URL.canParse(v)), {
      message: 'must be the http(s) base URL of an OpenAI-compatible API, e.g. https://api.openai.com/v1',
    })
    .superRefine((v, ctx) => {
      const problem = v === ECHO_UPSTREAM ? undefined : baseUrlProblem(v);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }),
  apiKey: z.string().trim().min(1, { message: 'must not be empty' }).max(1000).optional(),
  /** The API it speaks: `openai-compatible` (default) or `anthropic` (Anthropic's Messages API). */
  kind: z.enum(PROVIDER_KINDS, { message: "must be 'openai-compatible' or 'anthropic'" }).optional(),
});
export type ProviderInput = z.infer<typeof providerBody>;

/** The most of a provider's `/models` answer the check reads. */
const CHECK_READ_LIMIT = 1024 * 1024;

/**
 * Checks a provider with a live `GET {baseUrl}/models` using the key. The base URL's host must be a
 * public address unless TOLLGATE_ALLOW_PRIVATE_PROVIDERS is set (../net/destination.ts, checked again
 * on the connection itself), and a provider that cannot be reached gets one fixed message whatever the
 * cause, so the check cannot be used to scan ports. A refusal or an unexpected answer is a 400 that says
 * what the provider answered. Returns the model ids it lists.
 */
export async function checkProvider(ctx: AdminServices, input: ProviderInput): Promise<{ models: string[] }> {
  if (input.baseUrl === ECHO_UPSTREAM) return { models: [] };
  const anthropic = input.kind === 'anthropic';
  const base = input.baseUrl.replace(/\/+$/, '');
  // Anthropic's API lists its models at {baseUrl}/v1/models, with the key in x-api-key.
  const url = anthropic ? `${/\/v1$/.test(base) ? base : `${base}/v1`}/models` : `${base}/models`;
  const auth = !input.apiKey
    ? {}
    : anthropic
      ? { 'x-api-key': input.apiKey, 'anthropic-version': ANTHROPIC_VERSION }
      : { authorization: `Bearer ${input.apiKey}` };
  const allowPrivate = ctx.config.TOLLGATE_ALLOW_PRIVATE_PROVIDERS;
  try {
    await checkDestination(new URL(url), allowPrivate);
  } catch (err) {
    if (err instanceof DestinationError) {
      ctx.log.warn({ host: new URL(url).host, reason: err.message }, 'a provider base URL was refused');
      throw providerCheckFailed(err.publicMessage);
    }
    throw err;
  }
  const timeoutMs = Math.min(ctx.config.UPSTREAM_CONNECT_TIMEOUT_MS * 2, 30_000);
  const agent = createUpstreamAgent({ connectMs: timeoutMs, responseMs: timeoutMs, allowPrivate });
  let status: number;
  let text = '';
  try {
    const res = await request(url, {
      dispatcher: agent,
      headers: { accept: 'application/json', ...auth },
      signal: AbortSignal.timeout(timeoutMs),
    });
    status = res.statusCode;
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body) {
      chunks.push(chunk as Buffer);
      size += (chunk as Buffer).length;
      if (size > CHECK_READ_LIMIT) {
        res.body.destroy();
        break;
      }
    }
    text = Buffer.concat(chunks).toString('utf8');
  } catch (err) {
    ctx.log.debug({ err, url }, 'provider check could not connect');
    throw providerCheckFailed(`could not connect to ${url}`);
  } finally {
    agent.close().catch(() => {});
  }
  if (status === 401 || status === 403) {
    throw providerCheckFailed(`the provider refused the key (${status} from ${url})`);
  }
  if (status < 200 || status > 299)
    throw providerCheckFailed(`the provider answered ${status} to GET ${url}`);
  let body: { data?: unknown } | null;
  try {
    body = JSON.parse(text) as { data?: unknown } | null;
  } catch {
    body = null;
  }
  // A model list, not any JSON: `{"object":"list","data":[{"id":…},…]}`.
  if (!body || typeof body !== 'object' || !Array.isArray(body.data))
    throw providerCheckFailed(
      `GET ${url} did not answer a model list: is this the API's base URL (ending in /v1)?`,
    );
  return {
    models: (body.data as Array<{ id?: unknown } | null>)
      .map((m) => (m && typeof m === 'object' ? String(m.id ?? '') : ''))
      .filter(Boolean),
  };
}

const providerCheckFailed = (why: string) =>
  new ApiError(400, 'invalid_request_error', `Provider check failed: ${why}.`, {
    param: 'baseUrl',
    code: 'provider_check_failed',
  });

/**
 * Stores a project's provider connection (the key sealed at rest). The one place the admin code writes
 * the connection: when projects get several providers, this becomes an upsert of the `default` one.
 */
async function saveProviderConnection(
  ctx: AdminServices,
  principal: Principal,
  before: Project,
  input: ProviderInput,
) {
  const projectId = before.id;
  const project = await ctx.db.transaction().execute(async (tx) => {
    const updated = await updateProject(tx, ctx.sealer, projectId, {
      upstreamUrl: input.baseUrl,
      upstreamKey: input.apiKey ?? null,
    });
    // The kind lives on the provider `default` (the URL and key were mirrored there just now).
    await upsertProvider(tx, ctx.sealer, projectId, {
      name: DEFAULT_PROVIDER,
      baseUrl: input.baseUrl,
      kind: input.kind ?? 'openai-compatible',
    });
    await recordAudit(tx, {
      actor: actorOf(principal),
      projectId,
      action: 'provider.connect',
      targetType: 'provider',
      targetId: DEFAULT_PROVIDER,
      before: projectView(before).provider,
      after: { ...projectView(updated).provider, kind: input.kind ?? 'openai-compatible' },
    });
    return updated;
  });
  await ctx.projects.changed(projectId);
  return project;
}

/** Checks the provider live, then saves the connection. */
export async function connectProvider(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  input: ProviderInput,
) {
  const before = await ownedProject(ctx, principal, projectId);
  // A declared provider is refused before it is called (409 naming its resource).
  await assertConnectionWritable(ctx.db, before, undefined);
  const { models } = await checkProvider(ctx, input);
  const project = await saveProviderConnection(ctx, principal, before, input);
  return {
    object: 'provider' as const,
    ...projectView(project).provider,
    kind: input.kind ?? 'openai-compatible',
    models,
  };
}

// ---- API keys ----

/** Creates an API key of the project with its audit entry, in one transaction. */
export async function createAuditedKey(db: Database, actor: Actor, projectId: string, name: string) {
  return db.transaction().execute(async (tx) => {
    const key = await createKey(tx, projectId, name);
    await recordAudit(tx, {
      actor,
      projectId,
      action: 'api_key.create',
      targetType: 'api_key',
      targetId: key.id,
      after: { name, prefix: key.prefix },
    });
    return key;
  });
}

export async function createApiKey(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  name: string,
) {
  await ownedProject(ctx, principal, projectId);
  const created = await createAuditedKey(ctx.db, actorOf(principal), projectId, name);
  return { id: created.id, object: 'api_key' as const, name, prefix: created.prefix, key: created.key };
}

export async function listApiKeys(ctx: AdminServices, principal: Principal, projectId: string) {
  await ownedProject(ctx, principal, projectId);
  const keys = await listKeys(ctx.db, projectId);
  return list(
    keys.map((k) => ({
      id: k.id,
      object: 'api_key' as const,
      name: k.name,
      prefix: k.prefix,
      createdAt: k.created_at.toISOString(),
      revokedAt: k.revoked_at?.toISOString() ?? null,
    })),
    false,
  );
}

/**
 * Revokes a key — of the project when one is named (404 when the key is not one of its keys) — with its
 * audit entry once per revocation; every proxy drops it from its cache (the key directory's bus message).
 */
export async function revokeAuditedKey(
  ctx: Pick<AdminServices, 'db' | 'keys'>,
  actor: Actor,
  keyId: string,
  projectId?: string,
) {
  let query = ctx.db.selectFrom('api_keys').select(['name', 'prefix', 'revoked_at']).where('id', '=', keyId);
  if (projectId !== undefined) query = query.where('project_id', '=', projectId);
  const key = await query.executeTakeFirst();
  if (!key && projectId !== undefined)
    throw notFound(`No API key ${keyId} in this project.`, 'key_not_found', 'id');
  const revoked = await ctx.keys.revoke(keyId);
  // The key directory revokes (and tells every proxy) on its own; the entry follows, once per revocation.
  if (key && !key.revoked_at)
    await recordAudit(ctx.db, {
      actor,
      projectId: revoked.projectId,
      action: 'api_key.revoke',
      targetType: 'api_key',
      targetId: keyId,
      before: { name: key.name, prefix: key.prefix, revoked: false },
      after: { name: key.name, prefix: key.prefix, revoked: true },
    });
  return revoked;
}

/** Revokes a key of the project (`DELETE …/keys/{id}`, the dashboard's revoke button). */
export async function revokeApiKey(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  keyId: string,
) {
  await ownedProject(ctx, principal, projectId);
  const { propagated } = await revokeAuditedKey(ctx, actorOf(principal), keyId, projectId);
  return { id: keyId, object: 'api_key' as const, revoked: true, propagated };
}

// ---- models and pricing ----

/**
 * The project's whole pricing document — currency, every model with its routes, and the limits — in the
 * shape `PUT …/models` (and `tollgate models apply`) takes, so applying a listing as read changes
 * nothing.
 */
export async function listModels(ctx: AdminServices, principal: Principal, projectId: string) {
  const project = await ownedProject(ctx, principal, projectId);
  const rows = await listProjectModels(ctx.db, projectId);
  return {
    object: 'pricing' as const,
    currency: project.currency,
    models: rows.map(listedModel),
    ...(project.limits ? { limits: project.limits } : {}),
  };
}

/** The model rows of a project, by id. */
export function listProjectModels(db: Database, projectId: string) {
  return db.selectFrom('models').selectAll().where('project_id', '=', projectId).orderBy('id').execute();
}

/** Makes the project's models exactly those of the pricing file (as `tollgate models apply`). */
export async function applyModels(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  file: PricingFile,
) {
  const project = await ownedProject(ctx, principal, projectId);
  const result = await applyPricing(ctx.db, projectId, file, {
    audit: pricingAudit(actorOf(principal), project, 'pricing.apply', null),
  });
  await ctx.projects.changed(projectId);
  return { object: 'pricing.applied' as const, ...result };
}

/**
 * Adds one model or edits it, keeping everything the edit does not name: the other models, the
 * project's limits, and of the model itself the fields left out (its routes, endpoints and provider
 * model stay as they were). The admin API's `PUT …/models/{id}` and the dashboard's price form. Read and
 * write are one transaction (`editPricing`), so concurrent edits of different models both stay.
 */
export async function putModel(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  spec: Partial<ModelSpec> & Pick<ModelSpec, 'id' | 'pricing'>,
) {
  const project = await ownedProject(ctx, principal, projectId);
  const defined = Object.fromEntries(Object.entries(spec).filter(([, v]) => v !== undefined));
  const result = await editPricing(
    ctx.db,
    projectId,
    (current) => {
      const existing = current.models.find((m) => m.id === spec.id);
      const merged = { ...existing, ...defined } as ModelSpec;
      return current.models.filter((m) => m.id !== spec.id).concat(merged);
    },
    { audit: pricingAudit(actorOf(principal), project, 'model.put', spec.id) },
  );
  await ctx.projects.changed(projectId);
  return { object: 'pricing.applied' as const, ...result };
}

/** Removes one model, keeping the others (with their routes) and the project's limits. */
export async function deleteModel(
  ctx: AdminServices,
  principal: Principal,
  projectId: string,
  modelId: string,
) {
  const project = await ownedProject(ctx, principal, projectId);
  const result = await editPricing(
    ctx.db,
    projectId,
    (current) => {
      if (!current.models.some((m) => m.id === modelId))
        throw notFound(`No model ${modelId}.`, 'model_not_found', 'id');
      return current.models.filter((m) => m.id !== modelId);
    },
    { audit: pricingAudit(actorOf(principal), project, 'model.delete', modelId) },
  );
  await ctx.projects.changed(projectId);
  return { object: 'pricing.applied' as const, ...result };
}

/**
 * The audit of a pricing change, in its transaction: one entry for the models (the whole pricing for
 * `pricing.apply`, the one model for `model.put` and `model.delete`) when they changed, and one
 * `limits.update` when the limits changed.
 */
export function pricingAudit(
  actor: Actor,
  project: Pick<Project, 'id' | 'currency'>,
  action: string,
  modelId: string | null,
) {
  return async (tx: Transaction<DB>, result: ApplyResult, before: PricingFile) => {
    const limitsRow = await tx
      .selectFrom('projects')
      .select('limits')
      .where('id', '=', project.id)
      .executeTakeFirstOrThrow();
    const after = await readPricing(tx, project.id, { currency: project.currency, limits: limitsRow.limits });
    const pick = (file: PricingFile) =>
      modelId === null ? file.models : (file.models.find((m) => m.id === modelId) ?? null);
    const changed = result.created.length + result.updated.length + result.deleted.length > 0;
    if (changed || modelId !== null)
      await recordAudit(tx, {
        actor,
        projectId: project.id,
        action,
        targetType: modelId === null ? 'pricing' : 'model',
        targetId: modelId,
        before: pick(before),
        after: pick(after),
      });
    if (JSON.stringify(before.limits ?? null) !== JSON.stringify(after.limits ?? null))
      await recordAudit(tx, {
        actor,
        projectId: project.id,
        action: 'limits.update',
        targetType: 'limits',
        targetId: null,
        before: before.limits ?? null,
        after: after.limits ?? null,
      });
  };
}

export function requireOwner(principal: Principal): string {
  if (!principal.developerId)
    throw badRequest(
      'This needs a developer account (a session or a developer’s admin token).',
      null,
      'developer_required',
    );
  return principal.developerId;
}
