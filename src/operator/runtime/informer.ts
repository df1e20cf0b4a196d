import { type KubeConfig, Watch } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { type KubeObject, keyOf, statusOf } from './kube.ts';

export interface ListResult<T> {
  items: T[];
  metadata?: { resourceVersion?: string };
}

export type InformerEvent = 'add' | 'update' | 'delete';

export interface InformerOptions<T extends KubeObject> {
  /** For logs, e.g. "webhooksubscriptions". */
  name: string;
  kubeConfig: KubeConfig;
  list(): Promise<ListResult<T>>;
  /** API path of the collection to watch, e.g. /apis/tollgate.dev/v1alpha1/namespaces/ns/webhooksubscriptions. */
  watchPath: string;
  onEvent(event: InformerEvent, object: T, old?: T): void;
  log: Logger;
  /** First delay after a failed list or watch; doubles up to maxBackoffMs. */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** Server-side time-out asked of each watch request. */
  watchTimeoutSeconds?: number;
}

class Gone extends Error {}

/**
 * List-then-watch cache of one collection, like client-go's reflector + informer: lists, then watches from
 * the list's resourceVersion; a watch that ends is resumed from the last resourceVersion seen; 410 Gone
 * (history compacted) makes it list again; any other error restarts it after an exponential backoff.
 * Every change reaches `onEvent`, including the differences a relist finds.
 */
export class Informer<T extends KubeObject> {
  readonly #o: InformerOptions<T>;
  readonly #store = new Map<string, T>();
  #resourceVersion: string | undefined;
  #synced = false;
  #stopped = false;
  #abort: AbortController | undefined;
  #wake: (() => void) | undefined;
  #loop: Promise<void> | undefined;
  #syncedWaiters: Array<() => void> = [];

  constructor(options: InformerOptions<T>) {
    this.#o = options;
  }

  get synced(): boolean {
    return this.#synced;
  }

  get(key: string): T | undefined {
    return this.#store.get(key);
  }

  list(): T[] {
    return [...this.#store.values()];
  }

  keys(): string[] {
    return [...this.#store.keys()];
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  /** Resolves after the first successful list. */
  waitForSync(): Promise<void> {
    if (this.#synced) return Promise.resolve();
    return new Promise((resolve) => this.#syncedWaiters.push(resolve));
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#abort?.abort();
    this.#wake?.();
    await this.#loop;
    for (const waiter of this.#syncedWaiters.splice(0)) waiter();
  }

  async #run(): Promise<void> {
    const base = this.#o.backoffMs ?? 500;
    const max = this.#o.maxBackoffMs ?? 30_000;
    let failures = 0;
    let needList = true;
    while (!this.#stopped) {
      try {
        if (needList) {
          await this.#relist();
          needList = false;
        }
        await this.#watchOnce();
        failures = 0;
      } catch (err) {
        if (this.#stopped) break;
        if (err instanceof Gone || statusOf(err) === 410) {
          this.#o.log.info(`${this.#o.name}: watch history expired (410 Gone); listing again`);
          needList = true;
          continue;
        }
        failures++;
        const delay = Math.min(max, base * 2 ** Math.min(failures - 1, 20));
        this.#o.log.warn(
          { err: (err as Error)?.message ?? String(err) },
          `${this.#o.name}: list/watch failed; retrying in ${delay} ms`,
        );
        await this.#sleep(delay);
      }
    }
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.#wake = done;
    });
  }

  async #relist(): Promise<void> {
    const result = await this.#o.list();
    if (this.#stopped) return;
    const fresh = new Map<string, T>();
    for (const item of result.items) fresh.set(keyOf(item), item);
    for (const [key, old] of this.#store) {
      if (!fresh.has(key)) {
        this.#store.delete(key);
        this.#o.onEvent('delete', old);
      }
    }
    for (const [key, item] of fresh) {
      const old = this.#store.get(key);
      this.#store.set(key, item);
      if (!old) this.#o.onEvent('add', item);
      else if (old.metadata.resourceVersion !== item.metadata.resourceVersion)
        this.#o.onEvent('update', item, old);
    }
    this.#resourceVersion = result.metadata?.resourceVersion;
    if (!this.#synced) {
      this.#synced = true;
      for (const waiter of this.#syncedWaiters.splice(0)) waiter();
    }
  }

  /** One watch request; resolves when the server ends it, rejects on errors (Gone for 410). */
  #watchOnce(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let failed: unknown;
      const params: Record<string, string | number | boolean | undefined> = {
        resourceVersion: this.#resourceVersion,
        allowWatchBookmarks: true,
        timeoutSeconds: this.#o.watchTimeoutSeconds ?? 20 + Math.floor(Math.random() * 8),
      };
      const watch = new Watch(this.#o.kubeConfig);
      const onEvent = (type: string, object: unknown) => {
        if (failed) return;
        const item = object as T;
        if (type === 'ERROR') {
          const status = object as { code?: number; message?: string };
          failed =
            status?.code === 410 ? new Gone(status.message) : new Error(`watch error: ${status?.message}`);
          this.#abort?.abort();
          return;
        }
        const rv = item?.metadata?.resourceVersion;
        if (rv) this.#resourceVersion = rv;
        if (type === 'BOOKMARK') return;
        const key = keyOf(item);
        const old = this.#store.get(key);
        if (type === 'DELETED') {
          this.#store.delete(key);
          this.#o.onEvent('delete', item);
        } else if (type === 'ADDED' || type === 'MODIFIED') {
          this.#store.set(key, item);
          this.#o.onEvent(old ? 'update' : 'add', item, old);
        }
      };
      const onDone = (err: unknown) => {
        this.#abort = undefined;
        if (failed) reject(failed);
        else if (this.#stopped) resolve();
        // An idle watch cut by the client's inactivity timer is resumed like one the server ended.
        else if (err && !['AbortError', 'TimeoutError'].includes((err as Error).name)) reject(err);
        else resolve();
      };
      watch.watch(this.#o.watchPath, params, onEvent, onDone).then(
        (controller) => {
          this.#abort = controller;
          if (this.#stopped) controller.abort();
        },
        (err) => reject(err),
      );
    });
  }
}
