import type { Transaction } from 'kysely';
import { badRequest } from '../core/errors.ts';
import { assertWritable } from '../core/managed.ts';
import { parseInput } from '../core/validation.ts';
import { yaml } from '../core/yaml.ts';
import type { Database } from '../db/index.ts';
import type { DB, ModelRow, ProjectLimits } from '../db/schema.ts';
import { holdMarginOf } from './hold-margin.ts';
import {
  DEFAULT_ENDPOINTS,
  type ModelSpec,
  type Pricing,
  type PricingFile,
  pricingColumns,
  pricingFileSchema,
  specOf,
} from './pricing.ts';

export interface ApplyResult {
  created: string[];
  updated: string[];
  deleted: string[];
}

/** Parses and validates a pricing YAML document; problems become 400s naming the field. */
export function parsePricingFile(text: string): PricingFile {
  const parser = yaml(); // outside the try: a failure to load the library is not the file's fault
  let doc: unknown;
  try {
    doc = parser.parse(text);
  } catch (err) {
    throw badRequest(`pricing file is not valid YAML: ${(err as Error).message.split('\n')[0]}`, 'file');
  }
  return parseInput(pricingFileSchema, doc, 'pricing file');
}

/**
 * Makes the project's models exactly those of the file (declarative, like `kubectl apply --prune`):
 * new ids are created, existing ones updated, ids missing from the file deleted. A price applies to the
 * requests admitted after this transaction commits (and the project directory reloads); a hold in
 * flight settles at the price it was admitted with.
 *
 * The models of a project a PriceList resource manages are written only by it (`managedBy`, which also
 * leaves the limits alone: they are a LimitPolicy's). Limits a LimitPolicy manages are kept when the
 * file has none and refused when it has some.
 */
export async function applyPricing(
  db: Database,
  projectId: string,
  file: PricingFile,
  opts: { managedBy?: string; audit?: PricingAudit } = {},
): Promise<ApplyResult> {
  return db.transaction().execute(async (tx) => {
    const project = await lockProject(tx, projectId);
    assertWritable(`The pricing of ${projectId}`, project.pricing_managed_by, opts.managedBy);
    const before = opts.audit ? await readPricing(tx, projectId, project) : undefined;
    const writeLimits = !opts.managedBy && (file.limits !== undefined || !project.limits_managed_by);
    if (writeLimits) assertWritable(`The limits of ${projectId}`, project.limits_managed_by, undefined);
    if (project.currency !== file.currency) {
      throw badRequest(
        `the file's currency ${file.currency} differs from the project's currency ${project.currency}`,
        'currency',
      );
    }
    const result = await applyIn(tx, projectId, file, writeLimits);
    if (opts.managedBy)
      await tx
        .updateTable('projects')
        .set({ pricing_managed_by: opts.managedBy })
        .where('id', '=', projectId)
        .execute();
    if (opts.audit && before) await opts.audit(tx, result, before);
    return result;
  });
}

/**
 * Called inside a pricing change's transaction, after the change, with what it did and the whole
 * pricing before it (for the audit log, written in the same transaction).
 */
export type PricingAudit = (tx: Transaction<DB>, result: ApplyResult, before: PricingFile) => Promise<void>;

/** The project's whole pricing document (models with their routes, and the limits), read in `tx`. */
export async function readPricing(
  tx: Transaction<DB>,
  projectId: string,
  project: { currency: string; limits: unknown },
): Promise<PricingFile> {
  const rows = await modelRows(tx, projectId);
  return { currency: project.currency, models: rows.map(listedModel), ...limitsOf(project) };
}

/** The project's models, in id order. */
function modelRows(tx: Transaction<DB>, projectId: string): Promise<ModelRow[]> {
  return tx.selectFrom('models').selectAll().where('project_id', '=', projectId).orderBy('id').execute();
}

/** The pricing file's `limits`, when the project has any. */
function limitsOf(project: { limits: unknown }): Pick<PricingFile, 'limits'> {
  return project.limits ? { limits: project.limits as PricingFile['limits'] } : {};
}

/**
 * A model as the admin API and `tollgate models list` show it: per-token pricing carries the hold margin
 * in force (the pricing file's, or the default of the upstream model's tokenizer family).
 */
export function listedModel(row: ModelRow): ModelSpec {
  const spec = specOf(row);
  const pricing = spec.pricing;
  return {
    ...spec,
    pricing: pricing.mode === 'per_token' ? { ...pricing, holdMargin: holdMarginOf(row).margin } : pricing,
  };
}

/** One line of a model listing: id, upstream model, prices and, per token, the hold margin. */
export function modelLine(model: ModelSpec): string {
  return `${model.id}  ${model.upstreamModel ?? model.id}  ${pricingSummary(model.pricing)}  [${(model.endpoints ?? DEFAULT_ENDPOINTS).join(', ')}]`;
}

/**
 * A price in words: `per request`, per million tokens (cached input, and the hold margin after
 * `separator`), or a subscription fee. The CLI listing separates the margin with `, `, the dashboard with `; `.
 */
export function pricingSummary(p: Pricing, separator = ', '): string {
  switch (p.mode) {
    case 'per_request':
      return `${p.perRequest} per request`;
    case 'per_token':
      return `${p.inputPerMillion} in / ${p.outputPerMillion ?? '0'} out per 1M tokens${
        p.cachedInputPerMillion ? ` (${p.cachedInputPerMillion} cached)` : ''
      }${cacheWriteSummary(p)}${p.holdMargin ? `${separator}prompt estimate held × ${p.holdMargin}` : ''}`;
    case 'subscription':
      return `${p.fee} every ${p.period}`;
  }
}

/** The cache write prices a per-token price sets, in words ('' when it sets none). */
function cacheWriteSummary(p: Extract<Pricing, { mode: 'per_token' }>): string {
  const parts = [
    p.cacheWritePerMillion ? `${p.cacheWritePerMillion} cache write` : '',
    p.cacheWrite1hPerMillion ? `${p.cacheWrite1hPerMillion} 1 h cache write` : '',
  ].filter(Boolean);
  return parts.length ? ` (${parts.join(', ')})` : '';
}

/**
 * A partial edit of the pricing (one model's price, a deleted model): `edit` gets the whole current
 * document (every model with its routes, and the limits) and returns the models it should hold; the
 * limits and everything else it does not change stay. Read and write happen in one transaction under
 * the project's row lock, so two edits at once cannot drop each other's change. An edit that leaves no
 * model deletes them all (limits kept). A pricing a PriceList resource manages is not edited here (409).
 */
export async function editPricing(
  db: Database,
  projectId: string,
  edit: (current: PricingFile) => ModelSpec[],
  opts: { audit?: PricingAudit } = {},
): Promise<ApplyResult> {
  return db.transaction().execute(async (tx) => {
    const result = await editIn(tx, projectId, edit);
    if (opts.audit) await opts.audit(tx, result.applied, result.before);
    return result.applied;
  });
}

/** The edit under the project's row lock, in `tx`: what it did, and the pricing before it. */
async function editIn(
  tx: Transaction<DB>,
  projectId: string,
  edit: (current: PricingFile) => ModelSpec[],
): Promise<{ applied: ApplyResult; before: PricingFile }> {
  const project = await lockProject(tx, projectId);
  assertWritable(`The pricing of ${projectId}`, project.pricing_managed_by, undefined);
  const rows = await modelRows(tx, projectId);
  const limits = limitsOf(project);
  const current: PricingFile = { currency: project.currency, models: rows.map(specOf), ...limits };
  const models = edit(current);
  const before = { ...current, models: rows.map(listedModel) };
  if (models.length === 0) {
    await tx.deleteFrom('models').where('project_id', '=', projectId).execute();
    return { applied: { created: [], updated: [], deleted: rows.map((r) => r.id) }, before };
  }
  const file = parseInput(pricingFileSchema, { currency: project.currency, models, ...limits }, 'pricing');
  // the limits come back as they were: written only where nothing else manages them
  return { applied: await applyIn(tx, projectId, file, !project.limits_managed_by), before };
}

/** The project's row, locked until `tx` ends: its currency and limits, and who manages its pricing and limits. */
function lockedProject(tx: Transaction<DB>, projectId: string) {
  return tx
    .selectFrom('projects')
    .select(['currency', 'limits', 'pricing_managed_by', 'limits_managed_by'])
    .where('id', '=', projectId)
    .forUpdate()
    .executeTakeFirst();
}

/** `lockedProject`, 400 when there is no such project. */
async function lockProject(tx: Transaction<DB>, projectId: string) {
  const project = await lockedProject(tx, projectId);
  if (!project) throw badRequest(`no project ${projectId}`, 'project');
  return project;
}

/** Writes the file's models (and its limits when `writeLimits`) and deletes the models it does not name. */
async function applyIn(
  tx: Transaction<DB>,
  projectId: string,
  file: PricingFile,
  writeLimits: boolean,
): Promise<ApplyResult> {
  const existing = new Set(
    (await tx.selectFrom('models').select('id').where('project_id', '=', projectId).execute()).map(
      (r) => r.id,
    ),
  );
  const result: ApplyResult = { created: [], updated: [], deleted: [] };
  for (const model of file.models) {
    const columns = {
      ...pricingColumns(model.pricing),
      upstream_model: model.upstreamModel ?? model.id,
      endpoints: model.endpoints ?? DEFAULT_ENDPOINTS,
      routes: model.routes ? JSON.stringify(model.routes) : null,
      max_output_tokens: model.maxOutputTokens ?? null,
      context_window: model.contextWindow ?? null,
    };
    await tx
      .insertInto('models')
      .values({ project_id: projectId, id: model.id, ...columns })
      .onConflict((oc) =>
        oc.columns(['project_id', 'id']).doUpdateSet({ ...columns, updated_at: new Date() }),
      )
      .execute();
    (existing.has(model.id) ? result.updated : result.created).push(model.id);
    existing.delete(model.id);
  }
  // Limits (src/limits) come with the pricing file; a file without them removes them.
  if (writeLimits)
    await tx
      .updateTable('projects')
      .set({ limits: file.limits ? JSON.stringify(file.limits) : null })
      .where('id', '=', projectId)
      .execute();
  for (const id of existing) {
    await tx.deleteFrom('models').where('project_id', '=', projectId).where('id', '=', id).execute();
    result.deleted.push(id);
  }
  return result;
}

/** Deletes every model of the project (the dashboard's last model; a deleted PriceList). */
export async function deleteAllModels(
  db: Database,
  projectId: string,
  opts: { managedBy?: string } = {},
): Promise<void> {
  await db.transaction().execute(async (tx) => {
    const project = await lockedProject(tx, projectId);
    assertWritable(`The pricing of ${projectId}`, project?.pricing_managed_by, opts.managedBy);
    await tx.deleteFrom('models').where('project_id', '=', projectId).execute();
    if (opts.managedBy)
      await tx
        .updateTable('projects')
        .set({ pricing_managed_by: null })
        .where('id', '=', projectId)
        .execute();
  });
}

/**
 * Sets the project's limits (the same shape as the pricing file's `limits`); `null` removes them. With
 * `managedBy` (a LimitPolicy) the limits become that resource's; `release` hands them back.
 */
export async function setProjectLimits(
  db: Database,
  projectId: string,
  limits: ProjectLimits | null,
  opts: { managedBy?: string; release?: boolean } = {},
): Promise<void> {
  await db.transaction().execute(async (tx) => {
    const project = await lockProject(tx, projectId);
    assertWritable(`The limits of ${projectId}`, project.limits_managed_by, opts.managedBy);
    await tx
      .updateTable('projects')
      .set({
        limits: limits ? JSON.stringify(limits) : null,
        ...(opts.managedBy ? { limits_managed_by: opts.release ? null : opts.managedBy } : {}),
      })
      .where('id', '=', projectId)
      .execute();
  });
}
