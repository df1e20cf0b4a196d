import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chatRequestSchema } from '../../src/chat/schema.ts';
import { Money } from '../../src/core/money.ts';
import { embeddingsRequestSchema } from '../../src/embeddings/schema.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { responsesRequestSchema } from '../../src/responses/schema.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';
import { countEmbeddingInput, countPromptTokens, countResponsesInput } from '../../src/tokens/inputs.ts';
import {
  type ChatFixture,
  chargedTotal,
  embeddingModel,
  ledgerEntriesOf,
  perRequestModel,
  startChatFixture,
  tokenPrices,
} from '../helpers/chat-fixture.ts';

/**
 * "Point any OpenAI client at Tollgate": the official `openai` client against a mock provider that speaks
 * Chat Completions (tool calls, images, the developer role, json_schema, n), Responses and Embeddings —
 * each call charged exactly from the provider's usage, and each refused user answered in its API's shape.
 */
let f: ChatFixture;

const IN = '0.15';
const OUT = '0.6';
const CACHED_IN = '0.075';
const { price, perToken } = tokenPrices(IN, OUT, CACHED_IN);
const weatherTool: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const weatherCall = { name: 'get_weather', arguments: '{"city":"Paris","unit":"celsius"}' };

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'metered', upstreamModel: 'mock-model', pricing: perToken },
      { id: 'tools', upstreamModel: 'mock-tools', pricing: perToken },
      { id: 'runaway', upstreamModel: 'mock-runaway', pricing: perToken },
      { id: 'cached', upstreamModel: 'mock-cached', pricing: perToken },
      embeddingModel('embed', 'mock-embed'),
      { id: 'no-responses', upstreamModel: 'mock-no-responses', pricing: perToken },
      { id: 'silent', upstreamModel: 'mock-silent', pricing: perToken },
      embeddingModel('silent-embed', 'mock-silent'),
      { id: 'long', upstreamModel: 'mock-long', pricing: perToken },
      perRequestModel('flat', '0.01'),
    ],
    settings: { maxCompletionTokens: 100 },
  });
  f.mock.behaviors.set('mock-tools', { toolCalls: [weatherCall] });
  f.mock.behaviors.set('mock-runaway', {
    toolCalls: [{ name: 'write_essay', arguments: `{"text":"${' lorem ipsum dolor'.repeat(60)}"}` }],
  });
  f.mock.behaviors.set('mock-cached', { promptTokens: 40, cachedTokens: 32, tokens: 7, reasoningTokens: 3 });
  f.mock.behaviors.set('mock-no-responses', { noResponses: true });
  f.mock.behaviors.set('mock-silent', { usage: false });
  f.mock.behaviors.set('mock-long', { tokens: 50, ignoreMaxTokens: true });
  // An embeddings provider reports what its tokenizer counts ('one', 'two': one token each).
  f.mock.behaviors.set('mock-embed', { promptTokens: 2 });
});
afterAll(() => f.close());

/** The charge entries' metadata of a user (what was metered). */
async function charges(user: string) {
  const wallet = (await f.wallet(user))!;
  return ledgerEntriesOf(f.ctx, wallet.userId, ['kind', 'amount', 'held_delta', 'source', 'metadata']);
}

describe('chat completions: the whole request schema', () => {
  it('serves a two-turn tool-calling conversation and charges each turn from its usage', async () => {
    await f.fund('tooler', '1.00');
    f.mock.requests.length = 0;
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'user', content: 'What is the weather in Paris?' },
    ];
    const first = await f.client.chat.completions.create({
      model: 'tools',
      user: 'tooler',
      messages,
      tools: [weatherTool],
      tool_choice: 'auto',
      parallel_tool_calls: false,
    });
    const call = first.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(first.choices[0]!.finish_reason).toBe('tool_calls');
    expect(call.function).toEqual(weatherCall);

    // Turn 2: the assistant message with tool_calls and content null, then the tool's answer.
    messages.push(first.choices[0]!.message as OpenAI.ChatCompletionAssistantMessageParam, {
      role: 'tool',
      tool_call_id: call.id,
      content: '{"temperature": 18}',
    });
    const second = await f.client.chat.completions.create({
      model: 'tools',
      user: 'tooler',
      messages,
      tools: [weatherTool],
    });
    expect(second.choices[0]!.message.content).toBe(' hello'.repeat(5));

    // Forwarded exactly as received (only the model name and the bound are Tollgate's).
    const sent = f.mock.requests[1]!.body;
    expect(sent.messages).toEqual(JSON.parse(JSON.stringify(messages)));
    expect(sent.messages[1]).toMatchObject({
      role: 'assistant',
      content: null,
      tool_calls: [{ id: call.id }],
    });
    expect(sent.tools).toEqual([weatherTool]);
    expect(f.mock.requests[0]!.body).toMatchObject({ tool_choice: 'auto', parallel_tool_calls: false });

    await f.settled();
    const entries = await f.ledger('tooler');
    const turn = tokenCost(price, 12, 5);
    expect(chargedTotal(entries)).toBe(new Money(turn).times(2).toFixed());
  });

  it('passes streamed tool_calls deltas through untouched; the SDK stream helper reassembles them', async () => {
    await f.fund('streamer', '1.00');
    const stream = f.client.chat.completions.stream({
      model: 'tools',
      user: 'streamer',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [weatherTool],
    });
    const deltas: string[] = [];
    stream.on('tool_calls.function.arguments.delta', (e) => deltas.push(e.arguments_delta));
    const final = await stream.finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[];
    expect(calls).toHaveLength(1);
    expect(calls[0]!.function).toEqual(weatherCall);
    expect(deltas.join('')).toBe(weatherCall.arguments);
    expect(deltas.length).toBeGreaterThan(3);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    await f.settled();
    expect(chargedTotal(await f.ledger('streamer'))).toBe(tokenCost(price, 12, 5));
  });

  it('cuts a stream of tool-call deltas at the completion bound into a stream the SDK helper still finalises', async () => {
    await f.fund('runaway', '1.00');
    const body = {
      model: 'runaway',
      user: 'runaway',
      messages: [{ role: 'user' as const, content: 'Write an essay' }],
      tools: [weatherTool],
      max_tokens: 20,
      stream_options: { include_usage: true },
    };
    const stream = f.client.chat.completions.stream(body);
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    stream.on('chunk', (c) => chunks.push(c));
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]!.finish_reason).toBe('length');
    const call = final.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function.name).toBe('write_essay');
    expect(call.function.arguments.length).toBeGreaterThan(0);
    const usage = chunks.at(-1)!.usage!;
    expect(usage.completion_tokens).toBeLessThanOrEqual(20);
    await f.settled();
    const prompt = countPromptTokens(chatRequestSchema.parse({ ...body, stream: true }));
    expect(usage.prompt_tokens).toBe(prompt);
    expect(chargedTotal(await f.ledger('runaway'))).toBe(tokenCost(price, prompt, usage.completion_tokens));
  });

  it('accepts image parts, holds them by OpenAI’s image-token rule, and forwards them as received', async () => {
    await f.fund('viewer', '1.00');
    f.mock.requests.length = 0;
    const image = pngDataUrl(1024, 1024); // high detail: 768×768 → 4 tiles → 765 tokens
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      {
        role: 'user',
        content: [
          { type: 'text', text: 'What is in this picture?' },
          { type: 'image_url', image_url: { url: image, detail: 'high' } },
          { type: 'image_url', image_url: { url: 'https://example.com/cat.png', detail: 'low' } },
        ],
      },
    ];
    const reply = await f.client.chat.completions.create({ model: 'metered', user: 'viewer', messages });
    expect(reply.choices[0]!.message.content).toBe(' hello'.repeat(5));
    expect(f.mock.requests[0]!.body.messages).toEqual(messages);
    const counted = countPromptTokens(chatRequestSchema.parse({ model: 'metered', messages }));
    const textOnly = countPromptTokens(
      chatRequestSchema.parse({
        model: 'metered',
        messages: [{ role: 'user', content: 'What is in this picture?' }],
      }),
    );
    expect(counted - textOnly).toBe(765 + 85);
    await f.settled();
    const entries = await f.ledger('viewer');
    expect((await f.holds('viewer'))[0]).toMatchObject({
      status: 'settled',
      amount: tokenCost(price, promptTokensUpperBound(counted), 100),
    });
    expect(chargedTotal(entries)).toBe(tokenCost(price, 12, 5));
  });

  it('accepts the developer role and a json_schema response format, forwarded untouched', async () => {
    await f.fund('dev', '1.00');
    f.mock.requests.length = 0;
    const response_format = {
      type: 'json_schema' as const,
      json_schema: {
        name: 'answer',
        strict: true,
        schema: {
          type: 'object',
          properties: { text: { type: 'string' } },
          required: ['text'],
          additionalProperties: false,
        },
      },
    };
    await f.client.chat.completions.create({
      model: 'metered',
      user: 'dev',
      messages: [
        { role: 'developer', content: 'Answer in JSON.' },
        { role: 'user', content: [{ type: 'text', text: 'Hi' }], name: 'alice_1' },
      ],
      response_format,
      seed: 7,
      stop: ['\n\n'],
      logprobs: true,
      top_logprobs: 2,
      metadata: { purpose: 'test' },
      store: false,
    });
    expect(f.mock.requests[0]!.body).toMatchObject({
      messages: [
        { role: 'developer', content: 'Answer in JSON.' },
        { role: 'user', name: 'alice_1' },
      ],
      response_format,
      seed: 7,
      stop: ['\n\n'],
      logprobs: true,
      top_logprobs: 2,
      metadata: { purpose: 'test' },
      store: false,
    });
    await f.settled();
    expect(chargedTotal(await f.ledger('dev'))).toBe(tokenCost(price, 12, 5));
  });

  it('serves n: 2, holding the bound twice and charging the usage of both choices', async () => {
    await f.fund('twice', '1.00');
    const messages = [{ role: 'user' as const, content: 'Two answers please' }];
    const reply = await f.client.chat.completions.create({ model: 'metered', user: 'twice', messages, n: 2 });
    expect(reply.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(reply.usage!.completion_tokens).toBe(10);
    await f.settled();
    const entries = await f.ledger('twice');
    const prompt = countPromptTokens(chatRequestSchema.parse({ model: 'metered', messages, n: 2 }));
    expect((await f.holds('twice'))[0]!.amount).toBe(tokenCost(price, promptTokensUpperBound(prompt), 200));
    expect(chargedTotal(entries)).toBe(tokenCost(price, 12, 10));
  });

  it('cuts a streamed n: 2 at the bound with a length finish for every open choice', async () => {
    await f.fund('long', '1.00');
    const stream = f.client.chat.completions.stream({
      model: 'long',
      user: 'long',
      messages: [{ role: 'user', content: 'Go on' }],
      n: 2,
      max_tokens: 10,
    });
    const final = await stream.finalChatCompletion();
    expect(final.choices.map((c) => c.finish_reason)).toEqual(['length', 'length']);
    // The bound is per choice; the hold pays for 2 × 10 tokens, and the stream stopped before more.
    const produced = final.choices.reduce(
      (sum, c) => sum + (c.message.content ?? '').split(' hello').length - 1,
      0,
    );
    expect(produced).toBe(20);
    await f.settled();
    const prompt = countPromptTokens(
      chatRequestSchema.parse({ model: 'long', messages: [{ role: 'user', content: 'Go on' }], n: 2 }),
    );
    expect(chargedTotal(await f.ledger('long'))).toBe(tokenCost(price, prompt, 20));
  });

  it('prices cached input tokens at the cached price; reasoning tokens are output', async () => {
    await f.fund('cache', '1.00');
    await f.client.chat.completions.create({
      model: 'cached',
      user: 'cache',
      messages: [{ role: 'user', content: 'Again' }],
      reasoning_effort: 'low',
    });
    await f.settled();
    // 40 prompt tokens of which 32 cached; 7 completion tokens of which 3 reasoning.
    const expected = new Money(IN)
      .times(8)
      .plus(new Money(CACHED_IN).times(32))
      .plus(new Money(OUT).times(7))
      .div(1e6);
    expect(chargedTotal(await f.ledger('cache'))).toBe(expected.toFixed());
    const charge = (await charges('cache')).find((e) => e.kind === 'charge')!;
    expect(charge.metadata).toMatchObject({
      inputTokens: 40,
      cachedInputTokens: 32,
      outputTokens: 7,
      reasoningTokens: 3,
    });
  });

  it('still enforces the spec’s rules where they apply', async () => {
    const bad = async (messages: unknown) => {
      const res = await fetch(`${f.server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${f.apiKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'metered', user: 'dev', messages }),
      });
      return { status: res.status, error: ((await res.json()) as { error: { param: string } }).error };
    };
    expect(await bad([{ role: 'robot', content: 'x' }])).toMatchObject({
      status: 400,
      error: { param: 'messages.0.role' },
    });
    expect(await bad([{ role: 'user', content: null }])).toMatchObject({
      status: 400,
      error: { param: 'messages.0.content' },
    });
    expect(await bad([{ role: 'assistant', content: null }])).toMatchObject({
      status: 400,
      error: { param: 'messages.0.content' },
    });
    expect(await bad([{ role: 'tool', content: 'x' }])).toMatchObject({
      status: 400,
      error: { param: 'messages.0.tool_call_id' },
    });
    expect(
      await bad([{ role: 'system', content: [{ type: 'image_url', image_url: { url: 'x' } }] }]),
    ).toMatchObject({
      status: 400,
      error: { param: 'messages.0.content.0.type' },
    });
    expect(await bad([{ role: 'developer', content: 'x', name: 'no spaces allowed' }])).toMatchObject({
      status: 400,
      error: { param: 'messages.0.name' },
    });
  });
});

describe('responses', () => {
  it('serves client.responses.create and charges input_tokens/output_tokens exactly', async () => {
    await f.fund('resp', '1.00');
    f.mock.requests.length = 0;
    const response = await f.client.responses.create({
      model: 'metered',
      user: 'resp',
      instructions: 'Be brief.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hello there' }] }],
    });
    expect(response.object).toBe('response');
    expect(response.output_text).toBe(' hello'.repeat(5));
    const sent = f.mock.requests[0]!.body;
    expect(sent).toMatchObject({ model: 'mock-model', max_output_tokens: 100, instructions: 'Be brief.' });
    const again = await f.client.responses.retrieve(response.id);
    expect(again.id).toBe(response.id);
    await f.settled();
    const entries = await f.ledger('resp');
    const counted = countResponsesInput(responsesRequestSchema.parse(sent));
    expect((await f.holds('resp'))[0]!.amount).toBe(tokenCost(price, promptTokensUpperBound(counted), 100));
    expect(chargedTotal(entries, 'responses')).toBe(tokenCost(price, 12, 5));
  });

  it('streams the Responses events through and charges from response.completed', async () => {
    await f.fund('resp-stream', '1.00');
    const stream = await f.client.responses.create({
      model: 'metered',
      user: 'resp-stream',
      input: 'Hello',
      stream: true,
    });
    const types: string[] = [];
    let text = '';
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    expect(types[0]).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    expect(text).toBe(' hello'.repeat(5));
    await f.settled();
    expect(chargedTotal(await f.ledger('resp-stream'), 'responses')).toBe(tokenCost(price, 12, 5));
  });

  it('answers 400 for a provider without a Responses endpoint, and charges nothing', async () => {
    await f.fund('resp-none', '1.00');
    const err = await f.client.responses
      .create({ model: 'no-responses', user: 'resp-none', input: 'Hello' })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('unsupported_endpoint');
    expect(err.message).toContain('Responses API');
    await f.settled();
    expect(await f.wallet('resp-none')).toMatchObject({ balance: '1', held: '0' });
  });
});

describe('without usage from the provider, what can be counted is charged', () => {
  it('responses: input as counted, output from the text', async () => {
    await f.fund('quiet', '1.00');
    const body = { model: 'silent', user: 'quiet', input: 'Hello there, how are you?' };
    await f.client.responses.create(body);
    const stream = await f.client.responses.create({ ...body, stream: true });
    for await (const _ of stream);
    await f.settled();
    const counted = countResponsesInput(responsesRequestSchema.parse(body));
    const one = tokenCost(price, counted, 5);
    expect(chargedTotal(await f.ledger('quiet'), 'responses')).toBe(new Money(one).times(2).toFixed());
  });

  it('embeddings: the input as counted', async () => {
    await f.fund('quiet-embed', '1.00');
    const body = { model: 'silent-embed', user: 'quiet-embed', input: ['alpha beta', 'gamma'] };
    await f.client.embeddings.create(body);
    await f.settled();
    const counted = countEmbeddingInput(embeddingsRequestSchema.parse(body));
    const embedPrice = { inputPerMillion: new Money('0.02'), outputPerMillion: new Money(0) };
    expect(chargedTotal(await f.ledger('quiet-embed'), 'embeddings')).toBe(tokenCost(embedPrice, counted, 0));
  });
});

describe('embeddings', () => {
  it('serves client.embeddings.create and charges input tokens × the input price', async () => {
    await f.fund('embedder', '1.00');
    f.mock.requests.length = 0;
    const result = await f.client.embeddings.create({
      model: 'embed',
      user: 'embedder',
      input: ['one', 'two'],
    });
    expect(result.data.map((d) => d.embedding)).toEqual([
      [0.25, 0.5, 0.75],
      [0.25, 0.5, 0.75],
    ]);
    const sent = f.mock.requests[0]!.body;
    expect(sent).toMatchObject({ model: 'mock-embed', input: ['one', 'two'] });
    expect(sent.max_tokens).toBeUndefined();
    await f.settled();
    const entries = await f.ledger('embedder');
    const counted = countEmbeddingInput(embeddingsRequestSchema.parse(sent));
    const embedPrice = { inputPerMillion: new Money('0.02'), outputPerMillion: new Money(0) };
    expect((await f.holds('embedder'))[0]!.amount).toBe(
      tokenCost(embedPrice, promptTokensUpperBound(counted), 0),
    );
    expect(chargedTotal(entries, 'embeddings')).toBe(tokenCost(embedPrice, 2, 0));
    expect(chargedTotal(entries, 'embeddings')).toBe('0.00000004');
  });

  it('refuses a model that does not serve the API', async () => {
    const err = await f.client.embeddings
      .create({ model: 'metered', user: 'embedder', input: 'x' })
      .catch((e) => e);
    expect(err.status).toBe(400);
    expect(err.code).toBe('unsupported_model');
    const chat = await f.client.chat.completions
      .create({ model: 'embed', user: 'embedder', messages: [{ role: 'user', content: 'x' }] })
      .catch((e) => e);
    expect(chat.status).toBe(400);
  });
});

describe('a user who cannot pay, in each API’s own shape', () => {
  const link = (kind: string) => new RegExp(`http://\\S+/${kind}/[A-Za-z0-9_.-]+`);
  beforeAll(async () => {
    await f.fund('penniless');
  });
  const cases = [
    ['not connected', 'stranger', 'connect'],
    ['cannot pay', 'penniless', 'topup'],
  ] as const;

  for (const [what, user, kind] of cases) {
    it(`chat with tools (${what}): an ordinary assistant message with the link, no tool_calls`, async () => {
      const reply = await f.client.chat.completions.create({
        model: 'tools',
        user,
        messages: [{ role: 'user', content: 'Weather?' }],
        tools: [weatherTool],
      });
      expect(reply.choices[0]!.message.content).toMatch(link(kind));
      expect(reply.choices[0]!.message.tool_calls).toBeUndefined();
      expect(reply.choices[0]!.finish_reason).toBe('stop');

      const stream = f.client.chat.completions.stream({
        model: 'tools',
        user,
        messages: [{ role: 'user', content: 'Weather?' }],
        tools: [weatherTool],
        stream_options: { include_usage: true },
      });
      const final = await stream.finalChatCompletion();
      expect(final.choices[0]!.message.content).toMatch(link(kind));
      expect(final.choices[0]!.message.tool_calls ?? []).toEqual([]);
    });

    it(`responses (${what}): a valid Response carrying the link, as JSON and as the event stream`, async () => {
      const response = await f.client.responses.create({ model: 'metered', user, input: 'Hi' });
      expect(response).toMatchObject({ object: 'response', status: 'completed' });
      expect(response.output_text).toMatch(link(kind));

      const stream = await f.client.responses.create({ model: 'metered', user, input: 'Hi', stream: true });
      const events: OpenAI.Responses.ResponseStreamEvent[] = [];
      for await (const event of stream) events.push(event);
      const types = events.map((e) => e.type);
      expect(types[0]).toBe('response.created');
      expect(types).toContain('response.output_text.delta');
      expect(types.at(-1)).toBe('response.completed');
      expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));

      const helper = f.client.responses.stream({ model: 'metered', user, input: 'Hi' });
      const final = await helper.finalResponse();
      expect(final.output_text).toMatch(link(kind));
    });

    it(`embeddings (${what}): 402 in OpenAI's error shape with the link in the message and url`, async () => {
      const err = await f.client.embeddings.create({ model: 'embed', user, input: 'x' }).catch((e) => e);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.status).toBe(402);
      expect(err.code).toBe(`${kind === 'connect' ? 'connect' : 'topup'}_required`);
      expect(err.message).toMatch(link(kind));
      expect(err.error.url).toMatch(link(kind));
      expect(err.error.type).toBe('payment_required');
    });
  }

  it('charged nothing to anyone refused', async () => {
    await f.settled();
    expect(await f.wallet('penniless')).toMatchObject({ balance: '0', held: '0' });
    expect(await f.wallet('stranger')).toBeUndefined();
  });
});

describe('models', () => {
  it('lists which endpoints serve each model', async () => {
    const list = await f.client.models.list();
    const byId = Object.fromEntries(
      list.data.map((m) => [m.id, (m as unknown as { endpoints: string[] }).endpoints]),
    );
    expect(byId.metered).toEqual(['chat', 'responses']);
    expect(byId.embed).toEqual(['embeddings']);
  });
});

/** A PNG data URL whose header says width × height (the pixels are not needed to count tokens). */
function pngDataUrl(width: number, height: number): string {
  const header = Buffer.alloc(33);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).copy(header, 0);
  header.writeUInt32BE(13, 8);
  header.write('IHDR', 12, 'ascii');
  header.writeUInt32BE(width, 16);
  header.writeUInt32BE(height, 20);
  header.writeUInt8(8, 24);
  header.writeUInt8(6, 25);
  return `data:image/png;base64,${header.toString('base64')}`;
}
