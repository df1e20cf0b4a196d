import { EventEmitter } from 'node:events';
import { Redis } from 'ioredis';

/**
 * The cross-process channel: cache invalidation (revoked keys, changed projects and models) and
 * wake-ups for the delivery workers. Redis pub/sub across pods; an in-process emitter when REDIS_URL
 * is unset. Never the book of record: a lost message only delays, Postgres holds all state.
 */
export interface Bus {
  readonly kind: 'redis' | 'memory';
  /** Prefix of channel names (`tollgate:` plus the test prefix); Redis keys of other modules share it. */
  readonly prefix: string;
  /** The command connection (Redis only): other modules' shared counters (sign-in limits) use it. */
  readonly redis: Redis | undefined;
  publish(channel: string, message: string): Promise<void>;
  /** Resolves once the subscription is active; the returned function unsubscribes. */
  subscribe(channel: string, handler: (message: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

export const channels = {
  keyRevoked: 'keys.revoked',
  projectChanged: 'projects.changed',
  eventsWritten: 'events.written',
  deliveriesDue: 'deliveries.due',
} as const;

export interface BusOptions {
  url?: string | undefined;
  /** Prefix of every channel name; isolates test runs sharing one Redis. */
  prefix?: string;
}

export async function openBus(options: BusOptions): Promise<Bus> {
  const prefix = `tollgate:${options.prefix ?? ''}`;
  if (!options.url) return new MemoryBus(prefix);
  return RedisBus.connect(options.url, prefix);
}

class MemoryBus implements Bus {
  readonly kind = 'memory' as const;
  readonly prefix: string;
  readonly redis = undefined;

  constructor(prefix: string) {
    this.prefix = prefix;
  }

  readonly #emitter = new EventEmitter().setMaxListeners(0);

  async publish(channel: string, message: string): Promise<void> {
    // Asynchronous like Redis: a publisher never runs its subscribers inside its own call stack.
    queueMicrotask(() => this.#emitter.emit(channel, message));
  }

  async subscribe(channel: string, handler: (message: string) => void): Promise<() => Promise<void>> {
    this.#emitter.on(channel, handler);
    return async () => {
      this.#emitter.off(channel, handler);
    };
  }

  async close(): Promise<void> {
    this.#emitter.removeAllListeners();
  }
}

class RedisBus implements Bus {
  readonly kind = 'redis' as const;
  readonly #pub: Redis;
  readonly #sub: Redis;
  readonly #prefix: string;
  get prefix(): string {
    return this.#prefix;
  }
  get redis(): Redis {
    return this.#pub;
  }
  readonly #handlers = new Map<string, Set<(message: string) => void>>();

  private constructor(pub: Redis, sub: Redis, prefix: string) {
    this.#pub = pub;
    this.#sub = sub;
    this.#prefix = prefix;
    this.#sub.on('message', (channel: string, message: string) => {
      const handlers = this.#handlers.get(channel);
      if (handlers) for (const handler of handlers) handler(message);
    });
  }

  static async connect(url: string, prefix: string): Promise<RedisBus> {
    const options = { lazyConnect: true, maxRetriesPerRequest: 2, enableOfflineQueue: true };
    const pub = new Redis(url, options);
    const sub = new Redis(url, options);
    // Errors surface on the commands that fail; without listeners ioredis would print them unhandled.
    pub.on('error', () => {});
    sub.on('error', () => {});
    await Promise.all([pub.connect(), sub.connect()]);
    return new RedisBus(pub, sub, prefix);
  }

  async publish(channel: string, message: string): Promise<void> {
    await this.#pub.publish(this.#prefix + channel, message);
  }

  async subscribe(channel: string, handler: (message: string) => void): Promise<() => Promise<void>> {
    const full = this.#prefix + channel;
    let handlers = this.#handlers.get(full);
    if (!handlers) {
      handlers = new Set();
      this.#handlers.set(full, handlers);
      await this.#sub.subscribe(full);
    }
    handlers.add(handler);
    return async () => {
      handlers.delete(handler);
      if (handlers.size === 0 && this.#handlers.get(full) === handlers) {
        this.#handlers.delete(full);
        await this.#sub.unsubscribe(full);
      }
    };
  }

  async close(): Promise<void> {
    this.#pub.disconnect();
    this.#sub.disconnect();
  }
}
