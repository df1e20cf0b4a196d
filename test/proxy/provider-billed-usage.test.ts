import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { countMessagesInput } from '../../src/messages/api.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { messagesToChat } from '../../src/upstream/anthropic/messages-over-chat.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';
import { json, type ScriptedProvider, sse, startScripted } from '../helpers/scripted-provider.ts';
import { api } from '../helpers/server.ts';

/**
 * Everything the provider bills is charged: a loopback provider whose reported usage each test writes
 * (chat, Responses and Anthropic's Messages shapes, streamed or not, broken off where the test says),
 * the official `openai` and `@anthropic-ai/sdk` clients against a real Tollgate, exact charges.
 */

const chatCompletion = (usage: unknown) => ({
  id: 'chatcmpl-1',
  object: 'chat.completion',
  created: 1,
  model: 'x',
  choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
  usage,
});
const chatChunk = (delta: unknown, finish: string | null = null) => ({
  id: 'chatcmpl-1',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'x',
  choices: [{ index: 0, delta, finish_reason: finish }],
});
const anthropicMessage = (usage: unknown) => ({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: 'claude-x',
  content: [{ type: 'text', text: 'ok' }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage,
});

let f: ChatFixture;
let scripted: ScriptedProvider;
const ROOT = 'root-admin-token-billed-usage-0123456789';

/** 1 000 per million in, 2 000 per million out: 10 prompt tokens are 0.01, 5 output tokens 0.01. */
const REASONING = { mode: 'per_token' as const, inputPerMillion: '1000', outputPerMillion: '2000' };
const SONNET = { mode: 'per_token' as const, inputPerMillion: '3', outputPerMillion: '15' };
/** The cache cases: 10 per million in (a million cache writes cost 10 at the input price), 110 out. */
const CACHE = { mode: 'per_token' as const, inputPerMillion: '10', outputPerMillion: '110' };

beforeAll(async () => {
  scripted = await startScripted();
  f = await startChatFixture({
    env: { TOLLGATE_ADMIN_TOKEN: ROOT },
    familyMargins: true,
    models: [
      { id: 'reasoner', pricing: REASONING, routes: [{ provider: 'scripted', model: 'reasoner' }] },
      // A Messages client on the same provider (translated to Chat Completions).
      { id: 'reasoner-messages', pricing: REASONING, routes: [{ provider: 'scripted', model: 'reasoner' }] },
      {
        id: 'reasoner-inside',
        pricing: REASONING,
        routes: [{ provider: 'scripted', model: 'reasoner-inside' }],
      },
      {
        id: 'reasoner-stream',
        pricing: REASONING,
        routes: [{ provider: 'scripted', model: 'reasoner-stream' }],
      },
      {
        id: 'reasoner-responses',
        pricing: REASONING,
        routes: [{ provider: 'scripted', model: 'reasoner-responses' }],
      },
      // Messages clients on a chat provider (translated), chat clients on an Anthropic provider.
      { id: 'translated', pricing: SONNET, routes: [{ provider: 'scripted', model: 'gpt-stalls' }] },
      {
        id: 'claude-reset',
        // (usage of a million tokens and more: a context window that takes it, so no bound applies)
        contextWindow: 2_000_000,
        pricing: SONNET,
        routes: [{ provider: 'scripted-anthropic', model: 'claude-reset' }],
      },
      {
        id: 'claude-cache',
        contextWindow: 2_000_000,
        pricing: CACHE,
        routes: [{ provider: 'scripted-anthropic', model: 'claude-cache' }],
      },
      {
        id: 'priced-cache',
        contextWindow: 2_000_000,
        pricing: { ...CACHE, cacheWritePerMillion: '11', cacheWrite1hPerMillion: '15' },
        routes: [{ provider: 'scripted-anthropic', model: 'other-cache' }],
      },
    ],
  });
  for (const [name, kind] of [
    ['scripted', 'openai-compatible'],
    ['scripted-anthropic', 'anthropic'],
  ] as const) {
    await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
      name,
      baseUrl: kind === 'anthropic' ? scripted.url : `${scripted.url}/v1`,
      kind,
      key: 'sk-scripted',
    });
  }
  await f.ctx.projects.changed(f.project.id);
});
afterAll(async () => {
  await f.close();
  await scripted.close();
});

function openaiFor(user: string): OpenAI {
  return new OpenAI({
    baseURL: `${f.server.url}/v1`,
    apiKey: f.apiKey,
    maxRetries: 0,
    timeout: 20_000,
    defaultHeaders: { 'X-Service-User': user },
  });
}

function claudeFor(user: string): Anthropic {
  return new Anthropic({
    baseURL: f.server.url,
    apiKey: f.apiKey,
    maxRetries: 0,
    timeout: 20_000,
    defaultHeaders: { 'X-Service-User': user },
  });
}

/** The user's charges from `source`, once settled; nothing stays held. */
async function charged(user: string, source: string): Promise<string> {
  await f.settled();
  const entries = await f.ledger(user);
  expect((await f.holds(user)).filter((h) => h.status === 'open')).toEqual([]);
  return chargedTotal(entries, source);
}

describe('reasoning tokens beside completion_tokens are charged as output', () => {
  it('chat: total = prompt + completion + reasoning → 505 output tokens (1.02), not 5 (0.02)', async () => {
    scripted.handlers.set('reasoner', (_b, res) =>
      json(
        res,
        chatCompletion({
          prompt_tokens: 10,
          completion_tokens: 5,
          total_tokens: 515,
          completion_tokens_details: { reasoning_tokens: 500 },
        }),
      ),
    );
    await f.fund('r-beside', '5.00');
    const answer = await openaiFor('r-beside').chat.completions.create({
      model: 'reasoner',
      max_completion_tokens: 1000,
      messages: [{ role: 'user', content: 'Think' }],
    });
    expect(answer.usage?.completion_tokens).toBe(5); // the provider's answer, untouched
    expect(await charged('r-beside', 'chat')).toBe('1.02');
  });

  it('Messages client on that chat provider: output_tokens 505, charged 1.02', async () => {
    scripted.handlers.set('reasoner', (_b, res) =>
      json(
        res,
        chatCompletion({
          prompt_tokens: 10,
          completion_tokens: 5,
          total_tokens: 515,
          completion_tokens_details: { reasoning_tokens: 500 },
        }),
      ),
    );
    await f.fund('r-messages', '5.00');
    const message = await claudeFor('r-messages').messages.create({
      model: 'reasoner-messages',
      max_tokens: 1000,
      messages: [{ role: 'user', content: 'Think' }],
    });
    expect(message.usage).toMatchObject({ input_tokens: 10, output_tokens: 505 });
    expect(await charged('r-messages', 'messages')).toBe('1.02');
  });

  it('chat: total = prompt + completion → reasoning is inside (OpenAI): 505 output tokens, 1.02 again', async () => {
    scripted.handlers.set('reasoner-inside', (_b, res) =>
      json(
        res,
        chatCompletion({
          prompt_tokens: 10,
          completion_tokens: 505,
          total_tokens: 515,
          completion_tokens_details: { reasoning_tokens: 500 },
        }),
      ),
    );
    await f.fund('r-inside', '5.00');
    await openaiFor('r-inside').chat.completions.create({
      model: 'reasoner-inside',
      max_completion_tokens: 1000,
      messages: [{ role: 'user', content: 'Think' }],
    });
    expect(await charged('r-inside', 'chat')).toBe('1.02');
  });

  it('chat stream: the usage chunk with reasoning beside is charged 1.02', async () => {
    scripted.handlers.set('reasoner-stream', (_b, res) =>
      sse(
        res,
        [
          [undefined, chatChunk({ role: 'assistant', content: 'ok' })],
          [undefined, chatChunk({}, 'stop')],
          [
            undefined,
            {
              ...chatChunk({}),
              choices: [],
              usage: {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 515,
                completion_tokens_details: { reasoning_tokens: 500 },
              },
            },
          ],
          [undefined, '[DONE]'],
        ],
        'end',
      ),
    );
    await f.fund('r-stream', '5.00');
    const stream = await openaiFor('r-stream').chat.completions.create({
      model: 'reasoner-stream',
      max_completion_tokens: 1000,
      stream: true,
      messages: [{ role: 'user', content: 'Think' }],
    });
    for await (const _ of stream) {
      // drained
    }
    expect(await charged('r-stream', 'chat')).toBe('1.02');
  });

  it('Responses: output_tokens_details.reasoning_tokens beside output_tokens is charged 1.02', async () => {
    scripted.handlers.set('reasoner-responses', (_b, res) =>
      json(res, {
        id: 'resp_1',
        object: 'response',
        created_at: 1,
        status: 'completed',
        model: 'x',
        output: [
          {
            type: 'message',
            id: 'msg_1',
            role: 'assistant',
            status: 'completed',
            content: [{ type: 'output_text', text: 'ok', annotations: [] }],
          },
        ],
        usage: {
          input_tokens: 10,
          output_tokens: 5,
          total_tokens: 515,
          output_tokens_details: { reasoning_tokens: 500 },
          input_tokens_details: { cached_tokens: 0 },
        },
      }),
    );
    await f.fund('r-responses', '5.00');
    await openaiFor('r-responses').responses.create({
      model: 'reasoner-responses',
      max_output_tokens: 1000,
      input: 'Think',
    });
    expect(await charged('r-responses', 'responses')).toBe('1.02');
  });
});

describe('translated streams', () => {
  it('Messages over chat, aborted after the first text: the prompt is charged (Tollgate counts it), not 0', async () => {
    let upstreamClosed!: Promise<void>;
    scripted.handlers.set('gpt-stalls', (_b, res) => {
      upstreamClosed = new Promise((resolve) => res.on('close', () => resolve()));
      sse(
        res,
        [
          [undefined, chatChunk({ role: 'assistant', content: '' })],
          [undefined, chatChunk({ content: ' hello' })],
        ],
        'stall',
      );
    });
    await f.fund('t-abort', '50.00');
    const prompt = 'Summarise this. '.repeat(2000);
    const body = {
      model: 'translated',
      max_tokens: 100,
      messages: [{ role: 'user' as const, content: prompt }],
    };
    const stream = claudeFor('t-abort').messages.stream(body);
    let startInput: number | undefined;
    await new Promise<void>((resolve, reject) => {
      stream.on('streamEvent', (event) => {
        if (event.type === 'message_start') startInput = event.message.usage.input_tokens;
        if (event.type === 'content_block_delta') {
          stream.abort();
          resolve();
        }
      });
      stream.on('error', reject);
      stream.on('abort', () => resolve());
    });
    await upstreamClosed; // Tollgate saw the client go and stopped the provider's stream
    // The client sees Tollgate's count of the translated prompt in message_start, not 0.
    // (an estimate: exact up to 16 KiB, the same ratio beyond)
    const translated = countPromptTokens(messagesToChat({ ...body, model: 'gpt-stalls' }) as never);
    expect(Math.abs(startInput! / translated - 1)).toBeLessThan(0.03);
    const input = countMessagesInput(body);
    expect(input).toBeGreaterThan(8000);
    const expected = tokenCost(
      { inputPerMillion: new Money('3'), outputPerMillion: new Money('15') },
      input,
      1, // ' hello', the one output token that reached the client
    );
    expect(await charged('t-abort', 'messages')).toBe(expected);
  });

  it('chat over Anthropic, reset after message_delta: charged from message_start and message_delta usage', async () => {
    scripted.handlers.set('claude-reset', (_b, res) =>
      sse(
        res,
        [
          [
            'message_start',
            {
              type: 'message_start',
              message: { ...anthropicMessage({ input_tokens: 900_000, output_tokens: 1 }), content: [] },
            },
          ],
          [
            'content_block_start',
            { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
          ],
          [
            'content_block_delta',
            { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: ' hello' } },
          ],
          ['content_block_stop', { type: 'content_block_stop', index: 0 }],
          [
            'message_delta',
            { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 1000 } },
          ],
        ],
        'reset',
      ),
    );
    await f.fund('c-reset', '50.00');
    const stream = await openaiFor('c-reset').chat.completions.create({
      model: 'claude-reset',
      max_tokens: 2000,
      stream: true,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    await expect(
      (async () => {
        for await (const _ of stream) {
          // drained until the break
        }
      })(),
    ).rejects.toThrow();
    // 900 000 × 3 / 1e6 + 1 000 × 15 / 1e6 = 2.7 + 0.015
    expect(await charged('c-reset', 'chat')).toBe('2.715');
  });
});

describe('cache writes at their own prices', () => {
  const usage = (creation: unknown) => ({
    input_tokens: 200_000,
    cache_creation_input_tokens: 1_000_000,
    cache_read_input_tokens: 0,
    output_tokens: 1000,
    ...(creation ? { cache_creation: creation } : {}),
  });

  it('Messages on a Claude model: 5-minute writes at 1.25× input (14.61), 1-hour writes at 2× (22.11)', async () => {
    await f.fund('cache-5m', '50.00');
    scripted.handlers.set('claude-cache', (_b, res) =>
      json(
        res,
        anthropicMessage(usage({ ephemeral_5m_input_tokens: 1_000_000, ephemeral_1h_input_tokens: 0 })),
      ),
    );
    const client = claudeFor('cache-5m');
    const request = {
      model: 'claude-cache',
      max_tokens: 1000,
      messages: [{ role: 'user' as const, content: 'Hi' }],
    };
    await client.messages.create(request);
    // 200 000 × 10 / 1e6 + 1 000 000 × 12.5 / 1e6 + 1 000 × 110 / 1e6
    expect(await charged('cache-5m', 'messages')).toBe('14.61');

    await f.fund('cache-1h', '50.00');
    scripted.handlers.set('claude-cache', (_b, res) =>
      json(
        res,
        anthropicMessage(usage({ ephemeral_5m_input_tokens: 0, ephemeral_1h_input_tokens: 1_000_000 })),
      ),
    );
    await claudeFor('cache-1h').messages.create(request);
    expect(await charged('cache-1h', 'messages')).toBe('22.11');

    // Without the split (older API versions), every write is a 5-minute one.
    await f.fund('cache-plain', '50.00');
    scripted.handlers.set('claude-cache', (_b, res) => json(res, anthropicMessage(usage(undefined))));
    await claudeFor('cache-plain').messages.create(request);
    expect(await charged('cache-plain', 'messages')).toBe('14.61');
  });

  it('a request asking for cache writes is held at the write price: 1-hour writes at 2× the input price', async () => {
    scripted.handlers.set('claude-cache', (_b, res) =>
      json(res, anthropicMessage({ input_tokens: 10, output_tokens: 1 })),
    );
    const text = 'cache me '.repeat(10_000);
    const ask = (control?: { type: 'ephemeral'; ttl?: '1h' | '5m' }) => ({
      model: 'claude-cache',
      max_tokens: 10,
      messages: [
        { role: 'user' as const, content: [{ type: 'text' as const, text, cache_control: control }] },
      ],
    });
    // The worst case of the prompt at the input price (10 per million), and at twice it.
    const plain = Math.ceil(countMessagesInput(ask()) * 1.3) * 10;
    const wallet = new Money(plain).times(1.5).div(1_000_000).toFixed(6);
    const send = async (user: string, control?: { type: 'ephemeral'; ttl?: '1h' | '5m' }) => {
      await f.fund(user, wallet);
      const res = await fetch(`${f.server.url}/v1/messages`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${f.apiKey}`,
          'content-type': 'application/json',
          'x-service-user': user,
          'anthropic-version': '2023-06-01',
        },
        body: JSON.stringify(ask(control)),
      });
      await res.arrayBuffer();
      return res.headers.get('x-tollgate-paywall');
    };
    expect(await send('hold-plain')).toBeNull();
    expect(await send('hold-5m', { type: 'ephemeral' })).toBeNull(); // 1.25× fits in 1.5×
    expect(await send('hold-1h', { type: 'ephemeral', ttl: '1h' })).not.toBeNull(); // 2× does not
  });

  it('streamed Messages and chat clients on the Anthropic provider are charged the same', async () => {
    const events: Array<[string, unknown]> = [
      [
        'message_start',
        {
          type: 'message_start',
          message: {
            ...anthropicMessage({
              ...usage({ ephemeral_5m_input_tokens: 400_000, ephemeral_1h_input_tokens: 600_000 }),
              output_tokens: 1,
            }),
            content: [],
          },
        },
      ],
      [
        'content_block_start',
        { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
      ],
      [
        'content_block_delta',
        { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'ok' } },
      ],
      ['content_block_stop', { type: 'content_block_stop', index: 0 }],
      [
        'message_delta',
        { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 1000 } },
      ],
      ['message_stop', { type: 'message_stop' }],
    ];
    scripted.handlers.set('claude-cache', (_b, res) => sse(res, events, 'end'));
    // 2 + 400 000 × 12.5 / 1e6 + 600 000 × 20 / 1e6 + 0.11 = 2 + 5 + 12 + 0.11
    await f.fund('cache-stream', '50.00');
    const stream = claudeFor('cache-stream').messages.stream({
      model: 'claude-cache',
      max_tokens: 2000,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    await stream.finalMessage();
    expect(await charged('cache-stream', 'messages')).toBe('19.11');

    await f.fund('cache-chat', '50.00');
    const chat = await openaiFor('cache-chat').chat.completions.create({
      model: 'claude-cache',
      max_tokens: 2000,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'Hi' }],
    });
    let last: any;
    for await (const chunk of chat) last = chunk;
    expect(last.usage).toMatchObject({ prompt_tokens: 1_200_000, cache_creation_input_tokens: 1_000_000 });
    expect(await charged('cache-chat', 'chat')).toBe('19.11');
  });

  it('prices set in the pricing file win over the defaults (any model name)', async () => {
    scripted.handlers.set('other-cache', (_b, res) =>
      json(
        res,
        anthropicMessage(usage({ ephemeral_5m_input_tokens: 500_000, ephemeral_1h_input_tokens: 500_000 })),
      ),
    );
    await f.fund('cache-priced', '50.00');
    await claudeFor('cache-priced').messages.create({
      model: 'priced-cache',
      max_tokens: 1000,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    // 2 + 500 000 × 11 / 1e6 + 500 000 × 15 / 1e6 + 0.11
    expect(await charged('cache-priced', 'messages')).toBe('15.11');
    const entry = (await f.ctx.db
      .selectFrom('ledger_entries')
      .select(['metadata', 'description'])
      .where('source', '=', 'messages')
      .where('kind', '=', 'charge')
      .orderBy('id', 'desc')
      .executeTakeFirstOrThrow()) as { metadata: any; description: string };
    expect(entry.metadata).toMatchObject({ cacheWriteTokens: 1_000_000, cacheWrite1hTokens: 500_000 });
    expect(entry.description).toContain('1000000 written to the cache, 500000 for 1 h');
  });

  it('the admin API lists and takes the cache write prices; a bad one is a 400 naming the field', async () => {
    const path = `/admin/v1/projects/${f.project.id}/models`;
    const listed = await api(f.server, ROOT, 'GET', path);
    const priced = listed.body.models.find((m: any) => m.id === 'priced-cache');
    expect(priced.pricing).toMatchObject({ cacheWritePerMillion: '11', cacheWrite1hPerMillion: '15' });
    const bad = await api(f.server, ROOT, 'PUT', path, {
      ...listed.body,
      models: [{ id: 'x', pricing: { ...CACHE, cacheWritePerMillion: '-1' } }],
    });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toContain('cacheWritePerMillion');
  });
});
