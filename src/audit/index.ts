import type { Kysely } from 'kysely';
import { z } from 'zod';
import { newId } from '../core/ids.ts';
import { textInput, wholeNumberParam } from '../core/validation.ts';
import type { DB } from '../db/schema.ts';

/**
 * The audit log (table `audit_log`, migration 0020): who changed what, when, from where, with the
 * settings before and after. `recordAudit` is the one writer; callers pass the transaction of the change
 * when the change is transactional, so an entry exists exactly when its change committed. The table is
 * append-only (the database refuses UPDATE, DELETE and TRUNCATE) and the retention job never touches it.
 * Secrets never reach it: `redact` replaces every value under a secret-looking key, and every string
 * that looks like a provider, Stripe or webhook secret, before the row is written.
 */

/** Who acted, and from where. */
export interface Actor {
  /** `developer` (a dashboard or API session), `admin_token`, `api_key` (/v1), `cli` or `operator`. */
  type: 'developer' | 'admin_token' | 'api_key' | 'cli' | 'operator';
  /** The developer id, the admin token id, the API key id, `cli`, or the Kubernetes resource name. */
  id: string;
  /** The developer account behind a session or a developer's admin token. */
  developerId?: string | null | undefined;
  email?: string | null | undefined;
  /** The client's address (fastify's `request.ip`, which honours TOLLGATE_TRUSTED_PROXIES). */
  ip?: string | null | undefined;
  /** `admin_api`, `dashboard`, `v1`, `cli` or `operator`. */
  via: 'admin_api' | 'dashboard' | 'v1' | 'cli' | 'operator';
}

export const CLI_ACTOR: Actor = { type: 'cli', id: 'cli', via: 'cli' };

export function operatorActor(resource: string): Actor {
  return { type: 'operator', id: resource, via: 'operator' };
}

export interface AuditEntry {
  actor: Actor;
  projectId: string | null;
  /** `<target>.<verb>`, e.g. `project.update`, `pricing.apply`, `money.deposit`. */
  action: string;
  targetType: string;
  targetId: string | null;
  before?: unknown;
  after?: unknown;
}

const SECRET_KEY =
  /(secret|password|passwd|sealed|token_hash|private|^(api_?)?key$|^upstream_?key$|^key_?value$|^authorization$|^token$|^restricted_?key$|^stripe_?key$)/i;
/**
 * Secrets by their shape, anywhere in a string (a key pasted into a description, a grant's metadata or a
 * connect message): bearer credentials, Tollgate's keys and tokens (`tg_` project keys, `tgu_` end-user
 * keys, `tga_` admin, `tgs_` session, `tgi_` invites, any `tg…_`), Stripe's (`sk_`/`rk_`/`pk_`, live and
 * test; `whsec_` signing secrets), and OpenAI/Anthropic-style `sk-…` keys. Each match becomes
 * `[redacted]`; the rest of the text stays.
 */
const SECRET_SHAPES =
  /\bBearer\s+[A-Za-z0-9._~+/=-]{8,}|\b(?:tg[a-z]{0,3}|sk|rk|pk|whsec)_[A-Za-z0-9_-]{6,}|\bsk-[A-Za-z0-9_-]{8,}/g;
export const REDACTED = '[redacted]';

/** A string with every secret-shaped part replaced by `[redacted]`. */
export function redactText(text: string): string {
  return text.replace(SECRET_SHAPES, REDACTED);
}

/** A copy with every secret replaced by `[redacted]` (keys that name a secret, values that look like one). */
export function redact(value: unknown, depth = 0): unknown {
  if (value === null || value === undefined) return value ?? null;
  if (depth > 12) return REDACTED;
  if (typeof value === 'string') return redactText(value);
  if (typeof value !== 'object') return value;
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (v === undefined) continue;
    out[k] = SECRET_KEY.test(k) && v !== null && typeof v !== 'boolean' ? REDACTED : redact(v, depth + 1);
  }
  return out;
}

/** Appends one entry, in `db` (pass the change's transaction when there is one). */
export async function recordAudit(db: Kysely<DB>, entry: AuditEntry): Promise<string> {
  const id = newId('aud');
  const json = (v: unknown) => (v === undefined ? null : JSON.stringify(redact(v)));
  await db
    .insertInto('audit_log')
    .values({
      id,
      project_id: entry.projectId,
      actor_type: entry.actor.type,
      actor_id: entry.actor.id,
      developer_id: entry.actor.developerId ?? null,
      actor_email: entry.actor.email ?? null,
      ip: entry.actor.ip ?? null,
      via: entry.actor.via,
      action: entry.action,
      target_type: entry.targetType,
      target_id: entry.targetId,
      before: json(entry.before),
      after: json(entry.after),
    })
    .execute();
  return id;
}

// ---- reading ----

const isoDate = z
  .string()
  .trim()
  .refine((v) => !Number.isNaN(Date.parse(v)), { message: 'must be a date, e.g. 2026-01-31T00:00:00Z' })
  .transform((v) => new Date(v));

export const auditQuerySchema = z.strictObject({
  action: textInput(100).optional(),
  actor: textInput(255).optional(),
  since: isoDate.optional(),
  until: isoDate.optional(),
  limit: wholeNumberParam(1000, 50),
  starting_after: textInput(64).optional(),
  format: z.enum(['json', 'csv'], { message: "must be 'json' or 'csv'" }).default('json'),
});
export type AuditQuery = z.infer<typeof auditQuerySchema>;

export interface AuditView {
  id: string;
  object: 'audit_entry';
  createdAt: string;
  projectId: string | null;
  actor: {
    type: string;
    id: string;
    developerId: string | null;
    email: string | null;
    ip: string | null;
    via: string;
  };
  action: string;
  target: { type: string; id: string | null };
  before: unknown;
  after: unknown;
}

/** Whose entries: one project's, and/or those a developer may see (undefined: no restriction). */
export interface AuditScope {
  projectId?: string;
  developerId?: string;
}

/**
 * Entries, newest first. `action` matches exactly or as a prefix ending in `.` (`pricing.`);
 * `actor` matches the actor's id, e-mail or type.
 */
export async function listAudit(
  db: Kysely<DB>,
  scope: AuditScope,
  query: Omit<AuditQuery, 'format'>,
): Promise<{ data: AuditView[]; hasMore: boolean }> {
  let q = db
    .selectFrom('audit_log')
    .selectAll()
    .orderBy('id', 'desc')
    .limit(query.limit + 1);
  if (scope.projectId !== undefined) q = q.where('project_id', '=', scope.projectId);
  if (scope.developerId !== undefined) {
    const developerId = scope.developerId;
    // the developer's projects' entries, and their own entries outside a project (their admin tokens)
    q = q.where((eb) =>
      eb.or([
        eb(
          'project_id',
          'in',
          eb.selectFrom('projects').select('id').where('owner_user_id', '=', developerId),
        ),
        eb.and([eb('project_id', 'is', null), eb('developer_id', '=', developerId)]),
      ]),
    );
  }
  if (query.action) {
    const action = query.action;
    q = action.endsWith('.')
      ? q.where('action', 'like', `${action.replace(/[\\%_]/g, (c) => `\\${c}`)}%`)
      : q.where('action', '=', action);
  }
  if (query.actor) {
    const actor = query.actor;
    q = q.where((eb) =>
      eb.or([eb('actor_id', '=', actor), eb('actor_email', '=', actor), eb('actor_type', '=', actor)]),
    );
  }
  if (query.since) q = q.where('created_at', '>=', query.since);
  if (query.until) q = q.where('created_at', '<', query.until);
  if (query.starting_after) q = q.where('id', '<', query.starting_after);
  const rows = await q.execute();
  return {
    data: rows.slice(0, query.limit).map((r) => ({
      id: r.id,
      object: 'audit_entry',
      createdAt: r.created_at.toISOString(),
      projectId: r.project_id,
      actor: {
        type: r.actor_type,
        id: r.actor_id,
        developerId: r.developer_id,
        email: r.actor_email,
        ip: r.ip,
        via: r.via,
      },
      action: r.action,
      target: { type: r.target_type, id: r.target_id },
      before: r.before ?? null,
      after: r.after ?? null,
    })),
    hasMore: rows.length > query.limit,
  };
}

export const AUDIT_COLUMNS = [
  'id',
  'created_at',
  'project_id',
  'actor_type',
  'actor_id',
  'developer_id',
  'actor_email',
  'ip',
  'via',
  'action',
  'target_type',
  'target_id',
  'before',
  'after',
] as const;

/**
 * Entries as CSV (RFC 4180: a header line, CRLF line ends, fields quoted when they need it). A field
 * that a spreadsheet would read as a formula (`=`, `+`, `-`, `@`, tab, CR first) gets a leading `'`.
 */
export function auditCsv(rows: AuditView[]): string {
  const field = (value: unknown) => {
    let text =
      value === null || value === undefined ? '' : typeof value === 'string' ? value : JSON.stringify(value);
    if (/^[=+\-@\t\r]/.test(text)) text = `'${text}`;
    return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
  };
  const lines = [AUDIT_COLUMNS.join(',')];
  for (const r of rows) {
    const cells = [
      r.id,
      r.createdAt,
      r.projectId,
      r.actor.type,
      r.actor.id,
      r.actor.developerId,
      r.actor.email,
      r.actor.ip,
      r.actor.via,
      r.action,
      r.target.type,
      r.target.id,
      r.before,
      r.after,
    ];
    lines.push(cells.map(field).join(','));
  }
  return `${lines.join('\r\n')}\r\n`;
}
