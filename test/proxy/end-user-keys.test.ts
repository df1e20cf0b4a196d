import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { sha256Hex } from '../../src/core/crypto.ts';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import {
  type ChatFixture,
  chargedTotal,
  perRequestModel,
  startChatFixture,
  tokenPrices,
} from '../helpers/chat-fixture.ts';
import { api, seedProject } from '../helpers/server.ts';

/**
 * End-user keys (`tgu_…`) over `/v1/user/keys`, and what such a key does: it authenticates the model
 * APIs (OpenAI's chat and Responses with Bearer, Anthropic's Messages with x-api-key) as its user with
 * no header, charged to that user exactly; a request naming another user is 403; of the management API
 * it reaches its own balance and activity only; expired → 401; revoked → 401; its spend cap holds.
 */
let f: ChatFixture;
const { price, perToken } = tokenPrices('3', '15', '0.3');
const messages = [{ role: 'user' as const, content: 'Hello' }];

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'metered', upstreamModel: 'mock-model', pricing: perToken },
      { id: 'claude-test', pricing: perToken, routes: [{ provider: 'anthropic', model: 'mock-claude' }] },
      perRequestModel('flat', '0.05'),
    ],
  });
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'anthropic',
    baseUrl: f.mock.baseUrl,
    kind: 'anthropic',
    key: 'sk-ant-mock-key',
  });
  await f.ctx.projects.changed(f.project.id);
});
afterAll(() => f.close());

async function newKey(user: string, extra: Record<string, unknown> = {}) {
  const res = await api(f.server, f.apiKey, 'POST', '/v1/user/keys', { user, name: 'laptop', ...extra });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string; key: string; prefix: string; user: string };
}

const openaiWith = (key: string) =>
  new OpenAI({ baseURL: `${f.server.url}/v1`, apiKey: key, maxRetries: 0, timeout: 20_000 });
const chatWith = (key: string, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  api(f.server, key, 'POST', '/v1/chat/completions', { model: 'metered', messages, ...body }, headers);

describe('POST/GET/DELETE /v1/user/keys with the project key', () => {
  it('creates a key shown once (hashed at rest), lists it without the secret, revokes it: then 401', async () => {
    await f.fund('kate', '1.00');
    const created = await newKey('kate', { name: 'claude-code' });
    expect(created).toMatchObject({ object: 'user.key', user: 'kate', name: 'claude-code', revokedAt: null });
    expect(created.id).toMatch(/^ukey_/);
    expect(created.key).toMatch(/^tgu_[A-Za-z0-9_-]{43}$/);
    expect(created.prefix).toBe(created.key.slice(0, 12));
    const row = await f.ctx.db
      .selectFrom('end_user_keys')
      .selectAll()
      .where('id', '=', created.id)
      .executeTakeFirstOrThrow();
    expect(row.key_hash).toBe(sha256Hex(created.key));
    expect(JSON.stringify(row)).not.toContain(created.key);

    const listed = await api(f.server, f.apiKey, 'GET', '/v1/user/keys?user=kate');
    expect(listed.status).toBe(200);
    expect(listed.body.data).toEqual([
      expect.objectContaining({
        id: created.id,
        prefix: created.prefix,
        name: 'claude-code',
        revokedAt: null,
      }),
    ]);
    expect(JSON.stringify(listed.body)).not.toContain(created.key);

    expect((await chatWith(created.key)).status).toBe(200);
    const revoked = await api(f.server, f.apiKey, 'DELETE', `/v1/user/keys/${created.id}`);
    expect(revoked.status).toBe(200);
    expect(revoked.body).toMatchObject({ id: created.id, revoked: true, propagated: true });
    expect(revoked.body.revokedAt).not.toBeNull();
    const refused = await chatWith(created.key);
    expect(refused.status).toBe(401);
    expect(refused.body.error.code).toBe('invalid_api_key');
    // Revoking again changes nothing; a key of no project of this key's is 404.
    expect((await api(f.server, f.apiKey, 'DELETE', `/v1/user/keys/${created.id}`)).status).toBe(200);
    const other = await seedProject(f.ctx);
    const foreign = await api(f.server, other.apiKey, 'DELETE', `/v1/user/keys/${created.id}`);
    expect(foreign.status).toBe(404);
    expect(foreign.body.error.code).toBe('key_not_found');
  });

  it('refuses every bad input with a 400 naming the field', async () => {
    const cases: Array<[string, string, unknown, string]> = [
      ['POST', '/v1/user/keys', { user: 'kate', name: 'x', color: 'red' }, 'color'],
      ['POST', '/v1/user/keys', { user: 'kate' }, 'name'],
      ['POST', '/v1/user/keys', { name: 'x' }, 'user'],
      ['POST', '/v1/user/keys', { user: 'kate', name: '' }, 'name'],
      ['POST', '/v1/user/keys', { user: 'kate', name: 'x', expiresAt: '2020-01-01T00:00:00Z' }, 'expiresAt'],
      ['POST', '/v1/user/keys', { user: 'kate', name: 'x', expiresAt: 'tomorrow' }, 'expiresAt'],
      ['POST', '/v1/user/keys', { user: 'kate', name: 'x', spendCap: 'ten' }, 'spendCap'],
      ['POST', '/v1/user/keys', { user: 'kate', name: 'x', spendCap: '0.001' }, 'spendCap'],
      ['GET', '/v1/user/keys', undefined, 'user'],
      ['GET', '/v1/user/keys?user=kate&all=1', undefined, 'all'],
      ['DELETE', '/v1/user/keys/key_123', undefined, 'id'],
    ];
    for (const [method, path, body, param] of cases) {
      const res = await api(f.server, f.apiKey, method, path, body);
      expect(res.status, `${method} ${path} ${JSON.stringify(body)}`).toBe(400);
      expect(res.body.error.param, `${method} ${path} ${JSON.stringify(body)}`).toBe(param);
    }
  });
});

describe('an end-user key', () => {
  it('authenticates chat, Responses and Messages as its user with no header, charged to that user exactly', async () => {
    await f.fund('kim', '1.00');
    const { key } = await newKey('kim');
    const openai = openaiWith(key);
    const chat = await openai.chat.completions.create({ model: 'metered', messages });
    expect(chat.choices[0]!.message.content).toBe(' hello'.repeat(5));
    const response = await openai.responses.create({ model: 'metered', input: 'Hello' });
    expect(response.output_text).toBe(' hello'.repeat(5));
    const claude = new Anthropic({ baseURL: f.server.url, apiKey: key, maxRetries: 0, timeout: 20_000 });
    const message = await claude.messages.create({ model: 'claude-test', max_tokens: 100, messages });
    expect(message.content).toEqual([{ type: 'text', text: ' hello'.repeat(5) }]);
    const sent = f.mock.requests.at(-1)!;
    expect(sent.headers['x-api-key']).toBe('sk-ant-mock-key'); // the provider's key, never the user's

    await f.settled();
    const entries = await f.ledger('kim');
    const cost = (input: number, output: number) => new Money(tokenCost(price, input, output)).toFixed();
    expect(chargedTotal(entries, 'chat')).toBe(
      cost(chat.usage!.prompt_tokens, chat.usage!.completion_tokens),
    );
    expect(chargedTotal(entries, 'responses')).toBe(
      cost(response.usage!.input_tokens, response.usage!.output_tokens),
    );
    expect(chargedTotal(entries, 'messages')).toBe(
      cost(message.usage.input_tokens, message.usage.output_tokens),
    );
    expect((await f.holds('kim')).filter((h) => h.status === 'open')).toEqual([]);
    expect(new Money(chargedTotal(entries, 'chat')).gt(0)).toBe(true);
  });

  it('refuses a request naming another user (403); naming its own user is allowed', async () => {
    await f.fund('kai', '1.00');
    const { key } = await newKey('kai');
    const before = f.mock.requests.length;
    for (const res of [
      await chatWith(key, { user: 'bob' }),
      await chatWith(key, {}, { 'X-Service-User': 'bob' }),
      await api(f.server, key, 'POST', '/v1/responses', { model: 'metered', input: 'Hi', user: 'bob' }),
    ]) {
      expect(res.status).toBe(403);
      expect(res.body.error).toMatchObject({ type: 'permission_error', code: 'end_user_mismatch' });
    }
    const claude = new Anthropic({ baseURL: f.server.url, apiKey: key, maxRetries: 0, timeout: 20_000 });
    await expect(
      claude.messages.create({
        model: 'claude-test',
        max_tokens: 100,
        messages,
        metadata: { user_id: 'bob' },
      }),
    ).rejects.toBeInstanceOf(Anthropic.PermissionDeniedError);
    await expect(
      openaiWith(key).chat.completions.create({ model: 'metered', messages, user: 'bob' }),
    ).rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
    expect(f.mock.requests.length).toBe(before);
    expect((await chatWith(key, { user: 'kai' }, { 'X-Service-User': 'kai' })).status).toBe(200);
  });

  it('reaches its own balance and activity, and nothing else of the management API', async () => {
    await f.fund('kit', '1.00');
    const { key, id } = await newKey('kit');
    const balance = await api(f.server, key, 'GET', '/v1/user/balance');
    expect(balance.status).toBe(200);
    expect(balance.body).toMatchObject({ user: 'kit', balance: '1.00' });
    expect((await api(f.server, key, 'GET', '/v1/user/balance?user=kit')).status).toBe(200);
    const activity = await api(f.server, key, 'GET', '/v1/user/activity');
    expect(activity.status).toBe(200);
    expect(activity.body.data.length).toBeGreaterThan(0);
    expect((await api(f.server, key, 'GET', '/v1/models')).status).toBe(200);
    const refused: Array<[string, string, unknown?]> = [
      ['GET', '/v1/user/balance?user=bob'],
      ['GET', '/v1/user/activity?user=bob'],
      ['POST', '/v1/user/keys', { user: 'kit', name: 'more' }],
      ['GET', '/v1/user/keys?user=kit'],
      ['DELETE', `/v1/user/keys/${id}`],
      ['POST', '/v1/user/balance/deposit', { user: 'kit', amount: '5.00' }],
      ['POST', '/v1/user/charge', { user: 'kit', amount: '0.10' }],
      ['POST', '/v1/user/credits', { user: 'kit', amount: '5.00', reason: 'promo' }],
      ['GET', '/v1/user/credits?user=kit'],
      ['POST', '/v1/user/connect', { user: 'kit' }],
      ['POST', '/v1/user/disconnect', { user: 'kit' }],
      ['POST', '/v1/user/portal', { user: 'kit' }],
      ['POST', '/v1/user/spend-caps', { user: 'kit', daily: null, monthly: null }],
      ['GET', '/v1/webhooks/subscriptions'],
      ['GET', '/v1/responses/resp_123'],
    ];
    for (const [method, path, body] of refused) {
      const res = await api(f.server, key, method, path, body);
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.body.error.type).toBe('permission_error');
    }
    expect(new Money((await f.wallet('kit'))!.balance).toFixed()).toBe('1'); // no money moved
    expect((await api(f.server, key, 'GET', '/v1/user/keys?user=kit')).status).toBe(403);
    // The key still works.
    expect((await chatWith(key)).status).toBe(200);
  });

  it('is refused (401) past its expiry, cold or warm', async () => {
    await f.fund('kev', '1.00');
    // (within the key cache's 5 minutes: the warm key is refused from memory)
    const expiresAt = new Date(Date.now() + 60_000);
    const warm = await newKey('kev', { expiresAt: expiresAt.toISOString() });
    expect((await chatWith(warm.key)).status).toBe(200);
    // A key expired before it was ever used (its first lookup reads the database).
    const cold = await newKey('kev', { expiresAt: expiresAt.toISOString() });
    await f.ctx.db
      .updateTable('end_user_keys')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', cold.id)
      .execute();
    const coldRes = await chatWith(cold.key);
    expect(coldRes.status).toBe(401);
    expect(coldRes.body.error.message).toMatch(/expired/);
    // The warm key, once its time has passed: refused from memory.
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      vi.setSystemTime(expiresAt.getTime() + 1000);
      const res = await chatWith(warm.key);
      expect(res.status).toBe(401);
      expect(res.body.error.type).toBe('authentication_error');
    } finally {
      vi.useRealTimers();
    }
  });

  it("holds its spend cap (the user's monthly cap)", async () => {
    await f.fund('kip', '1.00');
    const { key } = await newKey('kip', { spendCap: '0.10' });
    const caps = await api(f.server, f.apiKey, 'GET', '/v1/user/spend-caps?user=kip');
    expect(caps.body).toMatchObject({ monthly: '0.10' });
    const flat = { model: 'flat' };
    expect((await chatWith(key, flat)).headers.get('x-tollgate-paywall')).toBeNull();
    expect((await chatWith(key, flat)).headers.get('x-tollgate-paywall')).toBeNull();
    const third = await chatWith(key, flat);
    expect(third.status).toBe(200);
    expect(third.headers.get('x-tollgate-paywall')).toBe('spend_cap_reached');
    expect(third.body.choices[0].message.content).toMatch(/monthly spending limit/);
    await f.settled();
    expect(chargedTotal(await f.ledger('kip'), 'chat')).toBe(new Money('0.10').toFixed());
  });
});
