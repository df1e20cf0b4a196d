import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { Sealer } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import { KEY_CHECK } from './context.ts';

/**
 * Every sealed column: provider keys (the project's default and its named providers), payment keys and
 * payment webhook secrets, webhook signing secrets.
 */
export const SEALED_COLUMNS = [
  { table: 'projects', column: 'upstream_key_sealed' },
  { table: 'providers', column: 'key_sealed' },
  { table: 'payment_connections', column: 'key_sealed' },
  { table: 'payment_connections', column: 'webhook_secret_sealed' },
  { table: 'webhook_subscriptions', column: 'secret_sealed' },
] as const;

export interface RotationResult {
  /** Values re-sealed with the active key, per `table.column`. */
  resealed: Record<string, number>;
  /** Values no key of the ring opens, per `table.column` (left as they are, each logged): none is 0. */
  unopenable: Record<string, number>;
  /** The active key's id, now recorded as the database's key. */
  activeKeyId: string;
}

/**
 * Re-seals every sealed value with the ring's active key, in batches of `batch` rows, while the proxies
 * keep serving: each row is rewritten only if it still holds the value read (a concurrent change wins
 * and is already sealed with the active key by a process that has the new ring), and a value already
 * sealed with the active key is skipped, so the command can be stopped and run again at any time. Then
 * records the active key's fingerprint as the database's key check: from then on the old key can leave
 * the ring (once the links it signed have expired: LINK_TOKEN_TTL_SECONDS). A value no key of the ring
 * opens is logged, left as it is and counted in `unopenable`; the rotation goes on with the others.
 */
export async function rotateKeys(
  db: Database,
  sealer: Sealer,
  options: { batch?: number; log?: Logger } = {},
): Promise<RotationResult> {
  const batch = options.batch ?? 200;
  const current = `v2.${sealer.activeKeyId}.%`;
  const resealed: Record<string, number> = {};
  const unopenable: Record<string, number> = {};
  for (const { table, column } of SEALED_COLUMNS) {
    const name = `${table}.${column}`;
    resealed[name] = 0;
    // Values that fail to open stay as they are and are skipped by `offset` (reported, not retried).
    let skipped = 0;
    for (;;) {
      const { rows } = await sql<{ v: string }>`
        SELECT ${sql.ref(column)} AS v FROM ${sql.table(table)}
        WHERE ${sql.ref(column)} IS NOT NULL AND ${sql.ref(column)} NOT LIKE ${current}
        ORDER BY ${sql.ref(column)} LIMIT ${batch} OFFSET ${skipped}`.execute(db);
      if (!rows.length) break;
      for (const { v } of rows) {
        let fresh: string;
        try {
          fresh = sealer.seal(sealer.open(v));
        } catch (err) {
          skipped++;
          options.log?.error(
            { err, table, column },
            `${name}: a value no key of the ring opens; left as it is`,
          );
          continue;
        }
        const updated = await sql`
          UPDATE ${sql.table(table)} SET ${sql.ref(column)} = ${fresh}
          WHERE ${sql.ref(column)} = ${v}`.execute(db);
        resealed[name] += Number(updated.numAffectedRows ?? 0n);
      }
      options.log?.info({ table, column, resealed: resealed[name] }, `${name}: ${resealed[name]} re-sealed`);
    }
    // reported, and the next column goes on: one unreadable secret does not stop the rotation
    if (skipped) unopenable[name] = skipped;
  }
  await db
    .insertInto('system_settings')
    .values({ name: KEY_CHECK, value: sealer.keyCheck() })
    .onConflict((oc) => oc.column('name').doUpdateSet({ value: sealer.keyCheck() }))
    .execute();
  return { resealed, unopenable, activeKeyId: sealer.activeKeyId };
}
