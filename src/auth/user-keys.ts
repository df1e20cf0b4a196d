import type { Kysely } from 'kysely';
import { sha256Hex } from '../core/crypto.ts';
import { notFound } from '../core/errors.ts';
import { newId, randomToken } from '../core/ids.ts';
import type { DB } from '../db/schema.ts';

/**
 * End-user keys: a key that belongs to one end user of one project, `tgu_` followed by 43 random
 * characters (a project key starts `tg_`, so authentication tells the two apart by the prefix). Only a
 * SHA-256 hash is stored; the key is shown once at creation; the first 12 characters stay visible as
 * its prefix. The key directory (./key-directory.ts) resolves a presented key through
 * `findActiveUserKey` and caches it like a project key; revocations travel the same bus message.
 */
export const USER_KEY_PREFIX = 'tgu_';
const VISIBLE_LENGTH = 12;

export interface NewUserKey {
  user: string;
  name: string;
  /** Absent: the key does not expire. */
  expiresAt?: Date | undefined;
  /** The cap the key was given (a decimal string in the project's currency), recorded with it. */
  spendCap?: string | undefined;
}

export interface UserKeyRow {
  id: string;
  project_id: string;
  external_id: string;
  name: string;
  prefix: string;
  spend_cap: string | null;
  expires_at: Date | null;
  created_at: Date;
  revoked_at: Date | null;
}

const COLUMNS = [
  'id',
  'project_id',
  'external_id',
  'name',
  'prefix',
  'spend_cap',
  'expires_at',
  'created_at',
  'revoked_at',
] as const;

export async function createUserKey(
  db: Kysely<DB>,
  projectId: string,
  input: NewUserKey,
): Promise<{ row: UserKeyRow; key: string }> {
  const key = `${USER_KEY_PREFIX}${randomToken(32)}`;
  const row = await db
    .insertInto('end_user_keys')
    .values({
      id: newId('ukey'),
      project_id: projectId,
      external_id: input.user,
      name: input.name,
      prefix: key.slice(0, VISIBLE_LENGTH),
      key_hash: sha256Hex(key),
      spend_cap: input.spendCap ?? null,
      expires_at: input.expiresAt ?? null,
    })
    .returning(COLUMNS)
    .executeTakeFirstOrThrow();
  return { row, key };
}

/** A user's keys, revoked ones included (newest last). */
export async function listUserKeys(db: Kysely<DB>, projectId: string, user: string): Promise<UserKeyRow[]> {
  return db
    .selectFrom('end_user_keys')
    .select(COLUMNS)
    .where('project_id', '=', projectId)
    .where('external_id', '=', user)
    .orderBy('id')
    .execute();
}

/** One key of the project; 404 when it is not one of its keys (or, given `user`, not that user's). */
export async function getUserKey(
  db: Kysely<DB>,
  projectId: string,
  keyId: string,
  user?: string,
): Promise<UserKeyRow> {
  let query = db
    .selectFrom('end_user_keys')
    .select(COLUMNS)
    .where('project_id', '=', projectId)
    .where('id', '=', keyId);
  if (user !== undefined) query = query.where('external_id', '=', user);
  const row = await query.executeTakeFirst();
  if (!row) throw notFound(`No end-user key ${keyId} in this project.`, 'key_not_found', 'id');
  return row;
}

/**
 * Marks a key of the project revoked (again: no change). Returns its hash, which the caller publishes
 * so that every pod drops it (./key-directory.ts `revokeUserKey`).
 */
export async function revokeUserKeyRow(
  db: Kysely<DB>,
  projectId: string,
  keyId: string,
): Promise<{ row: UserKeyRow; keyHash: string; changed: boolean }> {
  const before = await db
    .selectFrom('end_user_keys')
    .select(['revoked_at', 'key_hash'])
    .where('project_id', '=', projectId)
    .where('id', '=', keyId)
    .executeTakeFirst();
  if (!before) throw notFound(`No end-user key ${keyId} in this project.`, 'key_not_found', 'id');
  const row = await db
    .updateTable('end_user_keys')
    .set({ revoked_at: before.revoked_at ?? new Date() })
    .where('project_id', '=', projectId)
    .where('id', '=', keyId)
    .returning(COLUMNS)
    .executeTakeFirstOrThrow();
  return { row, keyHash: before.key_hash, changed: before.revoked_at === null };
}

/** A presented end-user key by its hash: its user and expiry, or undefined (unknown or revoked). */
export async function findActiveUserKey(
  db: Kysely<DB>,
  keyHash: string,
): Promise<{ id: string; projectId: string; user: string; expiresAt: Date | null } | undefined> {
  const row = await db
    .selectFrom('end_user_keys')
    .select(['id', 'project_id', 'external_id', 'expires_at'])
    .where('key_hash', '=', keyHash)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return row
    ? { id: row.id, projectId: row.project_id, user: row.external_id, expiresAt: row.expires_at }
    : undefined;
}

/** A key as the API shows it (never its secret). */
export function userKeyView(row: UserKeyRow) {
  return {
    id: row.id,
    object: 'user.key' as const,
    user: row.external_id,
    name: row.name,
    prefix: row.prefix,
    spendCap: row.spend_cap,
    expiresAt: row.expires_at?.toISOString() ?? null,
    createdAt: row.created_at.toISOString(),
    revokedAt: row.revoked_at?.toISOString() ?? null,
  };
}
