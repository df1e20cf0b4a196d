import { z } from 'zod';
import { type Actor, operatorActor, recordAudit } from '../audit/index.ts';
import type { Sealer } from '../core/crypto.ts';
import { notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { assertWritable } from '../core/managed.ts';
import { amountInputSchema, currencySchema, priceSchema } from '../core/money.ts';
import { isPlainText, isStorable, NOT_STORABLE, parseInput, storableText } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { Project, ProjectSettings } from '../db/schema.ts';
import { createKey } from './keys.ts';

const httpUrl = z
  .string()
  .url()
  .refine((v) => /^https?:\/\//.test(v), { message: 'must start with http:// or https://' })
  .refine(isPlainText, { message: 'must not contain control characters' });

/**
 * Why a URL cannot be a provider's base URL although it is http(s): paths are appended to it, so a
 * query or a fragment would swallow them (`…?x=` + `/models` reaches the base path itself), and
 * credentials belong in the API key, not in a URL that is shown back.
 */
export function baseUrlProblem(value: string): string | undefined {
  if (/^[a-z][a-z0-9+.-]*:\/\/[^/?#]*@/i.test(value))
    return 'must not hold a user name or password (give the key as the API key)';
  if (value.includes('?')) return 'must not have a query (?…): paths are appended to the base URL';
  if (value.includes('#')) return 'must not have a fragment (#…): paths are appended to the base URL';
  return undefined;
}

/** An upstream base URL: an OpenAI-compatible provider, or `echo://local` for the built-in echo provider. */
export const upstreamUrlSchema = z
  .string()
  .refine((v) => v === ECHO_UPSTREAM || httpUrl.safeParse(v).success, {
    message: `must be an http(s) URL of an OpenAI-compatible API (e.g. https://api.openai.com/v1) or ${'echo://local'}`,
  })
  .superRefine((v, ctx) => {
    const problem = v === ECHO_UPSTREAM ? undefined : baseUrlProblem(v);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  });

export const ECHO_UPSTREAM = 'echo://local';

/** The provider a project's upstream is (src/routing/providers.ts writes the others). */
export const DEFAULT_PROVIDER = 'default';

export const projectSettingsSchema = z.strictObject({
  connectMessage: z.string().min(1).max(2000).refine(isStorable, { message: NOT_STORABLE }).optional(),
  topupMessage: z.string().min(1).max(2000).refine(isStorable, { message: NOT_STORABLE }).optional(),
  returnUrl: httpUrl.optional(),
  checkoutUrl: httpUrl.optional(),
  maxCompletionTokens: z.number().int().min(1).max(10_000_000).optional(),
  lowBalanceThreshold: amountInputSchema.optional(),
  /** How far below zero a request's worst case may take a wallet (default 0: it must be covered). */
  debtLimit: priceSchema.optional(),
  trial: z
    .strictObject({
      amount: amountInputSchema,
      expiresInDays: z.number().int().min(1).max(3650).optional(),
    })
    .optional(),
}) satisfies z.ZodType<ProjectSettings>;

export const createProjectSchema = z.strictObject({
  name: storableText(200),
  currency: currencySchema.default('usd'),
  ownerUserId: z.string().min(1).max(200).optional(),
  upstreamUrl: upstreamUrlSchema.optional(),
  upstreamKey: z.string().min(1).optional(),
  settings: projectSettingsSchema.default({}),
});
export type CreateProjectInput = z.input<typeof createProjectSchema>;

export interface CreatedProject {
  project: Project;
  apiKey: string;
  apiKeyId: string;
}

/** Creates a project (paywall) with its first API key. The provider key is sealed at rest. */
export async function createProject(
  db: Database,
  sealer: Sealer,
  input: CreateProjectInput,
  opts: { actor?: Actor } = {},
): Promise<CreatedProject> {
  const parsed = parseInput(createProjectSchema, input, 'project');
  return db.transaction().execute(async (tx) => {
    const project = await insertProject(tx, sealer, parsed, null);
    const id = project.id;
    // Routing (src/routing/providers.ts): the upstream is the project's provider `default`.
    if (project.upstream_base_url) {
      await tx
        .insertInto('providers')
        .values({
          project_id: id,
          name: DEFAULT_PROVIDER,
          base_url: project.upstream_base_url,
          key_sealed: project.upstream_key_sealed,
        })
        .execute();
    }
    const key = await createKey(tx, id, 'default');
    if (opts.actor) {
      await recordAudit(tx, {
        actor: opts.actor,
        projectId: id,
        action: 'project.create',
        targetType: 'project',
        targetId: id,
        after: auditedProject(project),
      });
      await recordAudit(tx, {
        actor: opts.actor,
        projectId: id,
        action: 'api_key.create',
        targetType: 'api_key',
        targetId: key.id,
        after: { name: 'default', prefix: key.prefix },
      });
    }
    return { project, apiKey: key.key, apiKeyId: key.id };
  });
}

async function insertProject(
  db: Database,
  sealer: Sealer,
  parsed: z.output<typeof createProjectSchema>,
  managedBy: string | null,
): Promise<Project> {
  return db
    .insertInto('projects')
    .values({
      id: newId('pw'),
      name: parsed.name,
      currency: parsed.currency,
      owner_user_id: parsed.ownerUserId ?? newId('acct'),
      settings: JSON.stringify(parsed.settings),
      upstream_base_url: parsed.upstreamUrl?.replace(/\/+$/, '') ?? null,
      upstream_key_sealed: parsed.upstreamKey ? sealer.seal(parsed.upstreamKey) : null,
      managed_by: managedBy,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
}

/**
 * Creates a project declared by a resource (src/operator/resources): no first API key (its keys are
 * resources too) and no provider (ModelProvider resources); read-only elsewhere (src/core/managed.ts).
 */
export async function createManagedProject(
  db: Database,
  sealer: Sealer,
  input: Pick<CreateProjectInput, 'name' | 'currency' | 'ownerUserId' | 'settings'>,
  managedBy: string,
): Promise<Project> {
  const parsed = parseInput(createProjectSchema, input, 'project');
  return db.transaction().execute(async (tx) => {
    const project = await insertProject(tx, sealer, parsed, managedBy);
    await recordAudit(tx, {
      actor: operatorActor(managedBy),
      projectId: project.id,
      action: 'project.create',
      targetType: 'project',
      targetId: project.id,
      after: auditedProject(project),
    });
    return project;
  });
}

/** A provider a ModelProvider resource manages is written only by it (src/core/managed.ts);
 * src/routing/providers.ts writes the providers, `updateProject` the provider `default`. */
export async function assertProviderWritable(
  db: Database,
  projectId: string,
  name: string,
  writer: string | undefined,
): Promise<void> {
  const row = await db
    .selectFrom('providers')
    .select('managed_by')
    .where('project_id', '=', projectId)
    .where('name', '=', name)
    .executeTakeFirst();
  assertWritable(`The provider ${name} of ${projectId}`, row?.managed_by, writer);
}

/**
 * Refuses a write of the project's provider connection (the provider `default`) with the 409 naming the
 * resource that manages what is written: the provider's ModelProvider first, else the project's Project.
 */
export async function assertConnectionWritable(
  db: Database,
  project: Pick<Project, 'id' | 'managed_by'>,
  writer: string | undefined,
): Promise<void> {
  await assertProviderWritable(db, project.id, DEFAULT_PROVIDER, writer);
  assertWritable(`Project ${project.id}`, project.managed_by, writer);
}

/** A project as the audit log keeps it: name, currency, settings, the provider without its key. */
export function auditedProject(p: Project) {
  return {
    name: p.name,
    currency: p.currency,
    provider: {
      baseUrl: p.upstream_base_url,
      keySet: p.upstream_key_sealed !== null,
      connected: p.upstream_base_url !== null,
    },
    settings: p.settings,
  };
}

/** The project a resource manages, if any. */
export async function findProjectByManager(db: Database, managedBy: string): Promise<Project | undefined> {
  return db.selectFrom('projects').selectAll().where('managed_by', '=', managedBy).executeTakeFirst();
}

/** Hands a project back to hand editing (its resource was deleted; its balances and ledger stay). */
export async function releaseProject(db: Database, id: string, managedBy: string): Promise<void> {
  await db
    .updateTable('projects')
    .set({ managed_by: null, updated_at: new Date() })
    .where('id', '=', id)
    .where('managed_by', '=', managedBy)
    .execute();
}

export async function getProject(db: Database, id: string): Promise<Project> {
  const project = await db.selectFrom('projects').selectAll().where('id', '=', id).executeTakeFirst();
  if (!project) throw notFound(`No project ${id}.`, 'project_not_found');
  return project;
}

export const updateProjectSchema = z.strictObject({
  name: z.string().trim().min(1).max(200).optional(),
  upstreamUrl: upstreamUrlSchema.nullable().optional(),
  upstreamKey: z.string().min(1).nullable().optional(),
  settings: projectSettingsSchema.partial().optional(),
});
export type UpdateProjectInput = z.input<typeof updateProjectSchema>;

/**
 * Updates name, provider and settings (settings are merged key by key; `replaceSettings`, for a resource
 * declaring them all, replaces them). A project a resource manages is written only by that resource.
 */
export async function updateProject(
  db: Database,
  sealer: Sealer,
  id: string,
  input: UpdateProjectInput,
  opts: { managedBy?: string; replaceSettings?: boolean } = {},
): Promise<Project> {
  const parsed = parseInput(updateProjectSchema, input, 'project');
  const current = await getProject(db, id);
  if (parsed.upstreamUrl !== undefined || parsed.upstreamKey !== undefined)
    await assertConnectionWritable(db, current, opts.managedBy);
  else assertWritable(`Project ${id}`, current.managed_by, opts.managedBy);
  const updated = await db
    .updateTable('projects')
    .set({
      ...(parsed.name !== undefined ? { name: parsed.name } : {}),
      ...(parsed.upstreamUrl !== undefined
        ? { upstream_base_url: parsed.upstreamUrl?.replace(/\/+$/, '') ?? null }
        : {}),
      ...(parsed.upstreamKey !== undefined
        ? { upstream_key_sealed: parsed.upstreamKey === null ? null : sealer.seal(parsed.upstreamKey) }
        : {}),
      ...(parsed.settings
        ? {
            settings: JSON.stringify(
              opts.replaceSettings ? parsed.settings : { ...current.settings, ...parsed.settings },
            ),
          }
        : {}),
      ...(opts.managedBy ? { managed_by: opts.managedBy } : {}),
      updated_at: new Date(),
    })
    .where('id', '=', id)
    .returningAll()
    .executeTakeFirstOrThrow();
  // Routing (src/routing/providers.ts): the upstream is the project's provider `default`.
  if (parsed.upstreamUrl !== undefined || parsed.upstreamKey !== undefined) {
    if (!updated.upstream_base_url) {
      await db
        .deleteFrom('providers')
        .where('project_id', '=', id)
        .where('name', '=', DEFAULT_PROVIDER)
        .execute();
    } else {
      const row = { base_url: updated.upstream_base_url, key_sealed: updated.upstream_key_sealed };
      await db
        .insertInto('providers')
        .values({ project_id: id, name: DEFAULT_PROVIDER, ...row })
        .onConflict((oc) =>
          oc.columns(['project_id', 'name']).doUpdateSet({ ...row, updated_at: new Date() }),
        )
        .execute();
    }
  }
  return updated;
}
