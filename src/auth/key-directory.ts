import { type Bus, channels } from '../bus/index.ts';
import { TtlCache } from '../core/cache.ts';
import { sha256Hex } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import { findActiveKey, revokeKey } from '../projects/keys.ts';
import { findActiveUserKey, revokeUserKeyRow, USER_KEY_PREFIX } from './user-keys.ts';

export interface ResolvedKey {
  id: string;
  projectId: string;
  /** An end-user key's user (./user-keys.ts); undefined for a project key. */
  user?: string;
  /** An end-user key's expiry (ms since the epoch), checked on every request; undefined: none. */
  expiresAt?: number;
}

const POSITIVE_TTL_MS = 5 * 60_000;
const NEGATIVE_TTL_MS = 5_000;

/**
 * Resolves presented API keys — a project's (`tg_…`) or an end user's (`tgu_…`) — to projects without
 * a database round trip once warm. A revocation is
 * published on the bus and drops the cached key on every pod; the TTL bounds staleness if a message
 * is lost.
 */
export class KeyDirectory {
  readonly #db: Database;
  readonly #bus: Bus;
  readonly #cache = new TtlCache<string, ResolvedKey | null>(50_000);
  #unsubscribe: (() => Promise<void>) | undefined;

  constructor(db: Database, bus: Bus) {
    this.#db = db;
    this.#bus = bus;
  }

  async start(): Promise<void> {
    this.#unsubscribe = await this.#bus.subscribe(channels.keyRevoked, (keyHash) =>
      this.#cache.invalidate(keyHash),
    );
  }

  async stop(): Promise<void> {
    await this.#unsubscribe?.();
  }

  /**
   * The key from memory, without a promise: the key (or null: unknown or revoked) when its entry is
   * warm, undefined when `resolve` has to look.
   */
  cached(presented: string): ResolvedKey | null | undefined {
    return this.#cache.get(sha256Hex(presented));
  }

  async resolve(presented: string): Promise<ResolvedKey | undefined> {
    const hash = sha256Hex(presented);
    const found = await this.#cache.getOrLoad(
      hash,
      async () => (await this.#find(presented, hash)) ?? null,
      (value) => (value ? POSITIVE_TTL_MS : NEGATIVE_TTL_MS),
    );
    return found ?? undefined;
  }

  async #find(presented: string, hash: string): Promise<ResolvedKey | undefined> {
    if (!presented.startsWith(USER_KEY_PREFIX)) return findActiveKey(this.#db, hash);
    const key = await findActiveUserKey(this.#db, hash);
    if (!key) return undefined;
    const { expiresAt, ...rest } = key;
    return expiresAt ? { ...rest, expiresAt: expiresAt.getTime() } : rest;
  }

  /**
   * Revokes an end-user key of the project and drops it from every pod's cache, as `revoke` does.
   * `changed` is false when it was revoked already.
   */
  async revokeUserKey(projectId: string, keyId: string) {
    const { row, keyHash, changed } = await revokeUserKeyRow(this.#db, projectId, keyId);
    this.#cache.invalidate(keyHash);
    const propagated = await this.#bus.publish(channels.keyRevoked, keyHash).then(
      () => true,
      () => false,
    );
    return { row, changed, propagated };
  }

  /**
   * Revokes a key in the database and drops it from every pod's cache. `propagated` is false when the
   * bus could not carry the news: other pods then stop accepting the key when their cache entry
   * expires (at most 5 minutes).
   */
  async revoke(
    keyId: string,
    opts: { managedBy?: string } = {},
  ): Promise<{ projectId: string; propagated: boolean }> {
    const { projectId, keyHash } = await revokeKey(this.#db, keyId, opts);
    this.#cache.invalidate(keyHash);
    const propagated = await this.#bus.publish(channels.keyRevoked, keyHash).then(
      () => true,
      () => false,
    );
    return { projectId, propagated };
  }
}
