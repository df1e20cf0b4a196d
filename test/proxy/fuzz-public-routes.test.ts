import fc from 'fast-check';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';

/**
 * Property-based fuzzing of every public route: generated malformed bodies (wrong types, unknown and
 * missing fields, deep nesting, NUL and other control characters, lone surrogates, invalid UTF-8, raw
 * bytes, truncated JSON), content types, path ids, query strings and the headers Tollgate reads.
 *
 * For every request: the status is below 500; every `/v1` error (and every 4xx anywhere outside the
 * hosted pages) is exactly OpenAI's `{error:{message,type,param,code}}`; and a refused request changes no
 * balance, hold or ledger entry. Seeded and bounded: the same sequence of requests every run, at most
 * FUZZ_RUNS (500) of them and at most FUZZ_TIME_LIMIT_MS (30 s) of sending, whichever comes first (a
 * loaded machine sends a prefix of the same sequence). Set both higher to search longer. A systematic
 * sweep (the second test) spoils every string of every body with NUL and a lone surrogate in turn.
 */

const SEED = 20_261_123;
const RUNS = Number(process.env.FUZZ_RUNS ?? 500);
const TIME_LIMIT_MS = Number(process.env.FUZZ_TIME_LIMIT_MS ?? 30_000);

let f: ChatFixture;
let subscriptionId = 'whsub_missing';
let deliveryId = 'dlv_missing';
const failures: string[] = [];

beforeAll(async () => {
  f = await startChatFixture({
    upstream: 'echo',
    // the test checkout's routes exist only with test payments on
    env: { TOLLGATE_TEST_PAYMENTS: 'true' },
    models: [
      { id: 'per-request', pricing: { mode: 'per_request', perRequest: '0.01' } },
      { id: 'per-token', pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' } },
    ],
  });
  await f.fund('fuzz-user', '100.00');
  const created = await api(f.server, f.apiKey, 'POST', '/v1/webhooks/subscriptions', {
    url: 'http://127.0.0.1:9/hook',
    events: ['*'],
  });
  expect(created.status).toBe(201);
  subscriptionId = created.body.subscription.id;
  const ping = await api(f.server, f.apiKey, 'POST', `/v1/webhooks/subscriptions/${subscriptionId}/test`);
  if (ping.status === 202) deliveryId = ping.body.id;
}, 60_000);
afterAll(() => f?.close());

/** Every balance, hold and ledger entry of the database. */
async function moneySnapshot(): Promise<string> {
  const { rows } = await sql<{ s: string }>`
    select concat_ws('|',
      (select coalesce(sum(balance), 0) from end_users),
      (select coalesce(sum(held), 0) from end_users),
      (select count(*) from ledger_entries),
      (select coalesce(sum(amount), 0) from ledger_entries)) as s`.execute(f.ctx.db);
  return rows[0]!.s;
}

// ---- generators ----

const nasty = fc.constantFrom(
  '',
  ' ',
  '\u0000',
  'a\u0000b',
  '\u0001\u001f\u007f',
  '\ud800',
  'a\udfffb',
  '\ufeff',
  '0.1.2',
  '١٢',
  '1,00',
  '$10',
  '1e',
  '1e3',
  '--1',
  '-1',
  '0',
  'NaN',
  'Infinity',
  '10\u0000',
  '99999999999999999999999999',
  '💥',
  '__proto__',
  'constructor',
  '%00',
  '../../etc/passwd',
  "'; drop table ledger_entries; --",
  'x'.repeat(300),
);
const text = fc.oneof(
  nasty,
  fc.string({ unit: 'binary', maxLength: 24 }),
  fc.string({ unit: 'grapheme', maxLength: 12 }),
);
const nested = fc.tuple(fc.integer({ min: 40, max: 400 }), fc.boolean()).map(([depth, arrays]) => {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = arrays ? [v] : { a: v };
  return v;
});
const value: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 4, arbitrary: text },
  { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
  { weight: 1, arbitrary: fc.constantFrom(null, true, false, 0, -1, 1.5, 1e308, [], {}) },
  { weight: 1, arbitrary: nested },
  { weight: 1, arbitrary: fc.dictionary(text, text, { maxKeys: 4 }) },
);

/** A valid body of each kind; the fuzzer breaks it. */
const templates: Record<string, Record<string, unknown>> = {
  money: { user: 'fuzz-user', amount: '1.00', metadata: { order: 'o_1' } },
  user: { user: 'fuzz-user' },
  topup: { user: 'fuzz-user', amount: '5.00' },
  spendCaps: { user: 'fuzz-user', daily: '100.00', monthly: null },
  credit: {
    user: 'fuzz-user',
    amount: '1.00',
    reason: 'promo',
    priority: 1,
    expiresAt: '2099-01-01T00:00:00Z',
  },
  alerts: { user: 'fuzz-user', lowBalanceThreshold: '1.00' },
  chat: {
    model: 'per-request',
    user: 'fuzz-user',
    messages: [{ role: 'user', content: 'hi' }],
    stream: false,
    response_format: { type: 'text' },
    tools: [],
  },
  subscription: {
    url: 'http://127.0.0.1:9/hook',
    events: ['*'],
    description: 'd',
    customHeaders: { 'X-A': 'b' },
  },
};

type Edit =
  | { path: string[]; value: unknown }
  | { drop: string[] }
  | { poison: string[]; nasty: string; key: boolean };

/** Every path to a value in a template (leaves and the objects and arrays above them). */
function pathsOf(value: unknown, prefix: string[] = []): string[][] {
  if (typeof value !== 'object' || value === null) return [prefix];
  const below = Object.entries(value).flatMap(([k, v]) => pathsOf(v, [...prefix, k]));
  return prefix.length ? [prefix, ...below] : below;
}

/** A path into a template: a string leaf, any value at any depth, or a new field next to one. */
const fieldPath = (template: Record<string, unknown>) => {
  const paths = pathsOf(template);
  const strings = paths.filter((p) => typeof p.reduce<any>((v, k) => v?.[k], template) === 'string');
  return fc.oneof(
    { weight: 3, arbitrary: fc.constantFrom(...strings) },
    { weight: 2, arbitrary: fc.constantFrom(...paths) },
    { weight: 1, arbitrary: fc.tuple(fc.constantFrom([], ...paths), text).map(([p, k]) => [...p, k]) },
  );
};

/** Characters that are fine in JSON but not necessarily anywhere else. */
const poison = fc.constantFrom('\u0000', '\u0001', '\u007f', '\ud800', '\udfff', '\u2028', '%00');

function applyEdits(template: Record<string, unknown>, edits: Edit[]): unknown {
  const body = structuredClone(template) as Record<string, unknown>;
  for (const edit of edits) {
    const path = 'drop' in edit ? edit.drop : 'poison' in edit ? edit.poison : edit.path;
    if (path.length === 0) continue;
    let target: Record<string, unknown> = body;
    for (const key of path.slice(0, -1)) {
      const next = target[key];
      if (typeof next !== 'object' || next === null) target[key] = {};
      target = target[key] as Record<string, unknown>;
    }
    const last = path[path.length - 1]!;
    if ('drop' in edit) delete target[last];
    else if ('poison' in edit) {
      const current = target[last];
      if (edit.key) {
        delete target[last];
        target[`${last}${edit.nasty}`] = current;
      } else target[last] = `${typeof current === 'string' ? current : ''}${edit.nasty}`;
    } else target[last] = edit.value;
  }
  return body;
}

const bytes = (max: number) => fc.uint8Array({ maxLength: max });

/** Body text (or bytes) for a template: a broken copy, random JSON, garbage, nothing. */
const body = (kind: keyof typeof templates) => {
  const template = templates[kind]!;
  const edit: fc.Arbitrary<Edit> = fc.oneof(
    { weight: 3, arbitrary: fc.record({ poison: fieldPath(template), nasty: poison, key: fc.boolean() }) },
    { weight: 3, arbitrary: fc.record({ path: fieldPath(template), value }) },
    { weight: 1, arbitrary: fc.record({ drop: fieldPath(template) }) },
  );
  return fc.oneof(
    {
      weight: 6,
      // mostly one edit, so that the rest of the body is valid and the edit is what gets tested
      arbitrary: fc
        .oneof(
          { weight: 3, arbitrary: edit.map((e) => [e]) },
          { weight: 1, arbitrary: fc.array(edit, { minLength: 2, maxLength: 3 }) },
        )
        .map((e) => JSON.stringify(applyEdits(template, e))),
    },
    { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v) ?? 'null') },
    {
      weight: 1,
      arbitrary: fc.tuple(fc.array(edit, { maxLength: 2 }), fc.nat()).map(([e, cut]) => {
        const s = JSON.stringify(applyEdits(template, e));
        return s.slice(0, cut % s.length);
      }),
    },
    {
      weight: 1,
      // invalid UTF-8 inside an otherwise fine body
      arbitrary: fc.constantFrom(...Object.keys(template)).chain((k) =>
        fc.uint8Array({ minLength: 1, maxLength: 6 }).map((junk) => {
          const s = JSON.stringify({ ...template, [k]: '\u0001' });
          const [head, tail] = s.split('\\u0001') as [string, string];
          return Buffer.concat([Buffer.from(head), Buffer.from([0xff, ...junk]), Buffer.from(tail)]);
        }),
      ),
    },
    { weight: 1, arbitrary: bytes(48).map((b) => Buffer.from(b)) },
    { weight: 1, arbitrary: fc.constant(undefined) },
  );
};

/** A path segment: printable text, or arbitrary bytes percent-encoded (NUL, invalid UTF-8, `%2F`). */
const segment = fc.oneof(
  fc.constantFrom('whsub_x', 'dlv_x', 'per-request', '%00', 'a%00b', '%ff%fe', '%2F', '..', '%zz', '%', ''),
  fc.string({ unit: fc.constantFrom(...'abcXYZ019_-.~'.split('')), maxLength: 12 }),
  bytes(12).map((b) => [...b].map((x) => `%${x.toString(16).padStart(2, '0')}`).join('')),
);

const queryKeys = fc.constantFrom(
  'user',
  'limit',
  'after',
  'status',
  'subscriptionId',
  'eventType',
  'starting_after',
  'x',
  'user[]',
  '__proto__',
);
const queryValue = fc.oneof(
  fc.constantFrom('fuzz-user', '1', '0', '101', '-1', '1.5', 'abc', 'pending', 'active', '%00', '%ff', ''),
  segment,
);
const query = fc
  .array(fc.tuple(queryKeys, queryValue), { maxLength: 4 })
  .map((pairs) => (pairs.length ? `?${pairs.map(([k, v]) => `${k}=${v}`).join('&')}` : ''));

/** Header values fetch can send (visible ASCII; control bytes are the raw-socket tests' business). */
const headerValue = fc.oneof(
  fc.constantFrom('', ' ', 'fuzz-user', 'x'.repeat(300), '\t', 'a b', '%00'),
  fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)), maxLength: 20 }),
);
const headers = fc.record(
  {
    'content-type': fc.constantFrom(
      'application/json',
      'application/json; charset=utf-8',
      'application/json; charset=latin1',
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/xml',
      'garbage',
    ),
    'idempotency-key': headerValue,
    'x-service-user': headerValue,
  },
  { requiredKeys: [] },
);

interface Route {
  method: string;
  path: fc.Arbitrary<string>;
  body?: keyof typeof templates;
  /** Hosted pages answer HTML, not OpenAI's JSON errors. */
  html?: boolean;
}
const fixed = (p: string) => fc.constant(p);
const withId = (before: string, after = '') =>
  fc.oneof(
    segment.map((s) => `${before}${s}${after}`),
    fc.constantFrom(subscriptionId, deliveryId).map((id) => `${before}${id}${after}`),
  );
const routes = (): Route[] => [
  { method: 'GET', path: fixed('/v1/models') },
  { method: 'GET', path: segment.map((s) => `/v1/models/${s}`) },
  { method: 'POST', path: fixed('/v1/chat/completions'), body: 'chat' },
  { method: 'GET', path: fixed('/v1/user/balance') },
  { method: 'GET', path: fixed('/v1/user/activity') },
  { method: 'POST', path: fixed('/v1/user/balance/deposit'), body: 'money' },
  { method: 'POST', path: fixed('/v1/user/charge'), body: 'money' },
  { method: 'POST', path: fixed('/v1/user/connect'), body: 'user' },
  { method: 'POST', path: fixed('/v1/user/disconnect'), body: 'user' },
  { method: 'POST', path: fixed('/v1/user/topup'), body: 'topup' },
  { method: 'POST', path: fixed('/v1/user/spend-caps'), body: 'spendCaps' },
  { method: 'GET', path: fixed('/v1/user/spend-caps') },
  { method: 'POST', path: fixed('/v1/user/credits'), body: 'credit' },
  { method: 'GET', path: fixed('/v1/user/credits') },
  { method: 'POST', path: fixed('/v1/user/alerts'), body: 'alerts' },
  { method: 'GET', path: fixed('/v1/user/alerts') },
  { method: 'POST', path: fixed('/v1/user/portal'), body: 'user' },
  { method: 'POST', path: fixed('/v1/user/keys'), body: 'user' },
  { method: 'GET', path: fixed('/v1/user/keys') },
  { method: 'DELETE', path: segment.map((s) => `/v1/user/keys/${s}`) },
  { method: 'POST', path: fixed('/v1/webhooks/subscriptions'), body: 'subscription' },
  { method: 'GET', path: fixed('/v1/webhooks/subscriptions') },
  { method: 'GET', path: withId('/v1/webhooks/subscriptions/') },
  { method: 'DELETE', path: withId('/v1/webhooks/subscriptions/') },
  { method: 'POST', path: withId('/v1/webhooks/subscriptions/', '/test') },
  { method: 'GET', path: fixed('/v1/webhooks/logs') },
  { method: 'GET', path: withId('/v1/webhooks/logs/') },
  { method: 'POST', path: withId('/v1/webhooks/logs/', '/retry') },
  { method: 'GET', path: segment.map((s) => `/connect/${s}`), html: true },
  { method: 'POST', path: segment.map((s) => `/connect/${s}`), html: true, body: 'user' },
  { method: 'GET', path: segment.map((s) => `/topup/${s}`), html: true },
  { method: 'GET', path: segment.map((s) => `/portal/${s}`), html: true },
  { method: 'POST', path: segment.map((s) => `/portal/${s}`), html: true, body: 'user' },
  { method: 'GET', path: segment.map((s) => `/payments/done/${s}`), html: true },
  { method: 'POST', path: segment.map((s) => `/payments/stripe/${s}/webhook`), body: 'user' },
  { method: 'POST', path: segment.map((s) => `/payments/${s}/pw_unknown/webhook`), body: 'user' },
  { method: 'GET', path: segment.map((s) => `/payments/test/checkout/${s}`), html: true },
  { method: 'POST', path: segment.map((s) => `/payments/test/checkout/${s}`), html: true, body: 'user' },
  { method: 'POST', path: segment.map((s) => `/payments/test/${s}/webhook`), body: 'user' },
  { method: 'GET', path: fixed('/healthz') },
  { method: 'GET', path: fixed('/readyz') },
];

const request = () =>
  fc
    .oneof(...routes().map((route) => ({ weight: route.body ? 3 : 1, arbitrary: fc.constant(route) })))
    .chain((route) =>
      fc.record({
        method: fc.constant(route.method),
        html: fc.constant(route.html === true),
        path: route.path,
        query,
        headers,
        body:
          route.body || route.method !== 'GET'
            ? body(route.body ?? 'user')
            : fc.constant(undefined as string | Buffer | undefined),
      }),
    );

function isOpenAIError(body: unknown): boolean {
  if (typeof body !== 'object' || body === null) return false;
  const keys = Object.keys(body);
  if (keys.length !== 1 || keys[0] !== 'error') return false;
  const e = (body as { error: Record<string, unknown> }).error;
  return (
    typeof e === 'object' &&
    e !== null &&
    Object.keys(e).sort().join() === 'code,message,param,type' &&
    typeof e.message === 'string' &&
    typeof e.type === 'string' &&
    (e.param === null || typeof e.param === 'string') &&
    (e.code === null || typeof e.code === 'string')
  );
}

interface Sent {
  method: string;
  html: boolean;
  path: string;
  query: string;
  headers: Record<string, string>;
  body: string | Buffer | undefined;
}

let baseline: string | undefined;
let sent = 0;

/**
 * Sends one request and records what is wrong with its answer: a 5xx, an error not in OpenAI's shape,
 * money moved by a refused request (the ledger is compared with the state after the previous request).
 */
async function check(r: Sent): Promise<void> {
  baseline ??= await moneySnapshot();
  const res = await fetch(`${f.server.url}${r.path}${r.query}`, {
    method: r.method,
    headers: { authorization: `Bearer ${f.apiKey}`, ...r.headers },
    ...(r.body !== undefined ? { body: r.body } : {}),
    redirect: 'manual',
  });
  sent++;
  const textBody = await res.text();
  await f.settled();
  let parsed: unknown;
  try {
    parsed = JSON.parse(textBody);
  } catch {
    parsed = textBody;
  }
  const what = () =>
    `${r.method} ${r.path}${r.query} ${JSON.stringify(r.headers)} body=${JSON.stringify(
      typeof r.body === 'string' ? r.body.slice(0, 300) : r.body && [...r.body.subarray(0, 64)],
    )} → ${res.status} ${textBody.slice(0, 300)}`;
  if (res.status >= 500) failures.push(`5xx: ${what()}`);
  if (res.status >= 400 && !r.html && !isOpenAIError(parsed)) failures.push(`shape: ${what()}`);
  const after = await moneySnapshot();
  if (res.status >= 400 && after !== baseline) failures.push(`money moved: ${what()}`);
  baseline = after;
}

describe('fuzzing every public route', () => {
  it(
    'never answers 5xx, always answers errors in OpenAI’s shape, and a refused request moves no money',
    async () => {
      failures.length = 0;
      const started = Date.now();
      const before = sent;
      await fc.assert(
        // Failures are recorded rather than thrown, so that one run lists every kind it finds.
        fc.asyncProperty(request(), async (r) => {
          await check(r);
        }),
        { seed: SEED, numRuns: RUNS, interruptAfterTimeLimit: TIME_LIMIT_MS },
      );
      // the run is bounded by time as well: report how much of it ran
      console.info(`fuzz: ${sent - before} requests in ${Date.now() - started} ms (seed ${SEED})`);
      expect(failures).toEqual([]);
    },
    TIME_LIMIT_MS + 60_000,
  );

  it('refuses NUL, control characters and lone surrogates in every string of every body', async () => {
    // The systematic half: each string field (and its key) of each valid body, spoiled in turn.
    const bodies: Array<[string, keyof typeof templates]> = [
      ['/v1/user/balance/deposit', 'money'],
      ['/v1/user/charge', 'money'],
      ['/v1/user/topup', 'topup'],
      ['/v1/user/connect', 'user'],
      ['/v1/user/disconnect', 'user'],
      ['/v1/chat/completions', 'chat'],
      ['/v1/webhooks/subscriptions', 'subscription'],
    ];
    failures.length = 0;
    const started = Date.now();
    const before = sent;
    for (const [path, kind] of bodies) {
      const template = templates[kind]!;
      const leaves = pathsOf(template).filter(
        (p) => typeof p.reduce<any>((v, k) => v?.[k], template) === 'string',
      );
      for (const leaf of leaves) {
        for (const nasty of ['\u0000', '\ud800']) {
          for (const key of [false, true]) {
            const spoiled = applyEdits(template, [{ poison: leaf, nasty, key }]);
            await check({
              method: 'POST',
              html: false,
              path,
              query: '',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify(spoiled),
            });
          }
        }
      }
    }
    console.info(`sweep: ${sent - before} requests in ${Date.now() - started} ms`);
    expect(failures).toEqual([]);
  }, 120_000);
});
