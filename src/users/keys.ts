import { type Actor, recordAudit } from '../audit/index.ts';
import type { KeyDirectory } from '../auth/key-directory.ts';
import { createUserKey, listUserKeys, type NewUserKey, userKeyView } from '../auth/user-keys.ts';
import { amountSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import { userKeyBody } from './schema.ts';

/**
 * End-user keys as the API, the admin API, the command line and the portal manage them: issue (the
 * key is in the answer once), list (never the secret), revoke (every pod stops accepting it at once:
 * ../auth/key-directory.ts).
 *
 * A key's `spendCap` is its user's monthly spend cap: the key writes it as the user's own monthly cap
 * (the one `/v1/user/spend-caps` shows and sets, enforced by src/limits for every request of the user,
 * atomically across pods and with Redis down), and records it on the key. It caps what the user spends,
 * whichever key or header names them; the latest key given a cap sets it.
 */

export interface UserKeyServices {
  db: Database;
  keys: Pick<KeyDirectory, 'revokeUserKey'>;
  projects: { changed(projectId: string): Promise<void> };
}

/** A new key's input, checked (`userKeyBody`; the cap in the project's currency, canonical). */
export function userKeyInput(currency: string, raw: unknown): NewUserKey {
  const { user, name, expiresAt, spendCap } = parseInput(userKeyBody, raw);
  return {
    user,
    name,
    expiresAt: expiresAt === undefined ? undefined : new Date(expiresAt),
    spendCap: spendCap === undefined ? undefined : parseInput(amountSchema(currency), spendCap, 'spendCap'),
  };
}

export async function issueUserKey(
  ctx: UserKeyServices,
  projectId: string,
  input: NewUserKey,
  actor?: Actor,
) {
  const { row, key } = await ctx.db.transaction().execute(async (tx) => {
    const created = await createUserKey(tx, projectId, input);
    if (input.spendCap !== undefined) {
      const monthly = input.spendCap;
      await tx
        .insertInto('spend_caps')
        .values({ project_id: projectId, external_id: input.user, daily: null, monthly })
        .onConflict((oc) =>
          oc.columns(['project_id', 'external_id']).doUpdateSet({ monthly, updated_at: new Date() }),
        )
        .execute();
    }
    if (actor)
      await recordAudit(tx, {
        actor,
        projectId,
        action: 'user_key.create',
        targetType: 'user_key',
        targetId: created.row.id,
        after: {
          user: input.user,
          name: input.name,
          prefix: created.row.prefix,
          spendCap: input.spendCap ?? null,
          expiresAt: input.expiresAt?.toISOString() ?? null,
        },
      });
    return created;
  });
  if (input.spendCap !== undefined) await ctx.projects.changed(projectId);
  return { ...userKeyView(row), key };
}

export async function userKeys(db: Database, projectId: string, user: string) {
  const rows = await listUserKeys(db, projectId, user);
  return { object: 'list' as const, data: rows.map(userKeyView) };
}

/** Revokes a key of the project (404 when it is not one of its keys), with its audit entry once. */
export async function revokeUserKey(ctx: UserKeyServices, projectId: string, keyId: string, actor?: Actor) {
  const { row, changed, propagated } = await ctx.keys.revokeUserKey(projectId, keyId);
  if (actor && changed)
    await recordAudit(ctx.db, {
      actor,
      projectId,
      action: 'user_key.revoke',
      targetType: 'user_key',
      targetId: keyId,
      before: { user: row.external_id, name: row.name, prefix: row.prefix, revoked: false },
      after: { user: row.external_id, name: row.name, prefix: row.prefix, revoked: true },
    });
  return { ...userKeyView(row), revoked: true as const, propagated };
}
