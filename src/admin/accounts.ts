import { randomBytes, type ScryptOptions, scrypt, timingSafeEqual } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { sha256Hex } from '../core/crypto.ts';
import { ApiError, notFound } from '../core/errors.ts';
import { newId, randomToken } from '../core/ids.ts';
import { isPlainText } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import { COMMON_PASSWORDS } from './common-passwords.ts';

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

/** Who is calling the admin API: a developer (their projects only) or a full-access token (every project). */
export interface Principal {
  /** The developer whose projects are visible; null for full access. */
  developerId: string | null;
  email: string | null;
  /** For event triggers and audit: `developer`, `admin_token`. */
  actorType: 'developer' | 'admin_token';
  actorId: string;
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

const common = new Set(COMMON_PASSWORDS);

/**
 * A new password: at least 10 characters, not only white space, and not one of the common passwords of
 * leaked password sets (./common-passwords.ts).
 */
export const newPasswordSchema = passwordSchema
  .refine((v) => v.trim().length >= 10, { message: 'must have at least 10 characters besides spaces' })
  .refine((v) => !common.has(v.toLowerCase()), {
    message: 'is one of the most common passwords; choose another',
  });

export const credentialsSchema = z.strictObject({ email: emailSchema, password: passwordSchema });
export const signUpSchema = z.strictObject({ email: emailSchema, password: newPasswordSchema });
export type Credentials = z.infer<typeof credentialsSchema>;

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
  const row = await db
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
  return { ...tokenView(row), token };
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
  let query = db
    .updateTable('admin_tokens')
    .set({ revoked_at: sql`coalesce(revoked_at, now())` })
    .where('id', '=', id);
  if (principal.developerId) query = query.where('developer_id', '=', principal.developerId);
  const row = await query
    .returning(['id', 'name', 'prefix', 'developer_id', 'created_at', 'revoked_at'])
    .executeTakeFirst();
  if (!row) throw notFound(`No admin token ${id}.`, 'admin_token_not_found', 'id');
  return tokenView(row);
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
