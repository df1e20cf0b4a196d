import type { Server } from 'node:http';
import v8 from 'node:v8';
import vm from 'node:vm';
import type { Logger } from 'pino';

/**
 * Gives memory back to the system when a serving process is idle. V8 keeps the heap it grew: the young
 * generation start-up grew to its full size (2 × 16 MB with `--max-semi-space-size=16`) and the old
 * generation's free pages stay committed, and Node never tells V8 it is idle. So a freshly started pod
 * sat at ~166 MB resident with 37 MB of live objects. V8's full collection for low memory (the "last
 * resort" one: several major collections, then the young generation shrunk) takes it to ~121 MB.
 *
 * It runs once when the server is about to listen (start-up's garbage, the migrations and the routes'
 * schemas), and again after a whole period (`IDLE_PERIOD_MS`) without a request once requests were
 * served since the last time — never under load, where the heap's size is what the load needs. It
 * blocks the event loop for some tens of milliseconds, with no request waiting.
 */
const IDLE_PERIOD_MS = 30_000;

/** V8's `gc` with options, from a context made after `--expose-gc` is set; undefined when unavailable. */
function lowMemoryCollection(): (() => void) | undefined {
  try {
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as (options: Record<string, string>) => void;
    return () => gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
  } catch {
    return undefined;
  }
}

export interface IdleMemory {
  /** Gives memory back now (start-up, before listening). */
  release(why: string): void;
  /** Watches `server` for idle periods after requests. */
  watch(server: Server): void;
  stop(): void;
}

export function idleMemory(log: Logger, periodMs = IDLE_PERIOD_MS): IdleMemory {
  const collect = lowMemoryCollection();
  let served = 0;
  let seen = 0;
  let releasedAt = 0;
  let timer: NodeJS.Timeout | undefined;
  let watched: Server | undefined;
  const count = () => {
    served++;
  };
  const release = (why: string) => {
    if (!collect) return;
    const before = process.memoryUsage.rss();
    const started = performance.now();
    collect();
    releasedAt = served;
    log.debug(
      {
        why,
        ms: Math.round(performance.now() - started),
        rssBeforeMb: Math.round(before / 2 ** 20),
        rssAfterMb: Math.round(process.memoryUsage.rss() / 2 ** 20),
      },
      'gave memory back',
    );
  };
  return {
    release,
    watch(server) {
      if (!collect) return;
      watched = server;
      server.on('request', count);
      timer = setInterval(() => {
        if (served === seen && served !== releasedAt) release('idle');
        seen = served;
      }, periodMs);
      timer.unref();
    },
    stop() {
      if (timer) clearInterval(timer);
      watched?.off('request', count);
    },
  };
}
