import type { Kysely } from 'kysely';
import { sha256Hex } from '../core/crypto.ts';
import { notFound } from '../core/errors.ts';
import { newId, randomToken } from '../core/ids.ts';
import { assertWritable } from '../core/managed.ts';
import type { DB } from '../db/schema.ts';

/**
 * A project's API keys: `tg_` followed by 43 random characters. Only a SHA-256 hash is stored; the key
 * is shown once at creation. The first 11 characters (`tg_` + 8) stay visible as the prefix, to tell
 * keys apart.
 * Authentication (src/auth) resolves a presented key to its project through `findActiveKey`.
 */
export const KEY_PREFIX_LENGTH = 11;

export interface CreatedKey {
  id: string;
  key: string;
  prefix: string;
}

export async function createKey(
  db: Kysely<DB>,
  projectId: string,
  name = 'default',
  opts: { managedBy?: string } = {},
): Promise<CreatedKey> {
  const key = `tg_${randomToken(32)}`;
  const row = await db
    .insertInto('api_keys')
    .values({
      id: newId('key'),
      project_id: projectId,
      name,
      prefix: key.slice(0, KEY_PREFIX_LENGTH),
      key_hash: sha256Hex(key),
      managed_by: opts.managedBy ?? null,
    })
    .returning(['id', 'prefix'])
    .executeTakeFirstOrThrow();
  return { id: row.id, key, prefix: row.prefix };
}

/**
 * Marks a key revoked. Returns its project id; callers publish the revocation to every pod. A key an
 * ApiKey resource manages is revoked only by that resource (src/core/managed.ts).
 */
export async function revokeKey(
  db: Kysely<DB>,
  keyId: string,
  opts: { managedBy?: string } = {},
): Promise<{ projectId: string; keyHash: string }> {
  const current = await db
    .selectFrom('api_keys')
    .select('managed_by')
    .where('id', '=', keyId)
    .executeTakeFirst();
  assertWritable(`The API key ${keyId}`, current?.managed_by, opts.managedBy);
  const row = await db
    .updateTable('api_keys')
    .set({ revoked_at: new Date() })
    .where('id', '=', keyId)
    .returning(['project_id', 'key_hash'])
    .executeTakeFirst();
  if (!row) throw notFound(`No API key ${keyId}.`, 'key_not_found');
  return { projectId: row.project_id, keyHash: row.key_hash };
}

export async function listKeys(db: Kysely<DB>, projectId: string) {
  return db
    .selectFrom('api_keys')
    .select(['id', 'name', 'prefix', 'created_at', 'revoked_at'])
    .where('project_id', '=', projectId)
    .orderBy('id')
    .execute();
}

/** Looks a presented key up by its hash: the project it belongs to, or undefined (unknown or revoked). */
export async function findActiveKey(
  db: Kysely<DB>,
  keyHash: string,
): Promise<{ id: string; projectId: string } | undefined> {
  const row = await db
    .selectFrom('api_keys')
    .select(['id', 'project_id'])
    .where('key_hash', '=', keyHash)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return row ? { id: row.id, projectId: row.project_id } : undefined;
}

/** The active key an ApiKey resource manages, if any. */
export async function findKeyByManager(db: Kysely<DB>, managedBy: string) {
  return db
    .selectFrom('api_keys')
    .select(['id', 'project_id', 'name', 'prefix', 'key_hash', 'created_at'])
    .where('managed_by', '=', managedBy)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
}
