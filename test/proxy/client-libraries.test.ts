import { createOpenAI } from '@ai-sdk/openai';
import { HumanMessage, SystemMessage } from '@langchain/core/messages';
import { tool as langchainTool } from '@langchain/core/tools';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import {
  APICallError,
  embed,
  embedMany,
  generateText,
  type LanguageModel,
  Output,
  stepCountIs,
  streamText,
  tool,
} from 'ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { type ChatFixture, chargedTotal, embeddingModel, startChatFixture } from '../helpers/chat-fixture.ts';

/**
 * The libraries real apps use, pointed at a real Tollgate server whose provider is the mock on loopback:
 * the Vercel AI SDK (`ai` + `@ai-sdk/openai`, over Chat Completions and over the Responses API) and
 * LangChain JS (`@langchain/openai`'s ChatOpenAI). Each served call is charged exactly from the
 * provider's usage, nothing stays held, and a user who cannot pay gets the link as ordinary assistant
 * text without the library throwing.
 */
let f: ChatFixture;

const IN = '0.15';
const OUT = '0.6';
const price = { inputPerMillion: new Money(IN), outputPerMillion: new Money(OUT) };
const perToken = { mode: 'per_token' as const, inputPerMillion: IN, outputPerMillion: OUT };
/** One served turn of the mock: 12 prompt tokens, 5 completion tokens (' hello' × 5). */
const TURN = tokenCost(price, 12, 5);
const TEXT = ' hello'.repeat(5);
/** One embeddings call of the mock: 2 input tokens at 0.02 per million. */
const EMBED_CALL = tokenCost({ inputPerMillion: new Money('0.02'), outputPerMillion: new Money(0) }, 2, 0);
const weatherCall = { name: 'get_weather', arguments: '{"city":"Paris"}' };
const JSON_ANSWER = '{"city":"Paris","temperature":18}';
const weatherSchema = z.object({ city: z.string(), temperature: z.number() });
/** A 1×1 PNG. */
const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==',
  'base64',
);
const topupLink = /http:\/\/\S+\/topup\/[A-Za-z0-9_.-]+/;
const connectLink = /http:\/\/\S+\/connect\/[A-Za-z0-9_.-]+/;

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'metered', upstreamModel: 'mock-model', pricing: perToken },
      { id: 'tools', upstreamModel: 'mock-tools', pricing: perToken },
      { id: 'json', upstreamModel: 'mock-json', pricing: perToken },
      // A reasoning model's name: the libraries then send the developer role, max_completion_tokens, reasoning effort.
      { id: 'gpt-5-mini', upstreamModel: 'mock-model', pricing: perToken },
      embeddingModel('embed', 'mock-embed'),
    ],
    settings: { maxCompletionTokens: 100 },
  });
  f.mock.behaviors.set('mock-tools', { toolCalls: [weatherCall] });
  // One piece of JSON, reported as one completion token.
  f.mock.behaviors.set('mock-json', { piece: JSON_ANSWER, tokens: 1 });
  f.mock.behaviors.set('mock-embed', { promptTokens: 2 });
});
afterAll(() => f.close());

/** Charged exactly `turns` served turns (source `chat` or `responses`), and nothing left held. */
async function expectCharged(
  user: string,
  turns: number,
  source: 'chat' | 'responses' | 'embeddings',
  turn = TURN,
) {
  await f.settled();
  const entries = await f.ledger(user);
  expect(chargedTotal(entries, source)).toBe(new Money(turn).times(turns).toFixed());
  expect(entries.filter((e) => e.kind === 'charge')).toHaveLength(turns);
  expect((await f.holds(user)).filter((h) => h.status === 'open')).toEqual([]);
  expect((await f.wallet(user))!.held).toBe('0');
}

/** Streams `options` to the end: the stream, its text, and the error it reported if any. */
async function streamToEnd(options: Parameters<typeof streamText>[0]) {
  let error: unknown;
  const streamed = streamText({
    ...options,
    onError: ({ error: e }) => {
      error = e;
    },
  });
  let text = '';
  for await (const delta of streamed.textStream) text += delta;
  return { streamed, text, error };
}

/** An AI SDK provider for Tollgate, with the end user in the `X-Service-User` header. */
function aiSdk(user: string) {
  return createOpenAI({
    baseURL: `${f.server.url}/v1`,
    apiKey: f.apiKey,
    headers: { 'X-Service-User': user },
  });
}

const weatherTool = () =>
  tool({
    description: 'Current weather of a city',
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => ({ city, temperature: 18 }),
  });

describe('Vercel AI SDK', () => {
  const apis = [
    ['chat completions', (user: string) => aiSdk(user).chat('metered'), 'chat'],
    ['responses (the default provider)', (user: string) => aiSdk(user)('metered'), 'responses'],
    ['responses (openai.responses)', (user: string) => aiSdk(user).responses('metered'), 'responses'],
  ] as const satisfies ReadonlyArray<readonly [string, (user: string) => LanguageModel, string]>;

  for (const [api, model, source] of apis) {
    it(`generateText over ${api}: the text and usage, charged exactly`, async () => {
      const user = `ai-gen-${source}-${api.length}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const result = await generateText({ model: model(user), prompt: 'Say hello', maxRetries: 0 });
      expect(result.text).toBe(TEXT);
      expect(result.usage).toMatchObject({ inputTokens: 12, outputTokens: 5, totalTokens: 17 });
      expect(f.mock.requests).toHaveLength(1);
      await expectCharged(user, 1, source);
    });

    it(`streamText over ${api}: the streamed text and usage, charged exactly`, async () => {
      const user = `ai-stream-${source}-${api.length}`;
      await f.fund(user, '1.00');
      const result = streamText({ model: model(user), prompt: 'Say hello', maxRetries: 0 });
      const deltas: string[] = [];
      for await (const delta of result.textStream) deltas.push(delta);
      expect(deltas.join('')).toBe(TEXT);
      expect(deltas.length).toBeGreaterThan(1);
      expect(await result.usage).toMatchObject({ inputTokens: 12, outputTokens: 5, totalTokens: 17 });
      await expectCharged(user, 1, source);
    });

    it(`paywall over ${api}: an unconnected user gets the connect link as assistant text`, async () => {
      const user = `ai-stranger-${source}-${api.length}`;
      const generated = await generateText({ model: model(user), prompt: 'Hi', maxRetries: 0 });
      expect(generated.text).toMatch(connectLink);
      expect(generated.finishReason).toBe('stop');

      const { streamed, text, error } = await streamToEnd({
        model: model(user),
        prompt: 'Hi',
        maxRetries: 0,
      });
      expect(error).toBeUndefined();
      expect(text).toMatch(connectLink);
      expect(await streamed.finishReason).toBe('stop');
      await f.settled();
      expect(await f.wallet(user)).toBeUndefined();
    });
  }

  const toolApis = [
    ['chat completions', (user: string) => aiSdk(user).chat('tools'), 'chat'],
    ['responses (the default provider)', (user: string) => aiSdk(user)('tools'), 'responses'],
  ] as const;

  for (const [api, model, source] of toolApis) {
    it(`runs a tool-call round trip over ${api} (generateText), charging both turns`, async () => {
      const user = `ai-tools-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      let ran: unknown;
      const result = await generateText({
        model: model(user),
        prompt: 'What is the weather in Paris?',
        tools: {
          get_weather: tool({
            description: 'Current weather of a city',
            inputSchema: z.object({ city: z.string() }),
            execute: async (input) => {
              ran = input;
              return { temperature: 18 };
            },
          }),
        },
        stopWhen: stepCountIs(3),
        maxRetries: 0,
      });
      expect(ran).toEqual({ city: 'Paris' });
      expect(result.steps).toHaveLength(2);
      expect(result.steps[0]!.toolCalls).toMatchObject([
        { toolName: 'get_weather', toolCallId: 'call_0', input: { city: 'Paris' } },
      ]);
      expect(result.steps[0]!.finishReason).toBe('tool-calls');
      expect(result.text).toBe(TEXT);
      expect(result.totalUsage).toMatchObject({ inputTokens: 24, outputTokens: 10 });

      // The second turn carried the assistant's tool call and the tool's answer, forwarded as sent.
      expect(f.mock.requests).toHaveLength(2);
      const second = f.mock.requests[1]!.body;
      if (source === 'chat') {
        expect(second.tools[0]).toMatchObject({ type: 'function', function: { name: 'get_weather' } });
        expect(second.messages.at(-2)).toMatchObject({
          role: 'assistant',
          tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_weather' } }],
        });
        expect(second.messages.at(-1)).toMatchObject({ role: 'tool', tool_call_id: 'call_0' });
        expect(JSON.parse(second.messages.at(-1).content)).toEqual({ temperature: 18 });
      } else {
        expect(second.tools[0]).toMatchObject({ type: 'function', name: 'get_weather' });
        const output = second.input.find((i: any) => i.type === 'function_call_output');
        expect(output).toMatchObject({ call_id: 'call_0' });
        expect(JSON.parse(output.output)).toEqual({ temperature: 18 });
      }
      await expectCharged(user, 2, source);
    });

    it(`runs a tool-call round trip over ${api} (streamText), charging both turns`, async () => {
      const user = `ai-tools-stream-${source}`;
      await f.fund(user, '1.00');
      const result = streamText({
        model: model(user),
        prompt: 'What is the weather in Paris?',
        tools: { get_weather: weatherTool() },
        stopWhen: stepCountIs(3),
        maxRetries: 0,
      });
      let text = '';
      for await (const delta of result.textStream) text += delta;
      expect(text).toBe(TEXT);
      const steps = await result.steps;
      expect(steps).toHaveLength(2);
      expect(steps[0]!.toolResults).toMatchObject([
        { toolName: 'get_weather', output: { city: 'Paris', temperature: 18 } },
      ]);
      expect(await result.totalUsage).toMatchObject({ inputTokens: 24, outputTokens: 10 });
      await expectCharged(user, 2, source);
    });

    it(`paywall with tools over ${api}: the link as text, no tool run, streaming or not`, async () => {
      const user = `ai-tools-stranger-${source}`;
      let ran = false;
      const tools = {
        get_weather: tool({
          inputSchema: z.object({ city: z.string() }),
          execute: async () => {
            ran = true;
            return {};
          },
        }),
      };
      const prompt = 'What is the weather in Paris?';
      const result = await generateText({
        model: model(user),
        prompt,
        tools,
        stopWhen: stepCountIs(3),
        maxRetries: 0,
      });
      expect(result.steps).toHaveLength(1);
      expect(result.text).toMatch(connectLink);
      expect(result.toolCalls).toEqual([]);

      const { streamed, text, error } = await streamToEnd({
        model: model(user),
        prompt,
        tools,
        stopWhen: stepCountIs(3),
        maxRetries: 0,
      });
      expect(error).toBeUndefined();
      expect(text).toMatch(connectLink);
      expect(await streamed.steps).toHaveLength(1);
      expect(ran).toBe(false);
    });
  }

  for (const [api, model, source] of apis.slice(0, 2)) {
    it(`over ${api}: system prompt, image parts (URL and bytes), temperature, topP and maxOutputTokens`, async () => {
      const user = `ai-shapes-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const result = await generateText({
        model: model(user),
        system: 'Be brief.',
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'What is in these pictures?' },
              { type: 'file', data: new URL('https://example.com/cat.png'), mediaType: 'image/png' },
              { type: 'file', data: PNG, mediaType: 'image/png' },
            ],
          },
        ],
        maxOutputTokens: 50,
        temperature: 0.2,
        topP: 0.9,
        maxRetries: 0,
      });
      expect(result.text).toBe(TEXT);
      const sent = f.mock.requests[0]!.body;
      expect(JSON.stringify(sent)).toContain('https://example.com/cat.png');
      expect(JSON.stringify(sent)).toContain(`data:image/png;base64,${PNG.toString('base64')}`);
      expect(sent).toMatchObject({ temperature: 0.2, top_p: 0.9 });
      expect(sent[source === 'chat' ? 'max_tokens' : 'max_output_tokens']).toBe(50);
      await expectCharged(user, 1, source);
    });

    it(`over ${api}: structured output (Output.object with a zod schema)`, async () => {
      const user = `ai-json-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const result = await generateText({
        model: aiSdk(user)[source === 'chat' ? 'chat' : 'responses']('json'),
        prompt: 'The weather in Paris as JSON',
        output: Output.object({ schema: weatherSchema }),
        maxRetries: 0,
      });
      expect(result.output).toEqual({ city: 'Paris', temperature: 18 });
      const sent = f.mock.requests[0]!.body;
      if (source === 'chat') expect(sent.response_format).toMatchObject({ type: 'json_schema' });
      else expect(sent.text.format).toMatchObject({ type: 'json_schema' });
      await expectCharged(user, 1, source, tokenCost(price, 12, 1));
    });
  }

  for (const [api, source] of [
    ['chat completions', 'chat'],
    ['responses', 'responses'],
  ] as const) {
    it(`over ${api} with a reasoning model's name: the developer role and reasoning effort`, async () => {
      const user = `ai-reasoning-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const provider = aiSdk(user);
      const result = await generateText({
        model: source === 'chat' ? provider.chat('gpt-5-mini') : provider.responses('gpt-5-mini'),
        system: 'Be brief.',
        prompt: 'Say hello',
        maxOutputTokens: 60,
        providerOptions: { openai: { reasoningEffort: 'low' } },
        maxRetries: 0,
      });
      expect(result.text).toBe(TEXT);
      const sent = f.mock.requests[0]!.body;
      if (source === 'chat') {
        expect(sent.messages[0]).toEqual({ role: 'developer', content: 'Be brief.' });
        expect(sent).toMatchObject({ reasoning_effort: 'low', max_completion_tokens: 60 });
      } else {
        expect(sent.input[0]).toMatchObject({ role: 'developer', content: 'Be brief.' });
        expect(sent).toMatchObject({ reasoning: { effort: 'low' }, max_output_tokens: 60 });
      }
      await expectCharged(user, 1, source);
    });
  }

  it('embed and embedMany: the vectors and usage, charged exactly', async () => {
    const user = 'ai-embed';
    await f.fund(user, '1.00');
    const model = aiSdk(user).embedding('embed');
    const one = await embed({ model, value: 'one', maxRetries: 0 });
    expect(one.embedding).toEqual([0.25, 0.5, 0.75]);
    expect(one.usage).toMatchObject({ tokens: 2 });
    const many = await embedMany({ model, values: ['one', 'two'], maxRetries: 0 });
    expect(many.embeddings).toEqual([
      [0.25, 0.5, 0.75],
      [0.25, 0.5, 0.75],
    ]);
    await expectCharged(user, 2, 'embeddings', EMBED_CALL);
  });

  it('a connected user who cannot pay gets the top-up link, over both APIs, streaming or not', async () => {
    const user = 'ai-penniless';
    await f.fund(user);
    for (const model of [aiSdk(user).chat('metered'), aiSdk(user)('metered')]) {
      expect((await generateText({ model, prompt: 'Hi', maxRetries: 0 })).text).toMatch(topupLink);
      let text = '';
      for await (const delta of streamText({ model, prompt: 'Hi', maxRetries: 0 }).textStream) text += delta;
      expect(text).toMatch(topupLink);
    }
    await f.settled();
    expect(await f.wallet(user)).toMatchObject({ balance: '0', held: '0' });
    expect(await f.ledger(user)).toEqual([]);
  });

  it('embed for an unconnected user: the 402 with the link, thrown as an APICallError', async () => {
    const error = await embed({
      model: aiSdk('ai-embed-stranger').embedding('embed'),
      value: 'x',
      maxRetries: 0,
    })
      .then(() => undefined)
      .catch((e: unknown) => e);
    expect(APICallError.isInstance(error)).toBe(true);
    expect((error as APICallError).statusCode).toBe(402);
    expect((error as APICallError).message).toMatch(connectLink);
  });

  it('passes the end user as providerOptions.openai.user as well as by header', async () => {
    await f.fund('ai-body-user', '1.00');
    const provider = createOpenAI({ baseURL: `${f.server.url}/v1`, apiKey: f.apiKey });
    const result = await generateText({
      model: provider.chat('metered'),
      prompt: 'Say hello',
      providerOptions: { openai: { user: 'ai-body-user' } },
      maxRetries: 0,
    });
    expect(result.text).toBe(TEXT);
    await expectCharged('ai-body-user', 1, 'chat');
  });
});

describe('LangChain JS (ChatOpenAI)', () => {
  const apis = [
    ['chat completions', false, 'chat'],
    ['the Responses API (useResponsesApi)', true, 'responses'],
  ] as const;

  for (const [api, useResponsesApi, source] of apis) {
    const chat = (user: string, model = 'metered') =>
      new ChatOpenAI({
        model,
        apiKey: f.apiKey,
        maxRetries: 0,
        useResponsesApi,
        configuration: { baseURL: `${f.server.url}/v1`, defaultHeaders: { 'X-Service-User': user } },
      });
    const getWeather = langchainTool(async ({ city }) => JSON.stringify({ city, temperature: 18 }), {
      name: 'get_weather',
      description: 'Current weather of a city',
      schema: z.object({ city: z.string() }),
    });

    it(`invoke over ${api}: the text and usage metadata, charged exactly`, async () => {
      const user = `lc-invoke-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const message = await chat(user).invoke('Say hello');
      expect(message.text).toBe(TEXT);
      expect(message.usage_metadata).toMatchObject({ input_tokens: 12, output_tokens: 5, total_tokens: 17 });
      expect(f.mock.requests).toHaveLength(1);
      expect(f.mock.requests[0]!.body).toHaveProperty(source === 'chat' ? 'messages' : 'input');
      await expectCharged(user, 1, source);
    });

    it(`stream over ${api}: the chunks concatenate to the text, usage included, charged exactly`, async () => {
      const user = `lc-stream-${source}`;
      await f.fund(user, '1.00');
      const chunks = [];
      for await (const chunk of await chat(user).stream('Say hello')) chunks.push(chunk);
      expect(chunks.map((c) => c.text).join('')).toBe(TEXT);
      expect(chunks.length).toBeGreaterThan(2);
      const withUsage = chunks.find((c) => c.usage_metadata);
      expect(withUsage?.usage_metadata).toMatchObject({ input_tokens: 12, output_tokens: 5 });
      await expectCharged(user, 1, source);
    });

    it(`bindTools over ${api}: a tool call, the tool run, and the answer to the second turn`, async () => {
      const user = `lc-tools-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const model = chat(user, 'tools').bindTools([getWeather]);
      const question = { role: 'user', content: 'What is the weather in Paris?' };
      const first = await model.invoke([question]);
      expect(first.tool_calls).toMatchObject([
        { name: 'get_weather', args: { city: 'Paris' }, id: 'call_0' },
      ]);
      const toolMessage = await getWeather.invoke(first.tool_calls![0]!);
      const second = await model.invoke([question, first, toolMessage]);
      expect(second.text).toBe(TEXT);
      expect(second.tool_calls ?? []).toEqual([]);
      expect(f.mock.requests).toHaveLength(2);
      const sent = f.mock.requests[1]!.body;
      if (source === 'chat') {
        expect(sent.messages.at(-1)).toMatchObject({ role: 'tool', tool_call_id: 'call_0' });
      } else {
        expect(sent.input.find((i: any) => i.type === 'function_call_output')).toMatchObject({
          call_id: 'call_0',
        });
      }
      await expectCharged(user, 2, source);
    });

    it(`bindTools while streaming over ${api}: the tool call reassembled from the deltas`, async () => {
      const user = `lc-tools-stream-${source}`;
      await f.fund(user, '1.00');
      const model = chat(user, 'tools').bindTools([getWeather]);
      let whole: any;
      for await (const chunk of await model.stream('What is the weather in Paris?')) {
        whole = whole === undefined ? chunk : whole.concat(chunk);
      }
      expect(whole.tool_calls).toMatchObject([{ name: 'get_weather', args: { city: 'Paris' } }]);
      await expectCharged(user, 1, source);
    });

    it(`over ${api}: a system message, an image part, sampling settings and maxTokens`, async () => {
      const user = `lc-shapes-${source}`;
      await f.fund(user, '1.00');
      f.mock.requests.length = 0;
      const model = new ChatOpenAI({
        model: 'metered',
        apiKey: f.apiKey,
        maxRetries: 0,
        useResponsesApi,
        temperature: 0.2,
        topP: 0.9,
        maxTokens: 50,
        configuration: { baseURL: `${f.server.url}/v1`, defaultHeaders: { 'X-Service-User': user } },
      });
      const message = await model.invoke([
        new SystemMessage('Be brief.'),
        new HumanMessage({
          content: [
            { type: 'text', text: 'What is in this picture?' },
            { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } },
          ],
        }),
      ]);
      expect(message.text).toBe(TEXT);
      const sent = f.mock.requests[0]!.body;
      expect(JSON.stringify(sent)).toContain('https://example.com/cat.png');
      expect(sent).toMatchObject({ temperature: 0.2, top_p: 0.9 });
      expect(sent[source === 'chat' ? 'max_tokens' : 'max_output_tokens']).toBe(50);
      await expectCharged(user, 1, source);
    });

    it(`withStructuredOutput over ${api}: the parsed object`, async () => {
      const user = `lc-json-${source}`;
      await f.fund(user, '1.00');
      const structured = chat(user, 'json').withStructuredOutput(weatherSchema, { method: 'jsonSchema' });
      expect(await structured.invoke('The weather in Paris as JSON')).toEqual({
        city: 'Paris',
        temperature: 18,
      });
      await expectCharged(user, 1, source, tokenCost(price, 12, 1));
    });

    it(`paywall over ${api}: the connect link as the message content, invoke and stream, tools bound or not`, async () => {
      const user = `lc-stranger-${source}`;
      const invoked = await chat(user).invoke('Hi');
      expect(invoked.text).toMatch(connectLink);

      let text = '';
      for await (const chunk of await chat(user).stream('Hi')) text += chunk.text;
      expect(text).toMatch(connectLink);

      const withTools = await chat(user, 'tools').bindTools([getWeather]).invoke('Weather in Paris?');
      expect(withTools.text).toMatch(connectLink);
      expect(withTools.tool_calls ?? []).toEqual([]);

      let streamed: any;
      for await (const chunk of await chat(user, 'tools').bindTools([getWeather]).stream('Weather?')) {
        streamed = streamed === undefined ? chunk : streamed.concat(chunk);
      }
      expect(streamed.text).toMatch(connectLink);
      expect(streamed.tool_calls ?? []).toEqual([]);
      await f.settled();
      expect(await f.wallet(user)).toBeUndefined();
    });
  }

  it('OpenAIEmbeddings: embedQuery and embedDocuments, charged exactly', async () => {
    const user = 'lc-embed';
    await f.fund(user, '1.00');
    const embeddings = new OpenAIEmbeddings({
      model: 'embed',
      apiKey: f.apiKey,
      maxRetries: 0,
      configuration: { baseURL: `${f.server.url}/v1`, defaultHeaders: { 'X-Service-User': user } },
    });
    expect(await embeddings.embedQuery('one')).toEqual([0.25, 0.5, 0.75]);
    expect(await embeddings.embedDocuments(['one', 'two'])).toHaveLength(2);
    await expectCharged(user, 2, 'embeddings', EMBED_CALL);
  });

  it('a connected user who cannot pay gets the top-up link as the content, over both APIs', async () => {
    const user = 'lc-penniless';
    await f.fund(user);
    for (const useResponsesApi of [false, true]) {
      const model = new ChatOpenAI({
        model: 'metered',
        apiKey: f.apiKey,
        maxRetries: 0,
        useResponsesApi,
        configuration: { baseURL: `${f.server.url}/v1`, defaultHeaders: { 'X-Service-User': user } },
      });
      expect((await model.invoke('Hi')).text).toMatch(topupLink);
      let text = '';
      for await (const chunk of await model.stream('Hi')) text += chunk.text;
      expect(text).toMatch(topupLink);
    }
    await f.settled();
    expect(await f.wallet(user)).toMatchObject({ balance: '0', held: '0' });
  });

  it('OpenAIEmbeddings for an unconnected user: the 402 with the link, thrown', async () => {
    const embeddings = new OpenAIEmbeddings({
      model: 'embed',
      apiKey: f.apiKey,
      maxRetries: 0,
      configuration: {
        baseURL: `${f.server.url}/v1`,
        defaultHeaders: { 'X-Service-User': 'lc-embed-stranger' },
      },
    });
    const error: any = await embeddings.embedQuery('x').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Error);
    expect(error.status).toBe(402);
    expect(error.message).toMatch(connectLink);
  });
});
