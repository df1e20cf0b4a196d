import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyLinkToken } from '../../src/users/links.ts';
import { type ChatFixture, perTokenModel, startChatFixture } from '../helpers/chat-fixture.ts';
import { api, depositFor, seedProject } from '../helpers/server.ts';

/** Completions through the official `openai` client: forwarding, streaming, validation, link replies. */
let f: ChatFixture;

beforeAll(async () => {
  f = await startChatFixture({
    models: [perTokenModel('metered', '0.15', '0.6')],
    settings: { connectMessage: 'Hi! Connect to {project} first: {link}' },
  });
  await f.fund('alice', '10.00');
  await f.fund('broke');
});
afterAll(() => f.close());

const messages = [{ role: 'user' as const, content: 'Say hello' }];

async function sse(body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${f.server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${f.apiKey}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const events = text
    .split('\n\n')
    .filter(Boolean)
    .map((e) => e.replace(/^data: /, ''));
  return { res, text, events };
}

describe('forwarded completions', () => {
  it('returns the provider completion and forwards the request with the provider model and key', async () => {
    f.mock.requests.length = 0;
    const reply = await f.client.chat.completions.create({
      model: 'metered',
      user: 'alice',
      messages,
      temperature: 0.2,
      tools: [
        { type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: {} } } },
      ],
    });
    expect(reply.object).toBe('chat.completion');
    expect(reply.choices[0]!.message).toMatchObject({ role: 'assistant', content: ' hello'.repeat(5) });
    expect(reply.choices[0]!.finish_reason).toBe('stop');
    expect(reply.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 5 });
    const sent = f.mock.requests[0]!;
    expect(sent.headers.authorization).toBe('Bearer sk-mock-provider-key');
    expect(sent.body).toMatchObject({
      model: 'mock-model',
      temperature: 0.2,
      max_tokens: 4096,
      user: 'alice',
    });
    expect(sent.body.tools[0].function.name).toBe('lookup');
    expect(sent.body.stream_options).toBeUndefined();
  });

  it('streams chunks, asks the provider for usage and strips the usage chunk the client did not ask for', async () => {
    f.mock.requests.length = 0;
    const stream = await f.client.chat.completions.create({
      model: 'metered',
      user: 'alice',
      messages,
      stream: true,
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.every((c) => c.object === 'chat.completion.chunk')).toBe(true);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe(' hello'.repeat(5));
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('stop');
    expect(chunks.some((c) => c.usage)).toBe(false);
    expect(f.mock.requests[0]!.body).toMatchObject({ stream: true, stream_options: { include_usage: true } });
  });

  it('passes the usage chunk through when the client asks for it', async () => {
    const stream = await f.client.chat.completions.create({
      model: 'metered',
      user: 'alice',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 });
  });

  it('sends streaming headers that keep proxies from buffering, and ends with [DONE]', async () => {
    const { res, events } = await sse({ model: 'metered', user: 'alice', messages, stream: true });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    expect(res.headers.get('cache-control')).toContain('no-cache');
    expect(res.headers.get('x-accel-buffering')).toBe('no');
    expect(events.at(-1)).toBe('[DONE]');
  });

  it('takes the end user from X-Service-User, which wins over the body `user` when both are given', async () => {
    f.mock.requests.length = 0;
    const viaHeader = await f.client.chat.completions.create(
      { model: 'metered', messages },
      { headers: { 'X-Service-User': 'alice' } },
    );
    expect(viaHeader.choices[0]!.message.content).toBe(' hello'.repeat(5));
    const both = await f.client.chat.completions.create(
      { model: 'metered', messages, user: 'nobody-connected' },
      { headers: { 'X-Service-User': 'alice' } },
    );
    expect(both.choices[0]!.message.content).toBe(' hello'.repeat(5));
    const headerOnlyUnknown = await f.client.chat.completions.create(
      { model: 'metered', messages },
      { headers: { 'X-Service-User': 'nobody-connected' } },
    );
    expect(headerOnlyUnknown.choices[0]!.message.content).toContain('/connect/');
    expect(f.mock.requests).toHaveLength(2);
  });
});

describe('validation', () => {
  const cases: Array<[string, unknown, number, string | null, string]> = [
    ['missing messages', { model: 'metered', user: 'a' }, 400, 'messages', 'invalid_request'],
    ['empty messages', { model: 'metered', user: 'a', messages: [] }, 400, 'messages', 'invalid_request'],
    [
      'bad role',
      { model: 'metered', user: 'a', messages: [{ role: 'robot', content: 'x' }] },
      400,
      'messages.0.role',
      'invalid_request',
    ],
    [
      'content not a string',
      { model: 'metered', user: 'a', messages: [{ role: 'user', content: 5 }] },
      400,
      'messages.0.content',
      'invalid_request',
    ],
    [
      'bad name',
      { model: 'metered', user: 'a', messages: [{ role: 'user', content: 'x', name: 'has space' }] },
      400,
      'messages.0.name',
      'invalid_request',
    ],
    [
      'name too long',
      { model: 'metered', user: 'a', messages: [{ role: 'user', content: 'x', name: 'a'.repeat(65) }] },
      400,
      'messages.0.name',
      'invalid_request',
    ],
    [
      'stream not boolean',
      { model: 'metered', user: 'a', messages, stream: 'yes' },
      400,
      'stream',
      'invalid_request',
    ],
    ['missing model', { user: 'a', messages }, 400, 'model', 'invalid_request'],
    ['unknown model', { model: 'nope', user: 'a', messages }, 404, 'model', 'model_not_found'],
    ['no end user', { model: 'metered', messages }, 400, 'user', 'missing_user'],
    ['empty end user', { model: 'metered', user: '', messages }, 400, 'user', 'invalid_request'],
    [
      'end user with a control character',
      { model: 'metered', user: 'a\u0000b', messages },
      400,
      'user',
      'invalid_request',
    ],
    ['not an object', [1, 2], 400, null, 'invalid_request'],
  ];
  for (const [name, body, status, param, code] of cases) {
    it(`${name} → ${status}`, async () => {
      const res = await api(f.server, f.apiKey, 'POST', '/v1/chat/completions', body);
      expect(res.status).toBe(status);
      expect(res.body.error).toMatchObject({ param, code });
      expect(typeof res.body.error.message).toBe('string');
    });
  }

  it('accepts a valid name and passes unknown fields through', async () => {
    f.mock.requests.length = 0;
    const res = await api(f.server, f.apiKey, 'POST', '/v1/chat/completions', {
      model: 'metered',
      user: 'alice',
      messages: [{ role: 'user', content: 'x', name: 'Bob_1' }],
      seed: 7,
      logit_bias: { '50256': -100 },
    });
    expect(res.status).toBe(200);
    expect(f.mock.requests[0]!.body).toMatchObject({ seed: 7, logit_bias: { '50256': -100 } });
    expect(f.mock.requests[0]!.body.messages[0].name).toBe('Bob_1');
  });

  it('the openai client sees a missing user as a BadRequestError naming `user`', async () => {
    const err = await f.client.chat.completions.create({ model: 'metered', messages }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.param).toBe('user');
  });

  it('needs an API key', async () => {
    const res = await api(f.server, undefined, 'POST', '/v1/chat/completions', {
      model: 'metered',
      messages,
    });
    expect(res.status).toBe(401);
  });
});

describe('link replies', () => {
  it('a user who is not connected gets a connect link (project template), no provider call, no charge', async () => {
    f.mock.requests.length = 0;
    const reply = await f.client.chat.completions.create({ model: 'metered', user: 'stranger', messages });
    const content = reply.choices[0]!.message.content!;
    expect(reply.object).toBe('chat.completion');
    expect(reply.choices[0]!.message.role).toBe('assistant');
    expect(reply.choices[0]!.finish_reason).toBe('stop');
    expect(content).toMatch(/^Hi! Connect to Test project first: http:\/\/127\.0\.0\.1:\d+\/connect\/\S+$/);
    const url = content.split(' ').at(-1)!;
    expect(url.startsWith(`${f.ctx.publicBaseUrl}/connect/`)).toBe(true);
    const token = url.split('/connect/')[1]!;
    const check = verifyLinkToken(f.ctx.sealer, token);
    expect(check.ok).toBe(true);
    if (check.ok) {
      expect(check.payload).toMatchObject({ k: 'connect', p: f.project.id, u: 'stranger' });
      const ttl = check.payload.exp - Date.now() / 1000;
      expect(ttl).toBeGreaterThan(f.ctx.config.LINK_TOKEN_TTL_SECONDS - 60);
      expect(ttl).toBeLessThanOrEqual(f.ctx.config.LINK_TOKEN_TTL_SECONDS);
    }
    expect(verifyLinkToken(f.ctx.sealer, `${token}x`).ok).toBe(false);
    expect((reply as any).paywall).toMatchObject({ decision: 'connect_required', url });
    expect(f.mock.requests).toHaveLength(0);
    expect(await f.wallet('stranger')).toBeUndefined();
  });

  it('a connected user who cannot pay gets a top-up link with the default template', async () => {
    f.mock.requests.length = 0;
    const reply = await f.client.chat.completions.create({ model: 'metered', user: 'broke', messages });
    const content = reply.choices[0]!.message.content!;
    expect(content).toContain('Your balance is too low for this request');
    expect(content).toContain('0.00 usd available');
    const url = /(http:\/\/\S+\/topup\/\S+)/.exec(content)![1]!;
    const check = verifyLinkToken(f.ctx.sealer, url.split('/topup/')[1]!);
    expect(check.ok && check.payload).toMatchObject({ k: 'topup', u: 'broke' });
    expect((reply as any).paywall).toMatchObject({ decision: 'topup_required', available: '0.00' });
    expect(f.mock.requests).toHaveLength(0);
    await f.settled();
    expect(await f.ledger('broke')).toEqual([]);
  });

  it('in streaming mode the link replies are valid SSE streams of chunks ending with [DONE]', async () => {
    for (const [user, path] of [
      ['stranger', '/connect/'],
      ['broke', '/topup/'],
    ] as const) {
      const stream = await f.client.chat.completions.create({
        model: 'metered',
        user,
        messages,
        stream: true,
      });
      const chunks: OpenAI.ChatCompletionChunk[] = [];
      for await (const chunk of stream) chunks.push(chunk);
      expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
      expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toContain(path);
      expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('stop');
      expect(new Set(chunks.map((c) => c.id)).size).toBe(1);

      const raw = await sse({
        model: 'metered',
        user,
        messages,
        stream: true,
        stream_options: { include_usage: true },
      });
      expect(raw.res.headers.get('content-type')).toContain('text/event-stream');
      expect(raw.res.headers.get('x-tollgate-paywall')).toBe(
        path === '/connect/' ? 'connect_required' : 'topup_required',
      );
      expect(raw.events.at(-1)).toBe('[DONE]');
      expect(JSON.parse(raw.events.at(-2)!)).toMatchObject({ choices: [], usage: { total_tokens: 0 } });
    }
    expect(f.mock.requests.filter((r) => r.body.user === 'stranger' || r.body.user === 'broke')).toHaveLength(
      0,
    );
  });
});

describe('metrics', () => {
  it('counts requests by paywall decision and outcome, tokens and charges; no hold stays open', async () => {
    await f.settled();
    const requests = (await f.ctx.metrics.requests.get()).values;
    const count = (labels: Record<string, string>) =>
      requests
        .filter((v) => Object.entries(labels).every(([k, want]) => String((v.labels as any)[k]) === want))
        .reduce((sum, v) => sum + v.value, 0);
    expect(
      count({ project: f.project.id, model: 'metered', decision: 'allowed', outcome: 'success' }),
    ).toBeGreaterThan(0);
    expect(count({ decision: 'connect_required', outcome: 'link' })).toBeGreaterThan(0);
    expect(count({ decision: 'topup_required', outcome: 'link', stream: 'true' })).toBeGreaterThan(0);
    const tokens = (await f.ctx.metrics.outputTokens.get()).values.find((v) => v.labels.model === 'metered');
    expect(tokens!.value).toBeGreaterThan(0);
    const charged = (await f.ctx.metrics.charged.get()).values.find((v) => v.labels.source === 'chat');
    expect(charged!.value).toBeGreaterThan(0);
    const open = (await f.ctx.metrics.holdsOpen.get()).values.find((v) => v.labels.project === f.project.id);
    expect(open!.value).toBe(0);
  });
});

describe('providers', () => {
  it('answers echo://local projects with the built-in echo provider, streaming or not, within max_tokens', async () => {
    const seeded = await seedProject(f.ctx, {
      name: 'Echo',
      upstreamUrl: 'echo://local',
      models: [
        { id: 'demo-echo', pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' } },
      ],
    });
    const { connectUser } = await import('../../src/users/service.ts');
    const project = { id: seeded.projectId, owner_user_id: 'x', currency: 'usd' };
    const trigger = { source: 't', actorType: 't', actorId: 't' };
    await connectUser(f.ctx.db, f.ctx.events, project, 'demo-user', trigger);
    await depositFor(f.ctx, project, 'demo-user', '1.00', trigger);
    const client = new OpenAI({ baseURL: `${f.server.url}/v1`, apiKey: seeded.apiKey, maxRetries: 0 });
    const reply = await client.chat.completions.create({
      model: 'demo-echo',
      user: 'demo-user',
      messages: [{ role: 'user', content: 'Hello there' }],
    });
    expect(reply.choices[0]!.message.content).toBe('[echo provider] Hello there');
    expect(reply.usage!.completion_tokens).toBeGreaterThan(3);

    const stream = await client.chat.completions.create({
      model: 'demo-echo',
      user: 'demo-user',
      messages: [{ role: 'user', content: 'Stream this reply in several chunks please' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const parts: string[] = [];
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      const piece = chunk.choices[0]?.delta.content;
      if (piece) parts.push(piece);
      if (chunk.usage) usage = chunk.usage;
    }
    expect(parts.length).toBeGreaterThan(2);
    expect(parts.join('')).toBe('[echo provider] Stream this reply in several chunks please');
    expect(usage!.completion_tokens).toBeGreaterThan(5);

    const short = await client.chat.completions.create({
      model: 'demo-echo',
      user: 'demo-user',
      max_tokens: 3,
      messages: [{ role: 'user', content: 'A long message that will be cut' }],
    });
    expect(short.usage!.completion_tokens).toBe(3);
    expect(short.choices[0]!.finish_reason).toBe('length');
  });

  it('a project without a provider answers 503', async () => {
    const seeded = await seedProject(f.ctx, {
      name: 'No upstream',
      models: [{ id: 'm', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    const res = await api(f.server, seeded.apiKey, 'POST', '/v1/chat/completions', {
      model: 'm',
      user: 'u',
      messages,
    });
    expect(res.status).toBe(503);
    expect(res.body.error).toMatchObject({ code: 'no_upstream', type: 'service_unavailable' });
    expect(res.body.error.message).toContain('no model provider');
  });
});
