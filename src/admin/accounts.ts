import { randomBytes, type ScryptOptions, scrypt, timingSafeEqual } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAudit } from '../audit/index.ts';
import { type Sealer, sha256Hex } from '../core/crypto.ts';
import { ApiError, notFound } from '../core/errors.ts';
import { newId, randomToken } from '../core/ids.ts';
import { isPlainText } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import { isCommonPassword } from './common-passwords.ts';

/**
 * Developer accounts, their sessions and admin tokens.
 *
 * - Passwords are hashed with scrypt (node:crypto; N=2^15, r=8, p=1, 16-byte salt), stored as
 *   `scrypt$N$r$p$salt$hash`.
 * - A session is a random bearer token (`tgs_…`; only its SHA-256 is stored) with a CSRF token; the
 *   dashboard keeps it in an HttpOnly cookie, API clients send it as a bearer.
 * - An admin token (`tga_…`; hashed) acts for the developer who made it, or for every project when made
 *   with a full-access token. TOLLGATE_ADMIN_TOKEN is the first full-access token.
 */

export const SESSION_TTL_SECONDS = 7 * 24 * 3600;

/** Who acted and from where, for the audit log: the principal of a request (admin API or dashboard). */
export function actorOf(principal: Principal): Actor {
  return {
    type: principal.actorType,
    id: principal.actorId,
    developerId: principal.developerId,
    email: principal.email,
    ip: principal.ip ?? null,
    via: principal.via ?? 'admin_api',
  };
}

/** Who is calling the admin API: a developer (their projects only) or a full-access token (every project). */
export interface Principal {
  /** The developer whose projects are visible; null for full access. */
  developerId: string | null;
  email: string | null;
  /** For event triggers and audit: `developer`, `admin_token`. */
  actorType: 'developer' | 'admin_token';
  actorId: string;
  /** The client's address (`request.ip`, honouring TOLLGATE_TRUSTED_PROXIES), for the audit log. */
  ip?: string;
  /** Where the request came in, for the audit log (default `admin_api`). */
  via?: 'admin_api' | 'dashboard';
  /** The session's CSRF token (cookie sessions). */
  csrf?: string;
  sessionId?: string;
}

export const emailSchema = z
  .string({ message: 'must be an e-mail address' })
  .trim()
  .toLowerCase()
  .max(254, { message: 'must be at most 254 characters' })
  .regex(/^[^\s@]+@[^\s@]+$/, { message: 'must be an e-mail address' })
  .refine(isPlainText, { message: 'must be an e-mail address' });

/** A password as given at sign-in: whatever rule was in force when it was chosen. */
export const passwordSchema = z
  .string({ message: 'must be a string' })
  .min(10, { message: 'must be at least 10 characters' })
  .max(200, { message: 'must be at most 200 characters' })
  .refine((v) => !v.includes('\u0000') && !/\p{Cs}/u.test(v), { message: 'must not contain NUL characters' });

/**
 * A new password: at least 10 characters, not only white space, and not one of the common passwords of
 * leaked password sets (./common-passwords.txt).
 */
export const newPasswordSchema = passwordSchema
  .refine((v) => v.trim().length >= 10, { message: 'must have at least 10 characters besides spaces' })
  .refine((v) => !isCommonPassword(v), {
    message: 'is one of the most common passwords; choose another',
  });

export const credentialsSchema = z.strictObject({ email: emailSchema, password: passwordSchema });
export type Credentials = z.infer<typeof credentialsSchema>;

/** Sign-up: the credentials and, when TOLLGATE_SIGNUP is `invite`, the invite code. */
export const signUpSchema = z.strictObject({
  email: emailSchema,
  password: newPasswordSchema,
  invite: z.string().trim().max(2000).optional(),
});
export type SignUpInput = z.infer<typeof signUpSchema>;

// ---- who may sign up (TOLLGATE_SIGNUP) ----

export type SignUpMode = 'open' | 'invite' | 'closed';

export const INVITE_TTL_DAYS = 7;

/**
 * An invite code: `tgi_<payload>.<signature>`, the payload naming one e-mail address and an expiry,
 * signed with the encryption key's signing key (a different message from link tokens, so neither can
 * stand for the other). It needs no table: it admits one address, and that address can sign up once.
 */
export function createInvite(
  sealer: Sealer,
  email: string,
  ttlDays = INVITE_TTL_DAYS,
  now = Date.now(),
): { code: string; email: string; expiresAt: Date } {
  const address = emailSchema.parse(email);
  const expiresAt = new Date(now + ttlDays * 86_400_000);
  const body = Buffer.from(
    JSON.stringify({ e: address, x: Math.floor(expiresAt.getTime() / 1000) }),
  ).toString('base64url');
  return { code: `tgi_${body}.${sealer.sign(`invite.${body}`)}`, email: address, expiresAt };
}

/** The dashboard's sign-up form with the code filled in. */
export function inviteUrl(publicBaseUrl: string, code: string): string {
  return `${publicBaseUrl}/dashboard/signup?invite=${encodeURIComponent(code)}`;
}

/** The request of an invite: the address and how long the code lasts. */
export const inviteSchema = z.strictObject({
  email: emailSchema,
  expiresInDays: z.number().int().min(1).max(90).default(INVITE_TTL_DAYS),
});

/** True when the code is a valid, unexpired invite for this (normalised) e-mail address. */
export function inviteAdmits(sealer: Sealer, code: string, email: string, now = Date.now()): boolean {
  const match = /^tgi_([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)$/.exec(code);
  if (!match || !sealer.verify(`invite.${match[1]}`, match[2]!)) return false;
  try {
    const payload = JSON.parse(Buffer.from(match[1]!, 'base64url').toString('utf8')) as {
      e?: unknown;
      x?: unknown;
    };
    return payload.e === email && typeof payload.x === 'number' && payload.x * 1000 > now;
  } catch {
    return false;
  }
}

const signUpRefused = (message: string, code: string) =>
  new ApiError(403, 'permission_error', message, { code });

/**
 * Whether a sign-up may go ahead, before anything is looked up (so a refused sign-up cannot tell
 * whether an address has an account): `open` — anyone; `invite` — with an invite code for this address
 * (`createInvite`), or by a full-access admin; `closed` — only by a full-access admin. Throws 403.
 */
export function admitSignUp(
  mode: SignUpMode,
  sealer: Sealer,
  input: Pick<SignUpInput, 'email' | 'invite'>,
  fullAccess: boolean,
): void {
  if (mode === 'open' || fullAccess) return;
  if (mode === 'closed')
    throw signUpRefused(
      'Sign-up is closed on this server; an administrator creates accounts.',
      'signup_closed',
    );
  if (!input.invite)
    throw signUpRefused(
      'Sign-up needs an invite code on this server; ask its administrator.',
      'invite_required',
    );
  if (!inviteAdmits(sealer, input.invite, input.email))
    throw signUpRefused(
      'This invite code is not valid for this e-mail address, or it has expired.',
      'invalid_invite',
    );
}

const SCRYPT = { N: 2 ** 15, r: 8, p: 1, maxmem: 64 * 1024 * 1024 } satisfies ScryptOptions;
const KEY_LENGTH = 32;

function scryptAsync(password: string, salt: Buffer, options: ScryptOptions): Promise<Buffer> {
  return new Promise((resolve, reject) =>
    scrypt(password, salt, KEY_LENGTH, options, (err, key) => (err ? reject(err) : resolve(key))),
  );
}

export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(16);
  const key = await scryptAsync(password, salt, SCRYPT);
  return `scrypt$${SCRYPT.N}$${SCRYPT.r}$${SCRYPT.p}$${salt.toString('base64url')}$${key.toString('base64url')}`;
}

export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const [scheme, n, r, p, salt, hash] = stored.split('$');
  if (scheme !== 'scrypt' || !salt || !hash) return false;
  const expected = Buffer.from(hash, 'base64url');
  const key = await scryptAsync(password, Buffer.from(salt, 'base64url'), {
    N: Number(n),
    r: Number(r),
    p: Number(p),
    maxmem: SCRYPT.maxmem,
  });
  return key.length === expected.length && timingSafeEqual(key, expected);
}

/** A hash of nothing, checked when the e-mail is unknown so that the answer takes as long. */
let dummyHash: Promise<string> | undefined;

export interface DeveloperView {
  id: string;
  object: 'developer';
  email: string;
  createdAt: string;
}

function developerView(row: { id: string; email: string; created_at: Date }): DeveloperView {
  return { id: row.id, object: 'developer', email: row.email, createdAt: row.created_at.toISOString() };
}

/**
 * Creates an account; undefined when the address already has one. Callers answer both alike (sign-up
 * must not tell who has an account), and both take one password hash.
 */
export async function signUp(db: Database, input: Credentials): Promise<DeveloperView | undefined> {
  const passwordHash = await hashPassword(input.password);
  const taken = await db
    .selectFrom('developers')
    .select('id')
    .where(sql`lower(email)`, '=', input.email)
    .executeTakeFirst();
  if (taken) return undefined;
  const row = await db
    .insertInto('developers')
    .values({ id: newId('acct'), email: input.email, password_hash: passwordHash })
    .onConflict((oc) => oc.doNothing())
    .returning(['id', 'email', 'created_at'])
    .executeTakeFirst();
  return row ? developerView(row) : undefined;
}

/** The one answer to a sign-up, whether or not the address had an account. */
export const SIGN_UP_ANSWER =
  'If this address had no account, it has one now with this password: sign in to continue.';

export const invalidCredentials = () =>
  new ApiError(401, 'authentication_error', 'Incorrect e-mail or password.', { code: 'invalid_credentials' });

/** Checks e-mail and password; the developer, or 401 (the same answer and time for an unknown e-mail). */
export async function checkCredentials(db: Database, input: Credentials): Promise<DeveloperView> {
  const row = await db
    .selectFrom('developers')
    .select(['id', 'email', 'created_at', 'password_hash'])
    .where(sql`lower(email)`, '=', input.email)
    .executeTakeFirst();
  if (!row) {
    dummyHash ??= hashPassword('tollgate-dummy-password');
    await verifyPassword(input.password, await dummyHash);
    throw invalidCredentials();
  }
  if (!(await verifyPassword(input.password, row.password_hash))) throw invalidCredentials();
  return developerView(row);
}

export interface CreatedSession {
  id: string;
  token: string;
  csrf: string;
  expiresAt: Date;
}

export async function createSession(db: Database, developerId: string): Promise<CreatedSession> {
  const token = `tgs_${randomToken(32)}`;
  const csrf = randomToken(24);
  const expiresAt = new Date(Date.now() + SESSION_TTL_SECONDS * 1000);
  const id = newId('ses');
  await db
    .insertInto('admin_sessions')
    .values({
      id,
      developer_id: developerId,
      token_hash: sha256Hex(token),
      csrf_token: csrf,
      expires_at: expiresAt,
    })
    .execute();
  return { id, token, csrf, expiresAt };
}

/** Deletes expired sessions; returns how many (a maintenance job). */
export async function deleteExpiredSessions(db: Database): Promise<number> {
  const result = await db
    .deleteFrom('admin_sessions')
    .where('expires_at', '<=', sql<Date>`now()`)
    .executeTakeFirst();
  return Number(result.numDeletedRows);
}

export async function endSession(db: Database, sessionId: string): Promise<void> {
  await db.deleteFrom('admin_sessions').where('id', '=', sessionId).execute();
}

/** The principal of a session token, or undefined (unknown or expired). */
export async function resolveSession(db: Database, token: string): Promise<Principal | undefined> {
  const row = await db
    .selectFrom('admin_sessions as s')
    .innerJoin('developers as d', 'd.id', 's.developer_id')
    .select(['s.id', 's.csrf_token', 's.expires_at', 'd.id as developer_id', 'd.email'])
    .where('s.token_hash', '=', sha256Hex(token))
    .executeTakeFirst();
  if (!row) return undefined;
  if (row.expires_at.getTime() <= Date.now()) {
    await db.deleteFrom('admin_sessions').where('id', '=', row.id).execute();
    return undefined;
  }
  return {
    developerId: row.developer_id,
    email: row.email,
    actorType: 'developer',
    actorId: row.developer_id,
    csrf: row.csrf_token,
    sessionId: row.id,
  };
}

// ---- admin tokens ----

export const ADMIN_TOKEN_PREFIX_LENGTH = 12;

export interface AdminTokenView {
  id: string;
  object: 'admin_token';
  name: string;
  prefix: string;
  /** null: full access. */
  developerId: string | null;
  createdAt: string;
  revokedAt: string | null;
}

type TokenRow = {
  id: string;
  name: string;
  prefix: string;
  developer_id: string | null;
  created_at: Date;
  revoked_at: Date | null;
};

function tokenView(row: TokenRow): AdminTokenView {
  return {
    id: row.id,
    object: 'admin_token',
    name: row.name,
    prefix: row.prefix,
    developerId: row.developer_id,
    createdAt: row.created_at.toISOString(),
    revokedAt: row.revoked_at?.toISOString() ?? null,
  };
}

/** Creates an admin token acting as the principal (a developer's, or full access). Shown once. */
export async function createAdminToken(
  db: Database,
  principal: Principal,
  name: string,
): Promise<AdminTokenView & { token: string }> {
  const token = `tga_${randomToken(32)}`;
  return db.transaction().execute(async (tx) => {
    const row = await tx
      .insertInto('admin_tokens')
      .values({
        id: newId('atk'),
        developer_id: principal.developerId,
        name,
        prefix: token.slice(0, ADMIN_TOKEN_PREFIX_LENGTH),
        token_hash: sha256Hex(token),
      })
      .returning(['id', 'name', 'prefix', 'developer_id', 'created_at', 'revoked_at'])
      .executeTakeFirstOrThrow();
    await recordAudit(tx, {
      actor: actorOf(principal),
      projectId: null,
      action: 'admin_token.create',
      targetType: 'admin_token',
      targetId: row.id,
      after: { name: row.name, prefix: row.prefix, developerId: row.developer_id },
    });
    return { ...tokenView(row), token };
  });
}

export async function listAdminTokens(db: Database, principal: Principal): Promise<AdminTokenView[]> {
  let query = db
    .selectFrom('admin_tokens')
    .select(['id', 'name', 'prefix', 'developer_id', 'created_at', 'revoked_at'])
    .orderBy('id');
  if (principal.developerId) query = query.where('developer_id', '=', principal.developerId);
  return (await query.execute()).map(tokenView);
}

export async function revokeAdminToken(
  db: Database,
  principal: Principal,
  id: string,
): Promise<AdminTokenView> {
  return db.transaction().execute(async (tx) => {
    let before = tx.selectFrom('admin_tokens').select(['revoked_at']).where('id', '=', id).forUpdate();
    if (principal.developerId) before = before.where('developer_id', '=', principal.developerId);
    const was = await before.executeTakeFirst();
    let query = tx
      .updateTable('admin_tokens')
      .set({ revoked_at: sql`coalesce(revoked_at, now())` })
      .where('id', '=', id);
    if (principal.developerId) query = query.where('developer_id', '=', principal.developerId);
    const row = await query
      .returning(['id', 'name', 'prefix', 'developer_id', 'created_at', 'revoked_at'])
      .executeTakeFirst();
    if (!row || !was) throw notFound(`No admin token ${id}.`, 'admin_token_not_found', 'id');
    if (was.revoked_at === null)
      await recordAudit(tx, {
        actor: actorOf(principal),
        projectId: null,
        action: 'admin_token.revoke',
        targetType: 'admin_token',
        targetId: row.id,
        before: { name: row.name, prefix: row.prefix, developerId: row.developer_id, revoked: false },
        after: { name: row.name, prefix: row.prefix, developerId: row.developer_id, revoked: true },
      });
    return tokenView(row);
  });
}

/** The principal of a `tga_` token, or undefined (unknown or revoked). */
export async function resolveAdminToken(db: Database, token: string): Promise<Principal | undefined> {
  const row = await db
    .selectFrom('admin_tokens as t')
    .leftJoin('developers as d', 'd.id', 't.developer_id')
    .select(['t.id', 't.developer_id', 'd.email'])
    .where('t.token_hash', '=', sha256Hex(token))
    .where('t.revoked_at', 'is', null)
    .executeTakeFirst();
  if (!row) return undefined;
  return { developerId: row.developer_id, email: row.email, actorType: 'admin_token', actorId: row.id };
}

export async function getDeveloper(db: Database, id: string): Promise<DeveloperView> {
  const row = await db
    .selectFrom('developers')
    .select(['id', 'email', 'created_at'])
    .where('id', '=', id)
    .executeTakeFirst();
  if (!row) throw notFound(`No developer ${id}.`, 'developer_not_found');
  return developerView(row);
}
