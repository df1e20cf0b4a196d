import { createAnthropic } from '@ai-sdk/anthropic';
import Anthropic from '@anthropic-ai/sdk';
import { generateText, streamText } from 'ai';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { setUserSpendCaps } from '../../src/limits/spend.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { applyPricing } from '../../src/models/service.ts';
import { getProject } from '../../src/projects/service.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { connectUser } from '../../src/users/service.ts';
import { type ChatFixture, chargedTotal, startChatFixture, tokenPrices } from '../helpers/chat-fixture.ts';
import { anthropicFor } from '../helpers/clients.ts';
import { api, depositFor, seedProject } from '../helpers/server.ts';

/**
 * Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) with the official
 * `@anthropic-ai/sdk` client and the AI SDK's `@ai-sdk/anthropic` provider against a real Tollgate
 * server: natively to a provider of kind `anthropic` (the loopback mock speaking Messages), and
 * translated to an OpenAI-compatible provider (the same mock's Chat Completions). Each served call is
 * charged exactly from the provider's usage, nothing stays held; refusals are ordinary messages.
 */
let f: ChatFixture;
const ROOT = 'root-admin-token-messages-0123456789';
let claude: Anthropic;

const { price, perToken } = tokenPrices('3', '15', '0.3');
/** One served turn of the mock: 12 input tokens, 5 output tokens (' hello' × 5). */
const TURN = tokenCost(price, 12, 5);
const TEXT = ' hello'.repeat(5);
/** The cache model's turn: 20 input tokens (6 read from the cache, 4 written to it at 1.25×), 5 output. */
const CACHED_TURN = tokenCost({ ...price, cacheWritePerMillion: new Money('3.75') }, 20, 5, 6, {
  write: 4,
  write1h: 0,
});
const connectLink = /http:\/\/\S+\/connect\/[A-Za-z0-9_.-]+/;
const topupLink = /http:\/\/\S+\/topup\/[A-Za-z0-9_.-]+/;
const weather = { name: 'get_weather', arguments: '{"city":"Paris"}' };
const weatherTool = {
  name: 'get_weather',
  description: 'The weather of a city',
  input_schema: { type: 'object' as const, properties: { city: { type: 'string' } }, required: ['city'] },
};
/** A 1×1 PNG. */
const PNG =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';

function clientFor(user: string, extra: Record<string, string> = {}): Anthropic {
  return new Anthropic({
    baseURL: f.server.url,
    apiKey: f.apiKey,
    maxRetries: 0,
    timeout: 20_000,
    defaultHeaders: { 'X-Service-User': user, ...extra },
  });
}

async function expectCharged(user: string, amount: string): Promise<void> {
  await f.settled();
  const entries = await f.ledger(user);
  expect(chargedTotal(entries, 'messages')).toBe(new Money(amount).toFixed());
  const open = (await f.holds(user)).filter((h) => h.status === 'open');
  expect(open).toEqual([]);
}

const times = (amount: string, n: number) => new Money(amount).times(n).toFixed();

beforeAll(async () => {
  f = await startChatFixture({
    env: { TOLLGATE_ADMIN_TOKEN: ROOT },
    models: [
      // Native: the project's provider `anthropic` (kind anthropic) is the same mock, speaking Messages.
      {
        id: 'claude-test',
        pricing: perToken,
        routes: [{ provider: 'anthropic', model: 'mock-claude' }],
      },
      { id: 'claude-tools', pricing: perToken, routes: [{ provider: 'anthropic', model: 'mock-tools' }] },
      { id: 'claude-cache', pricing: perToken, routes: [{ provider: 'anthropic', model: 'mock-cache' }] },
      { id: 'claude-trunc', pricing: perToken, routes: [{ provider: 'anthropic', model: 'mock-trunc' }] },
      // Translated: the provider `default` is OpenAI-compatible (the mock's Chat Completions).
      { id: 'gpt-test', upstreamModel: 'mock-model', pricing: perToken },
      { id: 'gpt-tools', upstreamModel: 'mock-tools', pricing: perToken },
    ],
  });
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'anthropic',
    baseUrl: f.mock.baseUrl,
    kind: 'anthropic',
    key: 'sk-ant-mock-key',
  });
  await f.ctx.projects.changed(f.project.id);
  f.mock.behaviors.set('mock-tools', { toolCalls: [weather] });
  f.mock.behaviors.set('mock-trunc', { truncateAfterChunks: 2 });
  f.mock.behaviors.set('mock-cache', { promptTokens: 10, cacheWriteTokens: 4, cachedTokens: 6 });
  claude = new Anthropic({ baseURL: f.server.url, apiKey: f.apiKey, maxRetries: 0, timeout: 20_000 });
});
afterAll(() => f.close());

describe('POST /v1/messages to an Anthropic provider (native)', () => {
  it('messages.create: forwarded with the provider key and the client headers, charged from usage', async () => {
    await f.fund('m-create', '1.00');
    const before = f.mock.requests.length;
    const message = await clientFor('m-create', { 'anthropic-beta': 'tools-2024-05-16' }).messages.create({
      model: 'claude-test',
      max_tokens: 100,
      system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: 'Hello' }],
      stop_sequences: ['END'],
      // Older fields the SDK no longer types, still part of the API.
      ...({ temperature: 0.2, top_k: 5 } as object),
    });
    expect(message.type).toBe('message');
    expect(message.content).toEqual([{ type: 'text', text: TEXT }]);
    expect(message.stop_reason).toBe('end_turn');
    expect(message.usage.input_tokens).toBe(12);
    const sent = f.mock.requests.slice(before).at(-1)!;
    expect(sent.headers['x-api-key']).toBe('sk-ant-mock-key');
    expect(sent.headers.authorization).toBeUndefined();
    // The client's own version goes along (the SDK's), its beta header too.
    expect(sent.headers['anthropic-version']).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(sent.headers['anthropic-beta']).toBe('tools-2024-05-16');
    expect(sent.body).toMatchObject({
      model: 'mock-claude',
      max_tokens: 100,
      top_k: 5,
      stop_sequences: ['END'],
      system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    });
    // A client that sends no version (curl): the provider gets 2023-06-01.
    const res = await fetch(`${f.server.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': f.apiKey, 'x-service-user': 'm-create' },
      body: JSON.stringify({
        model: 'claude-test',
        max_tokens: 100,
        messages: [{ role: 'user', content: 'Hi' }],
      }),
    });
    expect(res.status).toBe(200);
    expect(f.mock.requests.at(-1)!.headers['anthropic-version']).toBe('2023-06-01');
    await expectCharged('m-create', times(TURN, 2));
  });

  it('messages.stream with its helpers: the events pass through, charged from message_start + message_delta', async () => {
    await f.fund('m-stream', '1.00');
    const stream = clientFor('m-stream').messages.stream({
      model: 'claude-test',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    let streamed = '';
    stream.on('text', (text) => {
      streamed += text;
    });
    const final = await stream.finalMessage();
    expect(streamed).toBe(TEXT);
    expect(final.content).toEqual(
      [{ type: 'text', text: TEXT, citations: undefined }].map(({ type, text }) =>
        expect.objectContaining({ type, text }),
      ),
    );
    expect(final.stop_reason).toBe('end_turn');
    expect(final.usage.output_tokens).toBe(5);
    await expectCharged('m-stream', TURN);
  });

  it('cache writes are priced at 1.25× input (a Claude model), cache reads as cached input', async () => {
    await f.fund('m-cache', '1.00');
    const message = await clientFor('m-cache').messages.create({
      model: 'claude-cache',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(message.usage.cache_read_input_tokens).toBe(6);
    // 10 + 4 (cache write) + 6 (cache read) input tokens, 6 of them cached, 4 written.
    await expectCharged('m-cache', CACHED_TURN);
  });

  it('a two-turn tool use conversation with an image block, streaming and not', async () => {
    await f.fund('m-tools', '1.00');
    const client = clientFor('m-tools');
    const first = await client.messages.create({
      model: 'claude-tools',
      max_tokens: 100,
      tools: [weatherTool],
      tool_choice: { type: 'auto' },
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Weather where this was taken?' },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } },
          ],
        },
      ],
    });
    expect(first.stop_reason).toBe('tool_use');
    const use = first.content[0]!;
    expect(use).toMatchObject({ type: 'tool_use', name: 'get_weather', input: { city: 'Paris' } });
    const stream = client.messages.stream({
      model: 'claude-tools',
      max_tokens: 100,
      tools: [weatherTool],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: first.content },
        {
          role: 'user',
          content: [{ type: 'tool_result', tool_use_id: (use as { id: string }).id, content: '18°C' }],
        },
      ],
    });
    const second = await stream.finalMessage();
    expect(second.content.map((b) => (b.type === 'text' ? b.text : b.type)).join('')).toBe(TEXT);
    // The first turn produced the 16-character JSON as 5 output tokens (the mock's count).
    await expectCharged('m-tools', times(TURN, 2));
  });

  it('the AI SDK Anthropic provider (generateText, streamText)', async () => {
    await f.fund('m-aisdk', '1.00');
    const anthropic = createAnthropic({
      baseURL: `${f.server.url}/v1`,
      apiKey: f.apiKey,
      headers: { 'X-Service-User': 'm-aisdk' },
    });
    const generated = await generateText({
      model: anthropic('claude-test'),
      prompt: 'Hello',
      maxOutputTokens: 100,
    });
    expect(generated.text).toBe(TEXT);
    expect(generated.usage.outputTokens).toBe(5);
    const streamed = streamText({ model: anthropic('claude-test'), prompt: 'Hello', maxOutputTokens: 100 });
    expect(await streamed.text).toBe(TEXT);
    await expectCharged('m-aisdk', times(TURN, 2));
  });

  it('the end user comes from metadata.user_id, or from X-Service-User, which wins when both are given', async () => {
    await f.fund('m-meta', '1.00');
    await f.fund('m-header', '1.00');
    await claude.messages.create({
      model: 'claude-test',
      max_tokens: 100,
      metadata: { user_id: 'm-meta' },
      messages: [{ role: 'user', content: 'Hello' }],
    });
    // Claude Code sends its own per-session metadata.user_id; the header names the developer's user.
    await clientFor('m-header').messages.create({
      model: 'claude-test',
      max_tokens: 100,
      metadata: { user_id: 'user_abc_account__session_123' },
      messages: [{ role: 'user', content: 'Hello' }],
    });
    await expectCharged('m-meta', TURN);
    await expectCharged('m-header', TURN);
  });
});

describe('POST /v1/messages to an OpenAI-compatible provider (translated)', () => {
  it('messages.create: sent as Chat Completions, answered as a message, charged from the chat usage', async () => {
    await f.fund('t-create', '1.00');
    const before = f.mock.requests.length;
    const message = await clientFor('t-create').messages.create({
      model: 'gpt-test',
      max_tokens: 100,
      system: 'Be brief.',
      stop_sequences: ['END'],
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } },
          ],
        },
      ],
    });
    expect(message.content).toEqual([{ type: 'text', text: TEXT }]);
    expect(message.stop_reason).toBe('end_turn');
    expect(message.usage).toMatchObject({ input_tokens: 12, output_tokens: 5 });
    const sent = f.mock.requests.slice(before).at(-1)!;
    expect(sent.headers.authorization).toBe('Bearer sk-mock-provider-key');
    expect(sent.headers['anthropic-version']).toBeUndefined();
    expect(sent.body).toMatchObject({
      model: 'mock-model',
      max_tokens: 100,
      stop: ['END'],
      messages: [
        { role: 'system', content: 'Be brief.' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG}` } },
          ],
        },
      ],
    });
    await expectCharged('t-create', TURN);
  });

  it('messages.stream: chat chunks become Anthropic events, usage included', async () => {
    await f.fund('t-stream', '1.00');
    const stream = clientFor('t-stream').messages.stream({
      model: 'gpt-test',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    const events: string[] = [];
    stream.on('streamEvent', (event) => events.push(event.type));
    const final = await stream.finalMessage();
    expect(final.content.map((b) => (b.type === 'text' ? b.text : '')).join('')).toBe(TEXT);
    expect(final.usage).toMatchObject({ input_tokens: 12, output_tokens: 5 });
    expect(events[0]).toBe('message_start');
    expect(events.slice(-3)).toEqual(['content_block_stop', 'message_delta', 'message_stop']);
    await expectCharged('t-stream', TURN);
  });

  it('a two-turn tool use conversation: tool_calls ⇄ tool_use, tool_result → a tool message', async () => {
    await f.fund('t-tools', '1.00');
    const client = clientFor('t-tools');
    const stream = client.messages.stream({
      model: 'gpt-tools',
      max_tokens: 100,
      tools: [weatherTool],
      tool_choice: { type: 'any' },
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    });
    const first = await stream.finalMessage();
    expect(first.stop_reason).toBe('tool_use');
    expect(first.content).toEqual([
      expect.objectContaining({
        type: 'tool_use',
        id: 'call_0',
        name: 'get_weather',
        input: { city: 'Paris' },
      }),
    ]);
    const before = f.mock.requests.length;
    const second = await client.messages.create({
      model: 'gpt-tools',
      max_tokens: 100,
      tools: [weatherTool],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_0', content: '18°C' }] },
      ],
    });
    expect(second.content).toEqual([{ type: 'text', text: TEXT }]);
    const sent = f.mock.requests.slice(before).at(-1)!.body;
    expect(sent.tools).toEqual([
      {
        type: 'function',
        function: {
          name: 'get_weather',
          description: 'The weather of a city',
          parameters: weatherTool.input_schema,
        },
      },
    ]);
    expect(sent.messages.slice(1)).toEqual([
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          {
            id: 'call_0',
            type: 'function',
            function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
          },
        ],
      },
      { role: 'tool', tool_call_id: 'call_0', content: '18°C' },
    ]);
    await expectCharged('t-tools', times(TURN, 2));
  });

  it('a field Chat Completions cannot carry is a 400 naming it, and nothing is charged', async () => {
    await f.fund('t-refused', '1.00');
    const err = await clientFor('t-refused')
      .messages.create({
        model: 'gpt-test',
        max_tokens: 100,
        ...({ top_k: 5 } as object),
        messages: [{ role: 'user', content: 'Hello' }],
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect((err as InstanceType<typeof Anthropic.BadRequestError>).error).toMatchObject({
      type: 'error',
      error: { type: 'invalid_request_error', message: expect.stringContaining("'top_k'") },
    });
    await expectCharged('t-refused', '0');
  });
});

describe('Chat Completions to an Anthropic provider (translated)', () => {
  async function expectChatCharged(user: string, amount: string): Promise<void> {
    await f.settled();
    expect(chargedTotal(await f.ledger(user), 'chat')).toBe(new Money(amount).toFixed());
    expect((await f.holds(user)).filter((h) => h.status === 'open')).toEqual([]);
  }

  it('the openai client: sent as a Messages request, answered as a completion, charged from Anthropic usage', async () => {
    await f.fund('c-create', '1.00');
    const before = f.mock.requests.length;
    const completion = await f.client.chat.completions.create({
      model: 'claude-test',
      user: 'c-create',
      max_tokens: 100,
      stop: 'END',
      messages: [
        { role: 'system', content: 'Be brief.' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG}` } },
          ],
        },
      ],
    });
    expect(completion.choices[0]!.message.content).toBe(TEXT);
    expect(completion.choices[0]!.finish_reason).toBe('stop');
    expect(completion.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 5 });
    const sent = f.mock.requests.slice(before).at(-1)!;
    expect(sent.headers['x-api-key']).toBe('sk-ant-mock-key');
    expect(sent.body).toEqual({
      model: 'mock-claude',
      max_tokens: 100,
      system: 'Be brief.',
      stop_sequences: ['END'],
      metadata: { user_id: 'c-create' },
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } },
          ],
        },
      ],
    });
    await expectChatCharged('c-create', TURN);
  });

  it('streaming with usage, cache reads priced as cached input, cache writes as writes', async () => {
    await f.fund('c-stream', '1.00');
    const stream = await f.client.chat.completions.create({
      model: 'claude-cache',
      user: 'c-stream',
      max_tokens: 100,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'Hello' }],
    });
    let text = '';
    let usage: unknown;
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(TEXT);
    expect(finish).toBe('stop');
    expect(usage).toMatchObject({
      prompt_tokens: 20,
      completion_tokens: 5,
      prompt_tokens_details: { cached_tokens: 6 },
    });
    await expectChatCharged('c-stream', CACHED_TURN);
  });

  it('a two-turn tool conversation: tool_use ⇄ tool_calls, tool messages → tool_result', async () => {
    await f.fund('c-tools', '1.00');
    const tools = [
      {
        type: 'function' as const,
        function: {
          name: 'get_weather',
          description: 'The weather of a city',
          parameters: weatherTool.input_schema,
        },
      },
    ];
    const stream = f.client.chat.completions.stream({
      model: 'claude-tools',
      user: 'c-tools',
      max_tokens: 100,
      tools,
      tool_choice: 'required',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    });
    const first = await stream.finalChatCompletion();
    const call = first.choices[0]!.message.tool_calls![0]!;
    expect(first.choices[0]!.finish_reason).toBe('tool_calls');
    expect(call).toMatchObject({
      id: 'toolu_mock0',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
    });
    const before = f.mock.requests.length;
    const second = await f.client.chat.completions.create({
      model: 'claude-tools',
      user: 'c-tools',
      max_tokens: 100,
      tools,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        first.choices[0]!.message,
        { role: 'tool', tool_call_id: call.id, content: '18°C' },
      ],
    });
    expect(second.choices[0]!.message.content).toBe(TEXT);
    const sent = f.mock.requests.slice(before).at(-1)!.body;
    expect(sent.tools).toEqual([weatherTool]);
    expect(sent.messages.slice(1)).toEqual([
      {
        role: 'assistant',
        content: [{ type: 'tool_use', id: 'toolu_mock0', name: 'get_weather', input: { city: 'Paris' } }],
      },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_mock0', content: '18°C' }] },
    ]);
    await expectChatCharged('c-tools', times(TURN, 2));
  });

  it('what cannot be carried is a 400 naming the field; the Responses API is refused', async () => {
    await f.fund('c-refused', '1.00');
    const err = await f.client.chat.completions
      .create({ model: 'claude-test', user: 'c-refused', n: 2, messages: [{ role: 'user', content: 'Hi' }] })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ status: 400, param: 'n', code: 'untranslatable_field' });
    const responses = await f.client.responses
      .create({ model: 'claude-test', user: 'c-refused', input: 'Hi' })
      .catch((e: unknown) => e);
    expect(responses).toMatchObject({ status: 400, code: 'unsupported_endpoint' });
    await expectChatCharged('c-refused', '0');
  });
});

describe('the paywall in Anthropic shape', () => {
  it('a user who is not connected gets a message with the connect link (create and stream, with tools)', async () => {
    const client = clientFor('p-new');
    const message = await client.messages.create({
      model: 'claude-test',
      max_tokens: 100,
      tools: [weatherTool],
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(message.role).toBe('assistant');
    expect(message.stop_reason).toBe('end_turn');
    expect(message.content).toHaveLength(1);
    expect(message.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(connectLink) });
    const stream = client.messages.stream({
      model: 'gpt-test',
      max_tokens: 100,
      tools: [weatherTool],
      messages: [{ role: 'user', content: 'Hello' }],
    });
    const events: string[] = [];
    stream.on('streamEvent', (event) => events.push(event.type));
    const final = await stream.finalMessage();
    expect(final.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(connectLink) });
    expect(events).toEqual([
      'message_start',
      'content_block_start',
      'content_block_delta',
      'content_block_stop',
      'message_delta',
      'message_stop',
    ]);
  });

  it('a connected user who cannot pay gets the top-up link; the AI SDK shows it as text', async () => {
    await f.fund('p-broke');
    const message = await clientFor('p-broke').messages.create({
      model: 'claude-test',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(message.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(topupLink) });
    const anthropic = createAnthropic({
      baseURL: `${f.server.url}/v1`,
      apiKey: f.apiKey,
      headers: { 'X-Service-User': 'p-broke' },
    });
    const streamed = streamText({ model: anthropic('claude-test'), prompt: 'Hello', maxOutputTokens: 100 });
    expect(await streamed.text).toMatch(topupLink);
    await expectCharged('p-broke', '0');
  });
});

describe('spend caps, stream failures and the model list', () => {
  it('a user at a spend cap gets the cap message as an Anthropic message', async () => {
    await f.fund('p-capped', '1.00');
    await setUserSpendCaps(f.ctx.db, f.project.id, 'p-capped', { daily: '0.000001' });
    await f.ctx.projects.changed(f.project.id);
    const message = await clientFor('p-capped').messages.create({
      model: 'claude-test',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(message.stop_reason).toBe('end_turn');
    expect(message.content[0]).toMatchObject({ type: 'text', text: expect.stringContaining('limit') });
    await expectCharged('p-capped', '0');
  });

  it('a provider stream that breaks off ends with an Anthropic error event, charged for what reached the client', async () => {
    await f.fund('s-broken', '1.00');
    const stream = clientFor('s-broken').messages.stream({
      model: 'claude-trunc',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    const err = await stream.finalMessage().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toMatch(/ended the stream/);
    // the input the provider reported in message_start (the mock's 12), and Tollgate's count of the 2
    // pieces forwarded (the final output count never came)
    const input = 12;
    await expectCharged(
      's-broken',
      tokenCost(
        {
          inputPerMillion: new Money(perToken.inputPerMillion),
          outputPerMillion: new Money(perToken.outputPerMillion),
        },
        input,
        2,
      ),
    );
  });

  it("GET /v1/models answers Anthropic's list shape to Anthropic's clients", async () => {
    const page = await claude.models.list();
    const ids = page.data.map((m) => m.id);
    expect(ids).toContain('claude-test');
    expect(page.data[0]).toMatchObject({ type: 'model', display_name: expect.any(String) });
    const one = await claude.models.retrieve('gpt-test');
    expect(one).toMatchObject({ type: 'model', id: 'gpt-test' });
  });
});

describe('an Anthropic provider connected over the admin API', () => {
  it('is checked live with x-api-key, stored with its kind, and serves the project', async () => {
    const seeded = await seedProject(f.ctx);
    const path = `/admin/v1/projects/${seeded.projectId}/provider`;
    const connected = await api(f.server, ROOT, 'PUT', path, {
      baseUrl: f.mock.baseUrl,
      apiKey: 'sk-ant-admin',
      kind: 'anthropic',
    });
    expect(connected.status, JSON.stringify(connected.body)).toBe(200);
    expect(connected.body).toMatchObject({ kind: 'anthropic', models: ['mock-model'] });
    const checked = f.mock.requests.length;
    await applyPricing(f.ctx.db, seeded.projectId, {
      currency: 'usd',
      models: [{ id: 'claude', upstreamModel: 'mock-claude', pricing: perToken }],
    });
    await f.ctx.projects.changed(seeded.projectId);
    const client = anthropicFor(f.server.url, seeded.apiKey, 'admin-user');
    const project = await getProject(f.ctx.db, seeded.projectId);
    const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
    await connectUser(f.ctx.db, f.ctx.events, project, 'admin-user', trigger);
    await depositFor(f.ctx, project, 'admin-user', '1.00', trigger);
    const message = await client.messages.create({
      model: 'claude',
      max_tokens: 10,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    expect(message.content).toEqual([{ type: 'text', text: ' hello'.repeat(5) }]);
    const sent = f.mock.requests.slice(checked).at(-1)!;
    expect(sent.headers['x-api-key']).toBe('sk-ant-admin');
    expect(sent.body.model).toBe('mock-claude');
    const bad = await api(f.server, ROOT, 'PUT', path, { baseUrl: f.mock.baseUrl, kind: 'gemini' });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ param: 'kind' });
  });
});

describe('count_tokens, authentication and errors', () => {
  it('messages.countTokens answers an estimate of the input tokens (a model not served by Anthropic)', async () => {
    const counted = await claude.messages.countTokens({
      model: 'gpt-test',
      system: 'Be brief.',
      messages: [{ role: 'user', content: 'Hello there, how are you today?' }],
      tools: [weatherTool],
    });
    expect(counted.input_tokens).toBeGreaterThan(10);
    expect(counted.input_tokens).toBeLessThan(200);
  });

  it('x-api-key and Bearer both authenticate; a wrong key is a 401 in Anthropic shape', async () => {
    await f.fund('a-bearer', '1.00');
    const bearer = anthropicFor(f.server.url, f.apiKey, 'a-bearer', true);
    const message = await bearer.messages.create({
      model: 'claude-test',
      max_tokens: 10,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(message.content[0]).toMatchObject({ type: 'text' });
    const wrong = new Anthropic({ baseURL: f.server.url, apiKey: 'tg_wrong', maxRetries: 0 });
    const err = await wrong.messages
      .create({ model: 'claude-test', max_tokens: 10, messages: [{ role: 'user', content: 'Hi' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.AuthenticationError);
    const res = await fetch(`${f.server.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'tg_wrong' },
      body: JSON.stringify({ model: 'claude-test', max_tokens: 10, messages: [] }),
    });
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({
      type: 'error',
      error: { type: 'authentication_error', message: expect.any(String), code: 'invalid_api_key' },
    });
  });

  it('invalid requests and unknown models are 400/404 in Anthropic shape', async () => {
    const post = (body: unknown) =>
      fetch(`${f.server.url}/v1/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': f.apiKey, 'x-service-user': 'e-user' },
        body: JSON.stringify(body),
      });
    const missing = await post({ model: 'claude-test', messages: [{ role: 'user', content: 'Hi' }] });
    expect(missing.status).toBe(400);
    expect(await missing.json()).toMatchObject({
      type: 'error',
      error: { type: 'invalid_request_error', message: expect.stringContaining('max_tokens') },
    });
    const badBlock = await post({
      model: 'claude-test',
      max_tokens: 10,
      messages: [{ role: 'user', content: [{ type: 'tool_result' }] }],
    });
    expect(badBlock.status).toBe(400);
    const bad = (await badBlock.json()) as { error: { message: string } };
    expect(bad.error.message).toContain('messages.0.content.0.tool_use_id');
    const unknown = await post({
      model: 'nope',
      max_tokens: 10,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });
  });
});

describe('bad input on /v1/messages', () => {
  it('is never a 500: a 4xx in Anthropic shape (or a served answer), nothing left held', async () => {
    await f.fund('fuzz-user', '1.00');
    const block = fc.oneof(
      fc.record({
        type: fc.constantFrom('text', 'image', 'tool_use', 'tool_result', 'document', 'thinking', 'x'),
      }),
      fc.record({ type: fc.constant('text'), text: fc.oneof(fc.string(), fc.integer()) }),
      fc.anything(),
    );
    const body = fc.record(
      {
        model: fc.oneof(fc.constant('claude-test'), fc.constant('gpt-test'), fc.string(), fc.integer()),
        max_tokens: fc.oneof(fc.integer({ min: -5, max: 5 }), fc.string(), fc.constant(null)),
        messages: fc.oneof(
          fc.array(
            fc.record({
              role: fc.constantFrom('user', 'assistant', 'system'),
              content: fc.oneof(fc.string(), fc.array(block, { maxLength: 3 })),
            }),
            {
              maxLength: 3,
            },
          ),
          fc.anything(),
        ),
        system: fc.oneof(fc.string(), fc.array(block, { maxLength: 2 }), fc.integer()),
        tools: fc.oneof(fc.array(fc.record({ name: fc.string() }), { maxLength: 2 }), fc.string()),
        tool_choice: fc.oneof(
          fc.record({ type: fc.constantFrom('auto', 'any', 'tool', 'nope') }),
          fc.string(),
        ),
        stream: fc.oneof(fc.boolean(), fc.string()),
        temperature: fc.oneof(fc.double({ min: -2, max: 3, noNaN: true }), fc.string()),
      },
      { requiredKeys: [] },
    );
    await fc.assert(
      fc.asyncProperty(body, async (sent) => {
        const res = await fetch(`${f.server.url}/v1/messages`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            'x-api-key': f.apiKey,
            'x-service-user': 'fuzz-user',
          },
          body: JSON.stringify(sent),
        });
        const text = await res.text();
        expect(res.status, text).toBeLessThan(500);
        if (res.status >= 400) {
          expect(JSON.parse(text)).toMatchObject({
            type: 'error',
            error: { type: expect.any(String), message: expect.any(String) },
          });
        }
      }),
      { numRuns: 60 },
    );
    await f.settled();
    const open = (await f.holds('fuzz-user')).filter((h) => h.status === 'open');
    expect(open).toEqual([]);
  });
});
