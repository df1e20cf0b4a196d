import { sql } from 'kysely';
import { createUserKey } from '../auth/user-keys.ts';
import type { Sealer } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { ProjectContext } from '../projects/directory.ts';
import {
  connectReply,
  type LinkKind,
  type LinkPayload,
  type LinkSettings,
  newLinkUrl,
  verifyLinkToken,
} from './links.ts';
import { type ApiProject, type ConnectionChange, connectUser, type ProjectRef } from './service.ts';

/**
 * A user's links as sessions: the connect, top-up and portal links the API hands out (with their
 * expiry), and opening and using them on the hosted pages (signature, expiry, project, single use of a
 * connect link), and the clean-up of used links' nonces.
 */

/** The expiry of the token at the end of a link URL we just made. */
function expiresAtOf(url: string): string {
  const body = url.slice(url.lastIndexOf('/') + 1).split('.')[0]!;
  const payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as LinkPayload;
  return new Date(payload.exp * 1000).toISOString();
}

/** The connect link of a user (and the message chat would show with it). */
export function connectLink(links: LinkSettings, project: ApiProject, externalId: string) {
  const reply = connectReply({ ...links, project, externalId });
  return { url: reply.url, message: reply.message, expiresAt: expiresAtOf(reply.url) };
}

/** A signed link to a user's portal (`POST /v1/user/portal`, the top-up and done pages). */
export function portalLink(links: LinkSettings, projectId: string, externalId: string) {
  const url = newLinkUrl(links, { kind: 'portal', projectId, externalId });
  return { url, expiresAt: expiresAtOf(url) };
}

/** A top-up link, optionally for a suggested amount. */
export function topupLink(
  links: LinkSettings,
  project: Pick<ProjectContext, 'id'>,
  externalId: string,
  amount: string | undefined,
) {
  const url = newLinkUrl(links, { kind: 'topup', projectId: project.id, externalId, amount });
  return { url, expiresAt: expiresAtOf(url) };
}

export type LinkProblem = 'malformed' | 'forged' | 'expired' | 'wrong_kind' | 'used' | 'unknown_project';

export type OpenedLink =
  | { ok: true; payload: LinkPayload; project: ProjectContext }
  | { ok: false; problem: LinkProblem };

/** Checks a link token of the given kind: signature, expiry, project, and (connect links) prior use. */
export async function openLink(
  ctx: { sealer: Sealer; db: Database; projects: { get(id: string): Promise<ProjectContext | undefined> } },
  kind: LinkKind,
  token: string,
): Promise<OpenedLink> {
  const check = verifyLinkToken(ctx.sealer, token);
  if (!check.ok) return { ok: false, problem: check.reason };
  const payload = check.payload;
  if (payload.k !== kind || typeof payload.p !== 'string' || typeof payload.u !== 'string')
    return { ok: false, problem: 'wrong_kind' };
  const project = await ctx.projects.get(payload.p);
  if (!project) return { ok: false, problem: 'unknown_project' };
  if (kind === 'connect') {
    const used = await ctx.db
      .selectFrom('used_link_tokens')
      .select('nonce')
      .where('nonce', '=', String(payload.n))
      .executeTakeFirst();
    if (used) return { ok: false, problem: 'used' };
  }
  return { ok: true, payload, project };
}

/**
 * Uses a connect link: records its nonce (a second use is refused) and connects the user, in one
 * transaction. Returns `used` when the link was used before (also by a concurrent request). Given
 * `keyName` (the link's `?key=NAME`), an end-user key of that name is made in the same transaction and
 * returned, once.
 */
export async function useConnectLink(
  db: Database,
  events: EventRecorder,
  project: ProjectRef,
  payload: LinkPayload,
  keyName?: string,
): Promise<{ ok: true; change: ConnectionChange; key?: string } | { ok: false; problem: 'used' }> {
  const trigger = { source: 'connect_page', actorType: 'end_user', actorId: payload.u };
  const result = await db.transaction().execute(async (tx) => {
    const recorded = await tx
      .insertInto('used_link_tokens')
      .values({
        nonce: String(payload.n),
        project_id: project.id,
        kind: payload.k,
        external_id: payload.u,
        expires_at: new Date(payload.exp * 1000),
      })
      .onConflict((oc) => oc.column('nonce').doNothing())
      .returning('nonce')
      .executeTakeFirst();
    if (!recorded) return { ok: false as const, problem: 'used' as const };
    const change = await connectUser(tx, events, project, payload.u, trigger);
    if (keyName === undefined) return { ok: true as const, change };
    const { key } = await createUserKey(tx, project.id, { user: payload.u, name: keyName });
    return { ok: true as const, change, key };
  });
  if (result.ok && result.change.changed) events.wake();
  return result;
}

/** Deletes the nonces of links that have expired anyway; returns how many. */
export async function deleteExpiredLinkNonces(db: Database): Promise<number> {
  const result = await db
    .deleteFrom('used_link_tokens')
    .where('expires_at', '<', sql<Date>`now()`)
    .executeTakeFirst();
  return Number(result.numDeletedRows);
}
