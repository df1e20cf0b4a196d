import type http from 'node:http';
import Anthropic from '@anthropic-ai/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { countMessagesInput } from '../../src/messages/api.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { estimatingCounter } from '../../src/tokens/count.ts';
import { type ChatFixture, chargedTotal, startChatFixture, tokenPrices } from '../helpers/chat-fixture.ts';
import { json, type ScriptedProvider, sse, startScripted } from '../helpers/scripted-provider.ts';

/**
 * What Claude Code sends (captured from Claude Code 2.1.332: system turns inside `messages`,
 * `context_management`, `output_config`, `anthropic-beta`, deferred tools, a JSON `metadata.user_id`,
 * `count_tokens`), with the official `@anthropic-ai/sdk` against a real Tollgate server: forwarded as is
 * to an Anthropic provider (a scripted loopback one), translated to Chat Completions for an
 * OpenAI-compatible one (the mock) with the hints it leaves out named in `x-tollgate-dropped-hints`,
 * each turn charged exactly.
 */
let f: ChatFixture;
let scripted: ScriptedProvider;
/** What the scripted Anthropic provider received. */
const received: Array<{ path: string; body: any; headers: http.IncomingHttpHeaders }> = [];

const { price, perToken } = tokenPrices('3', '15', '0.3');
/** The scripted provider's turn: 100 input tokens, 20 output tokens. */
const NATIVE_TURN = tokenCost(price, 100, 20);
/** The mock's translated turn: 12 input tokens, 5 output tokens. */
const TRANSLATED_TURN = tokenCost(price, 12, 5);
const BETAS =
  'claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,advanced-tool-use-2025-11-20,effort-2025-11-24';
const HINTS_HEADER = 'x-tollgate-dropped-hints';

const sessionId = (session: string) =>
  JSON.stringify({ device_id: 'd38ae985'.repeat(8), account_uuid: '', session_id: session });

/** Claude Code's second request of a tool loop, as captured (texts shortened). */
function claudeCodeBody(model: string, session = 'ed831433-7e58-4542-91a5-82508a2d26fc') {
  return {
    model,
    max_tokens: 32000,
    stream: true,
    system: [
      { type: 'text', text: 'x-anthropic-billing-header: cc_version=2.1.332.500; cc_entrypoint=sdk-cli;' },
      {
        type: 'text',
        text: "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
        cache_control: { type: 'ephemeral' },
      },
    ],
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'Read hello.txt and tell me what it says' }] },
      { role: 'system', content: '# Environment\n - Primary working directory: /tmp/work' },
      {
        role: 'assistant',
        content: [
          { type: 'thinking', thinking: 'Let me read the file.', signature: 'sig-abc' },
          { type: 'tool_use', id: 'toolu_2', name: 'Read', input: { file_path: '/tmp/work/hello.txt' } },
        ],
      },
      {
        role: 'user',
        content: [
          {
            type: 'tool_result',
            tool_use_id: 'toolu_2',
            content: '1\thello',
            cache_control: { type: 'ephemeral' },
          },
        ],
      },
      { role: 'system', content: [{ type: 'text', text: 'A reminder from the harness.' }] },
    ],
    tools: [
      {
        name: 'Read',
        description: 'Reads a file from the local filesystem.',
        input_schema: {
          type: 'object',
          properties: { file_path: { type: 'string' } },
          required: ['file_path'],
        },
      },
      {
        name: 'DeferredToolPlaceholder',
        description: 'Reserved placeholder that keeps deferred tool loading active; never call this tool.',
        input_schema: { type: 'object', properties: {} },
        defer_loading: true,
      },
    ],
    metadata: { user_id: sessionId(session) },
    thinking: { type: 'adaptive', display: 'omitted' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    output_config: { effort: 'high' },
  };
}

function client(user?: string): Anthropic {
  return new Anthropic({
    baseURL: f.server.url,
    apiKey: f.apiKey,
    maxRetries: 0,
    timeout: 20_000,
    defaultHeaders: { 'anthropic-beta': BETAS, ...(user ? { 'X-Service-User': user } : {}) },
  });
}

/** Sends a streamed request with the SDK; the text it streamed and the response headers. */
async function streamed(c: Anthropic, body: object): Promise<{ text: string; headers: Headers }> {
  const { data, response } = await c.messages.create(body as any).withResponse();
  let text = '';
  for await (const event of data as unknown as AsyncIterable<any>) {
    if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
  }
  return { text, headers: response.headers };
}

async function expectCharged(user: string, amount: string): Promise<void> {
  await f.settled();
  expect(chargedTotal(await f.ledger(user), 'messages')).toBe(new Money(amount).toFixed());
  expect((await f.holds(user)).filter((h) => h.status === 'open')).toEqual([]);
}

/** Anthropic's events of a message saying `text`, with the scripted usage. */
function anthropicEvents(text: string): Array<[string, unknown]> {
  return [
    [
      'message_start',
      {
        type: 'message_start',
        message: {
          id: 'msg_scripted',
          type: 'message',
          role: 'assistant',
          model: 'claude-sonnet-4-5',
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { input_tokens: 100, output_tokens: 1 },
        },
      },
    ],
    [
      'content_block_start',
      { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
    ],
    ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } }],
    ['content_block_stop', { type: 'content_block_stop', index: 0 }],
    [
      'message_delta',
      {
        type: 'message_delta',
        delta: { stop_reason: 'end_turn', stop_sequence: null },
        usage: { output_tokens: 20 },
      },
    ],
    ['message_stop', { type: 'message_stop' }],
  ];
}

beforeAll(async () => {
  scripted = await startScripted();
  scripted.handlers.set('POST /v1/messages', (body, res, req) => {
    received.push({ path: '/v1/messages', body, headers: req.headers });
    sse(res, anthropicEvents('The file says hello.'), 'end');
  });
  scripted.handlers.set('POST /v1/messages/count_tokens', (body, res, req) => {
    received.push({ path: '/v1/messages/count_tokens', body, headers: req.headers });
    json(res, { input_tokens: 4321 });
  });
  f = await startChatFixture({
    familyMargins: true,
    models: [
      // Native: a provider of kind anthropic (the scripted one).
      {
        id: 'claude-native',
        pricing: perToken,
        routes: [{ provider: 'claude-direct', model: 'claude-sonnet-4-5' }],
      },
      // A Claude model name routed to an OpenAI-compatible provider (the mock): translated.
      { id: 'claude-translated', upstreamModel: 'claude-sonnet-4-5', pricing: perToken },
      // An Anthropic provider nothing listens for.
      {
        id: 'claude-down',
        pricing: perToken,
        routes: [{ provider: 'claude-down', model: 'claude-sonnet-4-5' }],
      },
    ],
  });
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'claude-down',
    baseUrl: 'http://127.0.0.1:1',
    kind: 'anthropic',
    key: 'sk-ant-down',
  });
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'claude-direct',
    baseUrl: scripted.url,
    kind: 'anthropic',
    key: 'sk-ant-scripted',
  });
  await f.ctx.projects.changed(f.project.id);
});
afterAll(async () => {
  await f?.close();
  await scripted?.close();
});

describe("Claude Code's request to an Anthropic provider", () => {
  it('is forwarded as received — system turns, context_management, output_config, deferred tools, betas', async () => {
    await f.fund('cc-native', '1.00');
    received.length = 0;
    const body = claudeCodeBody('claude-native');
    const { text, headers } = await streamed(client('cc-native'), body);
    expect(text).toBe('The file says hello.');
    expect(headers.get(HINTS_HEADER)).toBeNull();
    const sent = received.at(-1)!;
    expect(sent.body).toEqual({ ...body, model: 'claude-sonnet-4-5' });
    expect(sent.headers['anthropic-beta']).toBe(BETAS);
    expect(sent.headers['x-api-key']).toBe('sk-ant-scripted');
    await expectCharged('cc-native', NATIVE_TURN);
  });

  it('carries the tool search tool and its deferred tools as they are', async () => {
    await f.fund('cc-search', '1.00');
    received.length = 0;
    const body = {
      model: 'claude-native',
      max_tokens: 1000,
      stream: true,
      tools: [
        { type: 'tool_search_tool_regex_20251119', name: 'tool_search_tool_regex' },
        { name: 'get_weather', input_schema: { type: 'object', properties: {} }, defer_loading: true },
      ],
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    };
    await streamed(client('cc-search'), body);
    expect(received.at(-1)!.body.tools).toEqual(body.tools);
    await expectCharged('cc-search', NATIVE_TURN);
  });
});

describe("Claude Code's request to an OpenAI-compatible provider (translated)", () => {
  it('system turns in place, effort → reasoning_effort, every tool sent; the hints left out are named', async () => {
    await f.fund('cc-translated', '1.00');
    const before = f.mock.requests.length;
    const { text, headers } = await streamed(client('cc-translated'), claudeCodeBody('claude-translated'));
    expect(text).toBe(' hello'.repeat(5));
    expect(headers.get(HINTS_HEADER)!.split(', ').sort()).toEqual(
      ['anthropic-beta', 'context_management', 'defer_loading', 'metadata.user_id', 'thinking blocks'].sort(),
    );
    const sent = f.mock.requests.slice(before).at(-1)!;
    expect(sent.headers['anthropic-beta']).toBeUndefined();
    expect(sent.body).toMatchObject({
      model: 'claude-sonnet-4-5',
      reasoning_effort: 'high',
      messages: [
        {
          role: 'system',
          content:
            "x-anthropic-billing-header: cc_version=2.1.332.500; cc_entrypoint=sdk-cli;\nYou are a Claude agent, built on Anthropic's Claude Agent SDK.",
        },
        { role: 'user', content: [{ type: 'text', text: 'Read hello.txt and tell me what it says' }] },
        { role: 'system', content: '# Environment\n - Primary working directory: /tmp/work' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [
            {
              id: 'toolu_2',
              type: 'function',
              function: { name: 'Read', arguments: '{"file_path":"/tmp/work/hello.txt"}' },
            },
          ],
        },
        { role: 'tool', tool_call_id: 'toolu_2', content: '1\thello' },
        { role: 'system', content: 'A reminder from the harness.' },
      ],
    });
    expect(sent.body.tools.map((t: any) => t.function.name)).toEqual(['Read', 'DeferredToolPlaceholder']);
    expect(sent.body.user).toBeUndefined();
    expect(sent.body.context_management).toBeUndefined();
    await expectCharged('cc-translated', TRANSLATED_TURN);
  });

  it('a request with nothing to leave out has no hints header; a meaning it cannot carry is a 400', async () => {
    await f.fund('cc-plain', '1.00');
    const plain = new Anthropic({
      baseURL: f.server.url,
      apiKey: f.apiKey,
      maxRetries: 0,
      defaultHeaders: { 'X-Service-User': 'cc-plain' },
    });
    const { headers } = await streamed(plain, {
      model: 'claude-translated',
      max_tokens: 100,
      stream: true,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    expect(headers.get(HINTS_HEADER)).toBeNull();
    const err = await plain.messages
      .create({
        model: 'claude-translated',
        max_tokens: 100,
        messages: [{ role: 'user', content: 'Hi' }],
        output_config: { format: { type: 'xml' } },
      } as any)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect((err as any).error.error).toMatchObject({
      param: 'output_config.format',
      code: 'untranslatable_field',
    });
    await expectCharged('cc-plain', TRANSLATED_TURN);
  });
});

describe("Claude Code's metadata.user_id", () => {
  it('never names a user: two sessions of one X-Service-User are one wallet', async () => {
    await f.fund('cc-dev', '1.00');
    await streamed(client('cc-dev'), claudeCodeBody('claude-native', 'session-one'));
    await streamed(client('cc-dev'), claudeCodeBody('claude-native', 'session-two'));
    await expectCharged('cc-dev', new Money(NATIVE_TURN).times(2).toFixed());
  });

  it('without X-Service-User (or an end-user key) it is a 400 saying how to name the user; no user is made', async () => {
    const before = received.length;
    for (const user_id of [
      sessionId('session-three'),
      `user_${'ab'.repeat(32)}_account__session_${'1'.repeat(8)}-aaaa`,
    ]) {
      const err = await client()
        .messages.create({ ...claudeCodeBody('claude-native'), stream: false, metadata: { user_id } } as any)
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Anthropic.BadRequestError);
      const error = (err as any).error.error;
      expect(error).toMatchObject({ param: 'metadata.user_id', code: 'missing_user' });
      expect(error.message).toContain('X-Service-User');
    }
    expect(received.length).toBe(before);
    const minted = await f.ctx.db
      .selectFrom('end_users')
      .select('external_id')
      .where('project_id', '=', f.project.id)
      .where((eb) => eb.or([eb('external_id', 'like', '{%'), eb('external_id', 'like', 'user\\_%')]))
      .execute();
    expect(minted).toEqual([]);
  });

  it('an ordinary metadata.user_id still names the user', async () => {
    await f.fund('cc-meta', '1.00');
    await streamed(client(), { ...claudeCodeBody('claude-native'), metadata: { user_id: 'cc-meta' } });
    await expectCharged('cc-meta', NATIVE_TURN);
  });
});

describe('count_tokens', () => {
  const request = {
    system: 'Be brief.',
    messages: [
      { role: 'user' as const, content: 'Hello there, how are you today? '.repeat(20) },
      { role: 'system' as const, content: 'A reminder.' },
    ],
    tools: [{ name: 'Read', input_schema: { type: 'object' as const, properties: {} } }],
  };

  it("is forwarded to a model's Anthropic provider, with its model name and the client's betas", async () => {
    received.length = 0;
    const { data, response } = await client()
      .messages.countTokens({ ...request, model: 'claude-native' } as any)
      .withResponse();
    expect(data.input_tokens).toBe(4321);
    expect(response.headers.get('x-tollgate-token-count')).toBe('provider');
    const sent = received.at(-1)!;
    expect(sent.path).toBe('/v1/messages/count_tokens');
    expect(sent.body).toEqual({ ...request, model: 'claude-sonnet-4-5' });
    expect(sent.headers['anthropic-beta']).toBe(BETAS);
    expect(sent.headers['x-api-key']).toBe('sk-ant-scripted');
  });

  it('elsewhere answers the model family’s calibrated estimate: the o200k count × 1.3 for Claude, rounded up', async () => {
    const before = f.mock.requests.length;
    const { data, response } = await client()
      .messages.countTokens({ ...request, model: 'claude-translated' } as any)
      .withResponse();
    expect(response.headers.get('x-tollgate-token-count')).toBe('estimate');
    const o200k = countMessagesInput({ ...request, model: 'claude-translated' }, estimatingCounter());
    expect(o200k).toBeGreaterThan(100);
    expect(data.input_tokens).toBe(Math.ceil((o200k * 13) / 10));
    expect(data.input_tokens).toBeGreaterThan(o200k);
    expect(f.mock.requests.length).toBe(before);
    // An Anthropic provider that cannot be reached: the same estimate, not an error.
    const down = await client()
      .messages.countTokens({ ...request, model: 'claude-down' } as any)
      .withResponse();
    expect(down.response.headers.get('x-tollgate-token-count')).toBe('estimate');
    expect(down.data.input_tokens).toBe(data.input_tokens);
  });
});
