import { EventEmitter } from 'node:events';
import type { Server } from 'node:http';
import { pino } from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { idleMemory } from '../src/app/idle-memory.ts';

/**
 * A serving process gives memory back when idle (src/app/idle-memory.ts): V8's full collection for low
 * memory, once at start-up and after a whole idle period that follows requests — never while requests
 * keep arriving. The periods run on fake timers; the server is an emitter of `request` events.
 */
function logged() {
  const lines: Array<{ msg: string; why: string; rssBeforeMb: number; rssAfterMb: number }> = [];
  const log = pino({ level: 'debug' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { log, releases: () => lines.filter((l) => l.msg === 'gave memory back').map((l) => l.why) };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('giving memory back', () => {
  it('collects what is no longer reachable', () => {
    const { log, releases } = logged();
    const memory = idleMemory(log);
    let garbage: number[][] | undefined = Array.from({ length: 400 }, () => new Array(10_000).fill(1.5));
    const before = process.memoryUsage().heapUsed;
    garbage = undefined;
    memory.release('start-up');
    expect(garbage).toBeUndefined();
    expect(before - process.memoryUsage().heapUsed).toBeGreaterThan(20 * 2 ** 20);
    expect(releases()).toEqual(['start-up']);
  });

  it('after a whole idle period that follows requests, once; never while requests arrive', () => {
    vi.useFakeTimers();
    const { log, releases } = logged();
    const memory = idleMemory(log, 1000);
    const server = new EventEmitter() as unknown as Server;
    memory.watch(server);
    vi.advanceTimersByTime(5000); // idle, and nothing served since start-up: nothing to give back
    expect(releases()).toEqual([]);
    for (let period = 0; period < 5; period++) {
      server.emit('request');
      vi.advanceTimersByTime(1000);
    }
    expect(releases()).toEqual([]);
    vi.advanceTimersByTime(1000); // the first period without a request
    expect(releases()).toEqual(['idle']);
    vi.advanceTimersByTime(10_000);
    expect(releases()).toEqual(['idle']);
    server.emit('request');
    vi.advanceTimersByTime(2000);
    expect(releases()).toEqual(['idle', 'idle']);
    memory.stop();
    server.emit('request');
    vi.advanceTimersByTime(5000);
    expect(releases()).toEqual(['idle', 'idle']);
  });
});
