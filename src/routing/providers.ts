import { z } from 'zod';
import { type Actor, recordAudit } from '../audit/index.ts';
import type { Sealer } from '../core/crypto.ts';
import { notFound } from '../core/errors.ts';
import { parseInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { ProviderKind } from '../db/schema.ts';
import { assertProviderWritable, DEFAULT_PROVIDER, upstreamUrlSchema } from '../projects/service.ts';

/**
 * A project's named model providers (base URL, kind — `openai-compatible` or `anthropic` —, key sealed
 * at rest, own time-outs).
 * The project's single upstream of earlier versions is its provider `default`. This module is the one
 * place that writes them: the CLI (`tollgate providers …`), `project create/set` and the admin API call
 * it, then `ctx.projects.changed(projectId)` so every pod reloads the project.
 */
export const providerNameSchema = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, { message: 'may hold letters, digits and . _ - (64 at most)' });

export const PROVIDER_KINDS = ['openai-compatible', 'anthropic'] as const satisfies readonly ProviderKind[];

export const providerInputSchema = z.strictObject({
  name: providerNameSchema,
  baseUrl: upstreamUrlSchema,
  /** The API it speaks; `openai-compatible` when not given (a change of base URL keeps the kind). */
  kind: z.enum(PROVIDER_KINDS, { message: "must be 'openai-compatible' or 'anthropic'" }).optional(),
  /** The provider's API key; `undefined` keeps the stored one, `null` removes it. */
  key: z.string().min(1).nullable().optional(),
  timeouts: z
    .strictObject({
      connectMs: z.number().int().min(100).max(600_000).optional(),
      responseMs: z.number().int().min(100).max(3_600_000).optional(),
    })
    .optional(),
});
export type ProviderInput = z.input<typeof providerInputSchema>;

/** A provider as shown to admins: never the key, only whether one is set. */
export interface ProviderView {
  name: string;
  baseUrl: string;
  kind: ProviderKind;
  keySet: boolean;
  timeouts: { connectMs: number | undefined; responseMs: number | undefined };
  updatedAt: Date;
}

/** Creates or replaces a provider of a project (the key is sealed at rest). */
export async function upsertProvider(
  db: Database,
  sealer: Sealer,
  projectId: string,
  input: ProviderInput,
  opts: { managedBy?: string; actor?: Actor } = {},
): Promise<ProviderView> {
  const parsed = parseInput(providerInputSchema, input, 'provider');
  await assertProviderWritable(db, projectId, parsed.name, opts.managedBy);
  const before = opts.actor
    ? await db
        .selectFrom('providers')
        .selectAll()
        .where('project_id', '=', projectId)
        .where('name', '=', parsed.name)
        .executeTakeFirst()
    : undefined;
  const project = await db
    .selectFrom('projects')
    .select(['id', 'upstream_key_sealed'])
    .where('id', '=', projectId)
    .executeTakeFirst();
  if (!project) throw notFound(`No project ${projectId}.`, 'project_not_found');
  const baseUrl = parsed.baseUrl.replace(/\/+$/, '');
  const keyColumn =
    parsed.key === undefined ? {} : { key_sealed: parsed.key === null ? null : sealer.seal(parsed.key) };
  const kindColumn = parsed.kind === undefined ? {} : { kind: parsed.kind };
  const timeouts = {
    connect_timeout_ms: parsed.timeouts?.connectMs ?? null,
    response_timeout_ms: parsed.timeouts?.responseMs ?? null,
  };
  const row = await db
    .insertInto('providers')
    .values({
      project_id: projectId,
      name: parsed.name,
      base_url: baseUrl,
      // A new `default` without a key keeps the project's upstream key.
      key_sealed: parsed.name === DEFAULT_PROVIDER ? project.upstream_key_sealed : null,
      ...keyColumn,
      ...kindColumn,
      ...timeouts,
      managed_by: opts.managedBy ?? null,
    })
    .onConflict((oc) =>
      oc.columns(['project_id', 'name']).doUpdateSet({
        base_url: baseUrl,
        ...keyColumn,
        ...kindColumn,
        ...timeouts,
        ...(opts.managedBy ? { managed_by: opts.managedBy } : {}),
        updated_at: new Date(),
      }),
    )
    .returningAll()
    .executeTakeFirstOrThrow();
  if (parsed.name === DEFAULT_PROVIDER) {
    // Mirrored for readers of the pre-routing columns (`project show`, the key check at start-up).
    await db
      .updateTable('projects')
      .set({
        upstream_base_url: baseUrl,
        ...(parsed.key !== undefined ? { upstream_key_sealed: row.key_sealed } : {}),
      })
      .where('id', '=', projectId)
      .execute();
  }
  if (opts.actor) {
    const was = before ? auditedView(before) : null;
    const is = auditedView(row);
    // A resource reconciled again with nothing changed is not a change; a key given always is one.
    if (parsed.key !== undefined || JSON.stringify(was) !== JSON.stringify(is))
      await recordAudit(db, {
        actor: opts.actor,
        projectId,
        action: before ? 'provider.update' : 'provider.create',
        targetType: 'provider',
        targetId: parsed.name,
        before: was,
        after: { ...is, keyChanged: parsed.key !== undefined },
      });
  }
  return view(row);
}

/** A provider as the audit log keeps it: no key (only whether one is set), no timestamps. */
function auditedView(row: Parameters<typeof view>[0]) {
  const { updatedAt: _updated, ...rest } = view(row);
  return rest;
}

export async function listProviders(db: Database, projectId: string): Promise<ProviderView[]> {
  const rows = await db
    .selectFrom('providers')
    .selectAll()
    .where('project_id', '=', projectId)
    .orderBy('name')
    .execute();
  return rows.map(view);
}

/** Removes a provider; returns false when there was none of that name. */
export async function removeProvider(
  db: Database,
  projectId: string,
  name: string,
  opts: { managedBy?: string; actor?: Actor } = {},
): Promise<boolean> {
  await assertProviderWritable(db, projectId, name, opts.managedBy);
  const deleted = await db
    .deleteFrom('providers')
    .where('project_id', '=', projectId)
    .where('name', '=', name)
    .returningAll()
    .executeTakeFirst();
  if (name === DEFAULT_PROVIDER) {
    await db
      .updateTable('projects')
      .set({ upstream_base_url: null, upstream_key_sealed: null })
      .where('id', '=', projectId)
      .execute();
  }
  if (deleted && opts.actor)
    await recordAudit(db, {
      actor: opts.actor,
      projectId,
      action: 'provider.delete',
      targetType: 'provider',
      targetId: name,
      before: auditedView(deleted),
      after: null,
    });
  return deleted !== undefined;
}

function view(row: {
  name: string;
  base_url: string;
  kind: ProviderKind;
  key_sealed: string | null;
  connect_timeout_ms: number | null;
  response_timeout_ms: number | null;
  updated_at: Date;
}): ProviderView {
  return {
    name: row.name,
    baseUrl: row.base_url,
    kind: row.kind,
    keySet: row.key_sealed !== null,
    timeouts: {
      connectMs: row.connect_timeout_ms ?? undefined,
      responseMs: row.response_timeout_ms ?? undefined,
    },
    updatedAt: row.updated_at,
  };
}
