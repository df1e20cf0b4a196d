import { type Bus, channels } from '../bus/index.ts';
import { TtlCache } from '../core/cache.ts';
import { sha256Hex } from '../core/crypto.ts';
import type { Database } from '../db/index.ts';
import { findActiveKey, revokeKey } from '../projects/keys.ts';

export interface ResolvedKey {
  id: string;
  projectId: string;
}

const POSITIVE_TTL_MS = 5 * 60_000;
const NEGATIVE_TTL_MS = 5_000;

/**
 * Resolves presented API keys to projects without a database round trip once warm. A revocation is
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
      async () => (await findActiveKey(this.#db, hash)) ?? null,
      (value) => (value ? POSITIVE_TTL_MS : NEGATIVE_TTL_MS),
    );
    return found ?? undefined;
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
