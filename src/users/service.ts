import { sql } from 'kysely';
import { ensureUser, findWallet, type Trigger, type WalletState } from '../billing/ledger.ts';
import type { Database } from '../db/index.ts';
import type { EventRecorder } from '../events/outbox.ts';
import type { ProjectContext } from '../projects/directory.ts';

type ProjectRef = Pick<ProjectContext, 'id' | 'owner_user_id'>;

export interface ConnectionChange {
  wallet: WalletState;
  /** False when the user already was in the requested state (nothing changed, no event). */
  changed: boolean;
}

/** Connects a user to the paywall (creating the user when unknown); emits `user.connected` on a change. */
export async function connectUser(
  db: Database,
  events: EventRecorder,
  project: ProjectRef,
  externalId: string,
  trigger: Trigger,
): Promise<ConnectionChange> {
  return setConnected(db, events, project, externalId, true, trigger);
}

/** Disconnects a user; emits `user.disconnected` on a change. The wallet keeps its balance. */
export async function disconnectUser(
  db: Database,
  events: EventRecorder,
  project: ProjectRef,
  externalId: string,
  trigger: Trigger,
): Promise<ConnectionChange> {
  return setConnected(db, events, project, externalId, false, trigger);
}

async function setConnected(
  db: Database,
  events: EventRecorder,
  project: ProjectRef,
  externalId: string,
  connected: boolean,
  trigger: Trigger,
): Promise<ConnectionChange> {
  const result = await db.transaction().execute(async (tx) => {
    const userId = await ensureUser(tx, project.id, externalId);
    const updated = await tx
      .updateTable('end_users')
      .set({ connected, connected_at: connected ? sql`now()` : null, updated_at: sql`now()` })
      .where('id', '=', userId)
      .where('connected', '=', !connected)
      .returning('id')
      .executeTakeFirst();
    if (updated) {
      await events.record(tx, {
        project,
        type: connected ? 'user.connected' : 'user.disconnected',
        trigger,
        subject: { type: 'user', id: userId, externalId },
        data: { walletUserId: userId, externalUserId: externalId },
      });
    }
    const wallet = (await findWallet(tx, project.id, externalId))!;
    return { wallet, changed: Boolean(updated) };
  });
  if (result.changed) events.wake();
  return result;
}
