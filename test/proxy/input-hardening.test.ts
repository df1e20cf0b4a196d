import { connect as netConnect } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';

/**
 * Bad input never becomes a 500 and never moves money: malformed amounts, deeply nested JSON, NUL bytes
 * in ids and filters, invalid UTF-8, HTTP parse errors. Each case answers OpenAI's error shape.
 */

let f: ChatFixture;

beforeAll(async () => {
  f = await startChatFixture({
    upstream: 'echo',
    models: [{ id: 'per-request', pricing: { mode: 'per_request', perRequest: '0.01' } }],
  });
  await f.fund('alice', '5.00');
});
afterAll(() => f?.close());

const call = (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
  api(f.server, f.apiKey, method, path, body, headers);

/** Every balance, hold and ledger entry of the database, to compare before and after. */
async function moneySnapshot() {
  const { rows } = await sql<{ balance: string; held: string; entries: string; sum: string }>`
    select (select coalesce(sum(balance), 0)::text from end_users) as balance,
           (select coalesce(sum(held), 0)::text from end_users) as held,
           (select count(*)::text from ledger_entries) as entries,
           (select coalesce(sum(amount), 0)::text from ledger_entries) as sum`.execute(f.ctx.db);
  return rows[0];
}

function expectOpenAIError(res: { status: number; body: any }, status: number, param?: string | null) {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  expect(res.body).toEqual({
    error: {
      message: expect.any(String),
      type: expect.any(String),
      param: param === undefined ? expect.toSatisfy((p) => p === null || typeof p === 'string') : param,
      code: expect.toSatisfy((c) => c === null || typeof c === 'string'),
    },
  });
}

describe('amounts', () => {
  const bad = [
    '0.1.2',
    '',
    ' ',
    '١٢',
    '1,00',
    'ten',
    '$10',
    '1e',
    '--1',
    '10\u0000',
    '1e3',
    '-1',
    '0',
    '0.00',
  ];
  it.each([['/v1/user/balance/deposit'], ['/v1/user/charge'], ['/v1/user/topup']])(
    '%s answers 400 on amount for malformed amounts, and moves no money',
    async (path) => {
      const before = await moneySnapshot();
      for (const amount of bad) {
        const res = await call('POST', path, { user: 'alice', amount });
        expectOpenAIError(res, 400, 'amount');
        expect(res.body.error.type).toBe('invalid_request_error');
        expect(res.body.error.message).toMatch(/^Invalid 'amount': /);
      }
      expect(await moneySnapshot()).toEqual(before);
    },
  );

  it('keeps the currency precision rule and canonical amounts', async () => {
    const res = await call('POST', '/v1/user/balance/deposit', { user: 'amy', amount: '0.001' });
    expectOpenAIError(res, 400, 'amount');
    expect(res.body.error.message).toBe("Invalid 'amount': must have at most 2 decimal places for usd");
    const ok = await call('POST', '/v1/user/balance/deposit', { user: 'amy', amount: ' 2.5 ' });
    expect(ok.status).toBe(201);
    expect(ok.body.amount).toBe('2.50');
  });
});

describe('deeply nested JSON', () => {
  const nested = (depth: number, open: string, close: string, leaf = '1') =>
    open.repeat(depth) + leaf + close.repeat(depth);

  it('answers 400 before any work for metadata nested 20 000 deep on deposit and charge', async () => {
    const before = await moneySnapshot();
    for (const path of ['/v1/user/balance/deposit', '/v1/user/charge']) {
      const body = `{"user":"alice","amount":"1.00","metadata":{"a":${nested(20_000, '{"a":', '}')}}}`;
      const res = await call('POST', path, body);
      expectOpenAIError(res, 400, null);
      expect(res.body.error.code).toBe('json_too_deep');
    }
    expect(await moneySnapshot()).toEqual(before);
  });

  it('answers 400 for tools 50 000 deep and response_format 20 000 deep on chat, placing no hold', async () => {
    const before = await moneySnapshot();
    const messages = [{ role: 'user', content: 'hi' }];
    const head = JSON.stringify({ model: 'per-request', user: 'alice', messages }).slice(0, -1);
    for (const body of [
      `${head},"tools":${nested(50_000, '[', ']')}}`,
      `${head},"response_format":${nested(20_000, '{"x":', '}')}}`,
    ]) {
      const res = await call('POST', '/v1/chat/completions', body);
      expectOpenAIError(res, 400, null);
      expect(res.body.error.code).toBe('json_too_deep');
    }
    await f.settled();
    expect(await moneySnapshot()).toEqual(before);
  });

  it('accepts nesting up to the limit, and brackets inside strings do not count', async () => {
    const deep = { user: 'alice', amount: '1.00', metadata: { a: JSON.parse(nested(30, '{"a":', '}')) } };
    expect((await call('POST', '/v1/user/charge', deep)).status).toBe(200);
    const brackets = { user: 'alice', amount: '1.00', metadata: { s: '[[[[{{{{'.repeat(5000) } };
    // too large as metadata (8 KB) but not too deep: a schema error, not a depth error
    const res = await call('POST', '/v1/user/charge', brackets);
    expectOpenAIError(res, 400, 'metadata');
  });
});

describe('NUL bytes and control characters in ids and filters', () => {
  const paths = [
    ['GET', '/v1/webhooks/subscriptions/whsub_%00'],
    ['DELETE', '/v1/webhooks/subscriptions/whsub_%00'],
    ['POST', '/v1/webhooks/subscriptions/whsub_%00/test'],
    ['GET', '/v1/webhooks/logs/dlv_%00'],
    ['POST', '/v1/webhooks/logs/dlv_%00/retry'],
    ['GET', '/v1/webhooks/logs?subscriptionId=%00'],
    ['GET', '/v1/webhooks/logs?eventType=a%00b'],
    ['GET', '/v1/webhooks/logs?starting_after=%00'],
    ['GET', '/v1/webhooks/subscriptions?starting_after=%00'],
    ['GET', '/v1/user/activity?user=alice&after=%00'],
    ['GET', '/v1/user/balance?user=%00'],
    ['GET', '/v1/models/a%00b'],
  ] as const;
  it.each(paths)('%s %s answers 400 or 404 before the database', async (method, path) => {
    const res = await call(method, path);
    expect([400, 404]).toContain(res.status);
    expectOpenAIError(res, res.status);
  });
});

describe('request body encoding', () => {
  it('refuses a body that is not valid UTF-8 and writes nothing', async () => {
    const before = await moneySnapshot();
    const body = Buffer.concat([
      Buffer.from('{"user":"'),
      Buffer.from([0xff, 0xfe, 0xc3, 0x28]),
      Buffer.from('","amount":"1.00"}'),
    ]);
    const res = await fetch(`${f.server.url}/v1/user/balance/deposit`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.apiKey}`, 'content-type': 'application/json' },
      body,
    });
    const parsed = { status: res.status, body: (await res.json()) as any };
    expectOpenAIError(parsed, 400, null);
    expect(parsed.body.error.code).toBe('invalid_encoding');
    expect(await moneySnapshot()).toEqual(before);
    const wallet = await f.wallet('\ufffd\ufffd\ufffd(');
    expect(wallet).toBeUndefined();
  });
});

/** Sends raw bytes and reads the whole answer until the server closes or ends it. */
function raw(bytes: string | Buffer): Promise<string> {
  const { port } = new URL(f.server.url);
  return new Promise((resolve, reject) => {
    const socket = netConnect(Number(port), '127.0.0.1');
    let out = '';
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(out);
    }, 5000);
    socket.on('data', (d) => {
      out += d.toString('latin1');
    });
    socket.on('error', (err) => {
      clearTimeout(timer);
      if (out) resolve(out);
      else reject(err);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(out);
    });
    // Half-close after the request, as a client that has sent everything it means to.
    socket.end(bytes);
  });
}

function parseRaw(text: string): { status: number; body: any } {
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
  const bodyText = text.slice(text.indexOf('\r\n\r\n') + 4);
  return { status, body: JSON.parse(bodyText) };
}

describe('HTTP parse errors', () => {
  const auth = () => `Authorization: Bearer ${f.apiKey}\r\n`;
  const cases: Array<[string, () => string, number]> = [
    [
      'Content-Length longer than the body',
      () =>
        `POST /v1/user/balance/deposit HTTP/1.1\r\nHost: x\r\n${auth()}Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{}`,
      400,
    ],
    [
      'a bad chunk size',
      () =>
        `POST /v1/user/balance/deposit HTTP/1.1\r\nHost: x\r\n${auth()}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`,
      400,
    ],
    [
      'Content-Length with Transfer-Encoding',
      () =>
        `POST /v1/user/balance/deposit HTTP/1.1\r\nHost: x\r\n${auth()}Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
      400,
    ],
    ['a NUL in a header value', () => `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\u0000b\r\n\r\n`, 400],
    ['a DEL in a header value', () => `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\u007fb\r\n\r\n`, 400],
    ['an unknown method', () => `FROB /v1/models HTTP/1.1\r\nHost: x\r\n\r\n`, 400],
    ['a garbage request line', () => `\u0001\u0002 garbage\r\n\r\n`, 400],
    [
      'unframed body bytes',
      () => `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth()}\r\n{"x":1}GARBAGE\r\n\r\n`,
      400,
    ],
    ['a 20 KB URL', () => `GET /v1/models?q=${'a'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 431],
  ];
  it.each(cases)('answers %s in the OpenAI error shape', async (_name, request, status) => {
    const text = await raw(request());
    // unframed body bytes: the first, valid request is answered, then the garbage gets the error
    const last = text.lastIndexOf('HTTP/1.1 ');
    const res = parseRaw(text.slice(last));
    expectOpenAIError(res, status, null);
    expect(res.body.error.type).toBe('invalid_request_error');
  });
});

describe('schema errors keep the OpenAI shape', () => {
  it('names the field of a bad message role', async () => {
    const res = await call('POST', '/v1/chat/completions', {
      model: 'per-request',
      user: 'alice',
      messages: [{ role: 'robot', content: 'hi' }],
    });
    expectOpenAIError(res, 400, 'messages.0.role');
    expect(res.body.error.message).toMatch(/^Invalid 'messages\.0\.role': /);
  });

  it('names unknown fields', async () => {
    const res = await call('POST', '/v1/user/connect', { user: 'alice', x: 1 });
    expectOpenAIError(res, 400, 'x');
    expect(res.body.error.message).toBe("Unknown field 'x'.");
    const q = await call('GET', '/v1/user/balance?user=alice&y=2');
    expectOpenAIError(q, 400, 'y');
    expect(q.body.error.message).toBe("Unknown field 'y'.");
  });

  it('names a missing field', async () => {
    const res = await call('POST', '/v1/user/connect', {});
    expectOpenAIError(res, 400, 'user');
    expect(res.body.error.message).toMatch(/^Invalid 'user': /);
  });

  it('refuses a body that is not a JSON object', async () => {
    for (const body of ['[]', '"x"', '1', 'null']) {
      for (const path of ['/v1/user/connect', '/v1/chat/completions', '/v1/webhooks/subscriptions']) {
        const res = await call('POST', path, body);
        expectOpenAIError(res, 400);
      }
    }
  });
});
