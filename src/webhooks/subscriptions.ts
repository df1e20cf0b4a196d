import { randomBytes } from 'node:crypto';
import { sql, type UpdateObject } from 'kysely';
import type { Logger } from 'pino';
import { z } from 'zod';
import { type Actor, CLI_ACTOR, operatorActor, recordAudit } from '../audit/index.ts';
import type { Bus } from '../bus/index.ts';
import type { Config } from '../config/index.ts';
import type { Sealer } from '../core/crypto.ts';
import { ApiError, badRequest, conflict, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { isPlainText, isStorable, NOT_STORABLE, parseInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import type { DB, WebhookSubscriptionsTable } from '../db/schema.ts';
import type { EventFilter } from '../events/outbox.ts';
import { checkDestination, DestinationError } from '../net/destination.ts';
import { SubscriptionFilter, subscriptionsChangedChannel } from './filter.ts';
import { patternProblem } from './patterns.ts';

/**
 * Webhook subscriptions: one service for the REST surface, the CLI and the Kubernetes operator (which
 * owns the rows it made through `managedBy`). Secrets are sealed at rest and returned only on creation.
 */

/** What the service uses of the application context (callers pass the context). */
export interface SubscriptionStore {
  db: Database;
  sealer: Sealer;
  bus: Bus;
  config: Pick<Config, 'WEBHOOK_ALLOW_HTTP' | 'WEBHOOK_ALLOW_PRIVATE_NETWORKS'>;
  /** Where a refused destination's detail goes (developers see one message for every refusal). */
  log?: Logger;
  /** This process's event filter, refreshed at once when a project's subscriptions change. */
  events: { filter: EventFilter };
}

/** Reading subscriptions needs only the database. */
export type SubscriptionReader = Pick<SubscriptionStore, 'db'>;

export const MAX_CUSTOM_HEADERS = 10;
export const MIN_SECRET_LENGTH = 24;
export const DESCRIPTION_MAX = 512;

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
// Visible ASCII, spaces and tabs inside; no control characters (CR/LF would split the header).
const HEADER_VALUE = /^[\x20-\x7e\t]*$/;
const RESERVED_HEADERS = new Set([
  'content-type',
  'content-length',
  'host',
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'expect',
]);

const urlSchema = z
  .string({ error: 'must be a string' })
  .trim()
  .min(1, 'is required')
  .max(2048, 'must be at most 2048 characters')
  .superRefine((value, issue) => {
    if (!isPlainText(value)) {
      issue.addIssue({ code: 'custom', message: 'must not contain control characters' });
      return;
    }
    let parsed: URL;
    try {
      parsed = new URL(value);
    } catch {
      issue.addIssue({ code: 'custom', message: 'must be an absolute https:// URL' });
      return;
    }
    if (parsed.protocol !== 'https:' && parsed.protocol !== 'http:')
      issue.addIssue({ code: 'custom', message: 'must be an https:// URL' });
    else if (parsed.username || parsed.password)
      issue.addIssue({ code: 'custom', message: 'must not carry credentials; use customHeaders instead' });
  });

const eventsSchema = z
  .array(z.string({ error: 'must be a string' }), { error: 'must be an array of event names or patterns' })
  .superRefine((events, issue) => {
    const problem = patternProblem(events);
    if (problem)
      issue.addIssue({
        code: 'custom',
        message: problem.message,
        ...(problem.index >= 0 ? { path: [problem.index] } : {}),
      });
  });

const customHeadersSchema = z
  .record(z.string(), z.string({ error: 'must be a string' }), { error: 'must be an object of strings' })
  .superRefine((headers, issue) => {
    const names = Object.keys(headers);
    if (names.length > MAX_CUSTOM_HEADERS) {
      issue.addIssue({ code: 'custom', message: `must have at most ${MAX_CUSTOM_HEADERS} entries` });
      return;
    }
    const seen = new Set<string>();
    for (const name of names) {
      const lower = name.toLowerCase();
      const value = headers[name]!;
      let message: string | undefined;
      if (!HEADER_NAME.test(name)) message = 'is not a valid header name';
      else if (lower.startsWith('x-service-') || RESERVED_HEADERS.has(lower))
        message = 'is set by Tollgate and cannot be overridden';
      else if (seen.has(lower)) message = 'is given twice (header names are case-insensitive)';
      else if (!HEADER_VALUE.test(value)) message = 'has a value with control or non-ASCII characters';
      else if (value.length > 4096) message = 'has a value longer than 4096 characters';
      seen.add(lower);
      if (message) {
        issue.addIssue({ code: 'custom', message, path: [name] });
        return;
      }
    }
  });

const secretSchema = z
  .string({ error: 'must be a string' })
  .min(MIN_SECRET_LENGTH, `must be at least ${MIN_SECRET_LENGTH} characters`)
  .max(256, 'must be at most 256 characters')
  .regex(/^[\x21-\x7e]+$/, 'must be visible ASCII characters without spaces');

export const subscriptionInputSchema = z.strictObject({
  url: urlSchema,
  events: eventsSchema,
  description: z
    .string({ error: 'must be a string' })
    .refine(isStorable, NOT_STORABLE)
    .nullish()
    .transform((d) => (d == null ? null : d.trim().slice(0, DESCRIPTION_MAX) || null)),
  customHeaders: customHeadersSchema.nullish().transform((h) => h ?? {}),
  secret: secretSchema.nullish(),
});

export type SubscriptionInput = z.input<typeof subscriptionInputSchema>;

const updateInputSchema = subscriptionInputSchema.extend({
  isActive: z.boolean({ error: 'must be a boolean' }).optional(),
});

export interface SubscriptionView {
  id: string;
  paywallId: string;
  url: string;
  events: string[];
  isActive: boolean;
  description: string | null;
  customHeaders: Record<string, string>;
  createdAt: string;
  updatedAt: string;
  secretSuffix: string;
  createdBy: string;
  consecutiveFailures: number;
  lastDeliveredAt: string | null;
  managedBy: string | null;
  /** Set when endpoint health disabled the subscription (failing for WEBHOOK_DISABLE_AFTER_HOURS). */
  disabledReason: string | null;
  disabledAt: string | null;
}

type Row = {
  [K in keyof WebhookSubscriptionsTable]: WebhookSubscriptionsTable[K] extends { __select__: infer S }
    ? S
    : WebhookSubscriptionsTable[K];
};

const iso = (d: Date | string) => (d instanceof Date ? d : new Date(d)).toISOString();

export function toView(row: Row): SubscriptionView {
  return {
    id: row.id,
    paywallId: row.project_id,
    url: row.url,
    events: row.events as string[],
    isActive: row.is_active as boolean,
    description: row.description,
    customHeaders: row.custom_headers as Record<string, string>,
    createdAt: iso(row.created_at as Date),
    updatedAt: iso(row.updated_at as Date),
    secretSuffix: row.secret_suffix,
    createdBy: row.created_by,
    consecutiveFailures: row.consecutive_failures as number,
    lastDeliveredAt: row.last_delivered_at ? iso(row.last_delivered_at as Date) : null,
    managedBy: row.managed_by,
    disabledReason: row.disabled_reason ?? null,
    disabledAt: row.disabled_at ? iso(row.disabled_at as Date) : null,
  };
}

/** Column values that put a subscription's endpoint health back to new: re-enabling clears the reason. */
const healthReset = {
  consecutive_failures: 0,
  failing_since: null,
  disabled_at: null,
  disabled_reason: null,
} as const;

export function generateSecret(): string {
  return `whsec_${randomBytes(32).toString('base64url')}`;
}

const suffixOf = (secret: string) => secret.slice(-4);

/** Checks the scheme and destination of a URL already shaped by the schema; 400 on `url`. */
async function checkUrl(ctx: Pick<SubscriptionStore, 'config' | 'log'>, raw: string): Promise<void> {
  const url = new URL(raw);
  if (url.protocol === 'http:' && !ctx.config.WEBHOOK_ALLOW_HTTP)
    throw badRequest(
      "Invalid 'url': must be an https:// URL (plain HTTP is not allowed).",
      'url',
      'invalid_url',
    );
  try {
    await checkDestination(url, ctx.config.WEBHOOK_ALLOW_PRIVATE_NETWORKS);
  } catch (err) {
    if (err instanceof DestinationError) {
      ctx.log?.warn({ host: url.host, reason: err.message }, 'a webhook URL was refused');
      throw badRequest(`Invalid 'url': ${err.publicMessage}.`, 'url', 'invalid_url');
    }
    throw err;
  }
}

/** Makes every process refresh its event filter for the project. */
export async function subscriptionsChanged(
  ctx: Pick<SubscriptionStore, 'bus' | 'events'>,
  projectId: string,
): Promise<void> {
  const filter = ctx.events.filter;
  if (filter instanceof SubscriptionFilter) await filter.refresh(projectId).catch(() => {});
  await ctx.bus.publish(subscriptionsChangedChannel, projectId).catch(() => {});
}

function managedConflict(managedBy: string): ApiError {
  return new ApiError(
    409,
    'conflict_error',
    `This subscription is managed by ${managedBy}; change or delete that resource instead.`,
    { code: 'managed_by_resource' },
  );
}

function assertManager(row: { managed_by: string | null }, managedBy: string | undefined) {
  if ((row.managed_by ?? undefined) !== managedBy) {
    if (row.managed_by) throw managedConflict(row.managed_by);
    throw conflict(
      'This subscription was made through the API and is not managed by a resource.',
      'not_managed_by_resource',
    );
  }
}

/** Who changes a subscription: the caller's actor; else its resource (the operator); else the CLI. */
function auditActor(opts: { managedBy?: string | undefined; actor?: Actor | undefined }): Actor {
  return opts.actor ?? (opts.managedBy ? operatorActor(opts.managedBy) : CLI_ACTOR);
}

/**
 * Refuses what createSubscription would refuse (shape, scheme, destination, headers) without writing
 * anything: the operator checks a spec before it generates a Secret for it.
 */
export async function validateSubscriptionInput(
  ctx: Pick<SubscriptionStore, 'config'>,
  input: SubscriptionInput,
): Promise<void> {
  const parsed = parseInput(subscriptionInputSchema, input);
  await checkUrl(ctx, parsed.url);
}

export async function createSubscription(
  ctx: SubscriptionStore,
  projectId: string,
  input: SubscriptionInput,
  opts: { createdBy: string; managedBy?: string; actor?: Actor },
): Promise<{ subscription: SubscriptionView; secret: string }> {
  const parsed = parseInput(subscriptionInputSchema, input);
  await checkUrl(ctx, parsed.url);
  const secret = parsed.secret ?? generateSecret();
  let row: Row;
  try {
    row = await ctx.db.transaction().execute(async (tx) => {
      const created = (await tx
        .insertInto('webhook_subscriptions')
        .values({
          id: newId('whsub'),
          project_id: projectId,
          url: parsed.url,
          events: JSON.stringify(parsed.events),
          description: parsed.description,
          custom_headers: JSON.stringify(parsed.customHeaders),
          secret_sealed: ctx.sealer.seal(secret),
          secret_suffix: suffixOf(secret),
          is_active: true,
          created_by: opts.createdBy,
          managed_by: opts.managedBy ?? null,
        })
        .returningAll()
        .executeTakeFirstOrThrow()) as Row;
      await recordAudit(tx, {
        actor: auditActor(opts),
        projectId,
        action: 'webhook_subscription.create',
        targetType: 'webhook_subscription',
        targetId: created.id,
        after: toView(created),
      });
      return created;
    });
  } catch (err) {
    if ((err as { code?: string }).code === '23505' && opts.managedBy)
      throw conflict(`A subscription managed by ${opts.managedBy} already exists.`, 'already_managed');
    throw err;
  }
  await subscriptionsChanged(ctx, projectId);
  return { subscription: toView(row), secret };
}

async function findRow(ctx: SubscriptionReader, projectId: string, id: string): Promise<Row> {
  const row = await ctx.db
    .selectFrom('webhook_subscriptions')
    .selectAll()
    .where('id', '=', id)
    .where('project_id', '=', projectId)
    .executeTakeFirst();
  if (!row) throw notFound(`No webhook subscription with id '${id}'.`, 'subscription_not_found', 'id');
  return row as Row;
}

export async function getSubscription(
  ctx: SubscriptionReader,
  projectId: string,
  id: string,
): Promise<SubscriptionView> {
  return toView(await findRow(ctx, projectId, id));
}

export async function updateSubscription(
  ctx: SubscriptionStore,
  projectId: string,
  id: string,
  input: SubscriptionInput & { isActive?: boolean },
  opts: { managedBy?: string; actor?: Actor },
): Promise<SubscriptionView> {
  const parsed = parseInput(updateInputSchema, input);
  const current = await findRow(ctx, projectId, id);
  assertManager(current, opts.managedBy);
  await checkUrl(ctx, parsed.url);
  return writeChange(
    ctx,
    current,
    {
      url: parsed.url,
      events: JSON.stringify(parsed.events),
      description: parsed.description,
      custom_headers: JSON.stringify(parsed.customHeaders),
      ...(parsed.secret
        ? { secret_sealed: ctx.sealer.seal(parsed.secret), secret_suffix: suffixOf(parsed.secret) }
        : {}),
      ...(parsed.isActive !== undefined ? { is_active: parsed.isActive } : {}),
      ...(parsed.isActive === true && !current.is_active ? healthReset : {}),
    },
    {
      actor: auditActor(opts),
      action: 'webhook_subscription.update',
      before: toView(current),
      after: (updated) => ({ ...toView(updated), secretChanged: parsed.secret !== undefined }),
    },
  );
}

export async function setSubscriptionActive(
  ctx: SubscriptionStore,
  projectId: string,
  id: string,
  active: boolean,
  opts: { managedBy?: string; actor?: Actor } = {},
): Promise<SubscriptionView> {
  const current = await findRow(ctx, projectId, id);
  assertManager(current, opts.managedBy);
  if (current.is_active === active) return toView(current);
  return writeChange(
    ctx,
    current,
    { is_active: active, ...(active ? healthReset : { disabled_at: null, disabled_reason: null }) },
    {
      actor: auditActor(opts),
      action: active ? 'webhook_subscription.enable' : 'webhook_subscription.disable',
      before: { isActive: current.is_active },
      after: (updated) => ({ isActive: updated.is_active }),
    },
  );
}

/**
 * Hands a subscription back from its resource (deleted, or following its re-created Project elsewhere):
 * inactive, and no longer managed, so the REST API may edit or delete it.
 */
export async function releaseSubscription(
  ctx: SubscriptionStore,
  projectId: string,
  id: string,
  managedBy: string,
): Promise<SubscriptionView> {
  const current = await findRow(ctx, projectId, id);
  assertManager(current, managedBy);
  return writeChange(
    ctx,
    current,
    { is_active: false, managed_by: null, disabled_at: null, disabled_reason: null },
    {
      actor: auditActor({ managedBy }),
      action: 'webhook_subscription.release',
      before: { isActive: current.is_active, managedBy },
      after: (updated) => ({ isActive: updated.is_active, managedBy: null }),
    },
  );
}

/**
 * Writes a change of one subscription and its audit entry in one transaction, then makes every process
 * refresh its event filter.
 */
async function writeChange(
  ctx: SubscriptionStore,
  current: Row,
  set: UpdateObject<DB, 'webhook_subscriptions'>,
  audit: { actor: Actor; action: string; before: unknown; after: (updated: Row) => unknown },
): Promise<SubscriptionView> {
  const projectId = current.project_id;
  const row = await ctx.db.transaction().execute(async (tx) => {
    const updated = (await tx
      .updateTable('webhook_subscriptions')
      .set({ ...set, updated_at: sql`now()` })
      .where('id', '=', current.id)
      .where('project_id', '=', projectId)
      .returningAll()
      .executeTakeFirstOrThrow()) as Row;
    await recordAudit(tx, {
      actor: audit.actor,
      projectId,
      action: audit.action,
      targetType: 'webhook_subscription',
      targetId: current.id,
      before: audit.before,
      after: audit.after(updated),
    });
    return updated;
  });
  await subscriptionsChanged(ctx, projectId);
  return toView(row);
}

/** The project of a subscription, for commands that only know its id (the CLI). */
export async function projectOfSubscription(ctx: SubscriptionReader, id: string): Promise<string> {
  const row = await ctx.db
    .selectFrom('webhook_subscriptions')
    .select('project_id')
    .where('id', '=', id)
    .executeTakeFirst();
  if (!row) throw notFound(`No webhook subscription with id '${id}'.`, 'subscription_not_found', 'id');
  return row.project_id;
}

export async function findSubscriptionByManager(
  ctx: SubscriptionReader,
  managedBy: string,
): Promise<SubscriptionView | undefined> {
  const row = await ctx.db
    .selectFrom('webhook_subscriptions')
    .selectAll()
    .where('managed_by', '=', managedBy)
    .executeTakeFirst();
  return row ? toView(row as Row) : undefined;
}

export interface ListOptions {
  status?: 'active' | 'inactive' | undefined;
  limit: number;
  startingAfter?: string | undefined;
}

/** Newest first; `startingAfter` is the id of the last item of the previous page. */
export async function listSubscriptions(
  ctx: SubscriptionReader,
  projectId: string,
  options: ListOptions,
): Promise<{ data: SubscriptionView[]; hasMore: boolean }> {
  let query = ctx.db
    .selectFrom('webhook_subscriptions')
    .selectAll()
    .where('project_id', '=', projectId)
    .orderBy('id', 'desc')
    .limit(options.limit + 1);
  if (options.status) query = query.where('is_active', '=', options.status === 'active');
  if (options.startingAfter) query = query.where('id', '<', options.startingAfter);
  const rows = (await query.execute()) as Row[];
  return { data: rows.slice(0, options.limit).map(toView), hasMore: rows.length > options.limit };
}
