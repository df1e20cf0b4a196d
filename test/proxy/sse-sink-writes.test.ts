import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/core/errors.ts';
import { SseSink } from '../../src/metering/relay.ts';

/**
 * The relayed stream's writes (src/metering/relay.ts): the events written in one tick (those parsed from
 * one read of the provider's answer) leave in one write to the response, with the head; a write the
 * client has not taken makes the next event wait for `drain`; the end and an error after the head carry
 * what is still queued. Against a response that records its writes and refuses the first when told to.
 */
class RecordingResponse extends EventEmitter {
  writes: string[] = [];
  head: { status: number; headers: Record<string, string> } | undefined;
  ended: string | undefined;
  destroyed = false;
  writableEnded = false;
  full = false;

  writeHead(status: number, headers: Record<string, string>) {
    this.head = { status, headers };
    return this;
  }

  write(text: string): boolean {
    this.writes.push(text);
    return !this.full;
  }

  end(text: string) {
    this.ended = text;
    this.writableEnded = true;
  }
}

function sink() {
  const res = new RecordingResponse();
  let heads = 0;
  const reply = { hijack() {}, raw: res as unknown as ServerResponse } as unknown as FastifyReply;
  const sse = new SseSink(reply, { 'x-tollgate-request-id': 'req_1' }, () => heads++);
  return { res, sse, heads: () => heads };
}

const tick = () => new Promise((resolve) => process.nextTick(resolve));

describe('a relayed stream', () => {
  it('writes the events of one tick as one chunk, after the head', async () => {
    const { res, sse, heads } = sink();
    await sse.write('data: 1\n\n');
    await sse.write('data: 2\n\n');
    await sse.write('data: 3\n\n');
    expect(res.writes).toEqual([]);
    expect(res.head?.status).toBe(200);
    expect(heads()).toBe(1);
    await tick();
    expect(res.writes).toEqual(['data: 1\n\ndata: 2\n\ndata: 3\n\n']);
    await sse.write('data: 4\n\n');
    await tick();
    expect(res.writes).toEqual(['data: 1\n\ndata: 2\n\ndata: 3\n\n', 'data: 4\n\n']);
  });

  it('makes the next event wait for drain when the client has not taken the last write', async () => {
    const { res, sse } = sink();
    res.full = true;
    expect(sse.write('data: 1\n\n')).toBeUndefined();
    await tick();
    expect(res.writes).toEqual(['data: 1\n\n']);
    let resumed = false;
    const waiting = sse.write('data: 2\n\n');
    expect(waiting).toBeInstanceOf(Promise);
    void waiting!.then(() => {
      resumed = true;
    });
    await tick();
    await tick();
    expect(resumed).toBe(false);
    res.full = false;
    res.emit('drain');
    await waiting;
    expect(resumed).toBe(true);
    expect(sse.write('data: 3\n\n')).toBeUndefined();
    await tick();
    expect(res.writes).toEqual(['data: 1\n\n', 'data: 2\n\n', 'data: 3\n\n']);
  });

  it('ends, or fails after the head, with what is still queued', async () => {
    const ended = sink();
    await ended.sse.write('data: 1\n\n');
    ended.sse.end('data: [DONE]\n\n');
    await tick();
    expect(ended.res.writes).toEqual([]);
    expect(ended.res.ended).toBe('data: 1\n\ndata: [DONE]\n\n');

    const failed = sink();
    await failed.sse.write('data: 1\n\n');
    failed.sse.fail(new ApiError(502, 'upstream_error', 'The provider failed.'));
    await tick();
    expect(failed.res.writes).toEqual([]);
    expect(failed.res.ended).toMatch(/^data: 1\n\ndata: \{"error":\{.*"The provider failed\."/);
  });
});
