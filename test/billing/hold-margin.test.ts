import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chatRequestSchema } from '../../src/chat/schema.ts';
import { Money } from '../../src/core/money.ts';
import { embeddingsRequestSchema } from '../../src/embeddings/schema.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { DEFAULT_HOLD_MARGINS, defaultHoldMargin, tokenizerFamily } from '../../src/models/hold-margin.ts';
import { parsePricingFile } from '../../src/models/service.ts';
import { responsesRequestSchema } from '../../src/responses/schema.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';
import { countEmbeddingInput, countPromptTokens, countResponsesInput } from '../../src/tokens/inputs.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { api } from '../helpers/server.ts';

/**
 * Per-model hold margins (issue 21, item 2): the prompt estimate of every API's hold is multiplied by the
 * model's `holdMargin`, or by the default of its upstream model's tokenizer family.
 */
const ROOT = 'root-admin-token-hold-margin-0123456789';
const IN = '0.15';
const OUT = '0.6';
const price = { inputPerMillion: new Money(IN), outputPerMillion: new Money(OUT) };
const perToken = { mode: 'per_token' as const, inputPerMillion: IN, outputPerMillion: OUT };

describe('tokenizer family defaults', () => {
  it('maps upstream model names to their tokenizer family', () => {
    const cases: Array<[string, string]> = [
      ['gpt-4o-mini', 'o200k'],
      ['openai/gpt-4.1', 'o200k'],
      ['gpt-5', 'o200k'],
      ['o3-mini', 'o200k'],
      ['o1', 'o200k'],
      ['gpt-4', 'cl100k'],
      ['gpt-4-turbo', 'cl100k'],
      ['gpt-3.5-turbo', 'cl100k'],
      ['text-embedding-ada-002', 'cl100k'],
      ['text-embedding-3-small', 'cl100k'],
      ['claude-3-5-sonnet-20241022', 'claude'],
      ['anthropic.claude-3-haiku-20240307-v1:0', 'claude'],
      ['meta-llama/Llama-3.1-70B-Instruct', 'llama3'],
      ['llama3-8b-8192', 'llama3'],
      ['mistral-large-latest', 'mistral'],
      ['open-mixtral-8x7b', 'mistral'],
      ['codestral-latest', 'mistral'],
      ['gemini-1.5-pro', 'gemini'],
      ['models/gemini-2.0-flash', 'gemini'],
      ['gemma-2-9b-it', 'gemini'],
      ['mock-model', 'unknown'],
      ['qwen2.5-72b', 'unknown'],
      ['o10-preview', 'unknown'],
    ];
    for (const [name, family] of cases) expect([name, tokenizerFamily(name)]).toEqual([name, family]);
  });

  it('defaults to the measured margins, the largest for unknown names and for the largest of several routes', () => {
    expect(DEFAULT_HOLD_MARGINS).toEqual({
      o200k: '1.1',
      cl100k: '1.7',
      claude: '1.3',
      llama3: '1.25',
      mistral: '1.45',
      gemini: '1.2',
      unknown: '1.9',
    });
    expect(defaultHoldMargin(['gpt-4o'])).toEqual({ margin: '1.1', family: 'o200k' });
    expect(defaultHoldMargin(['llama-3.3-70b', 'mistral-small'])).toEqual({
      margin: '1.45',
      family: 'mistral',
    });
    expect(defaultHoldMargin(['something-else'])).toEqual({ margin: '1.9', family: 'unknown' });
  });
});

describe('validation', () => {
  const file = (margin: string) =>
    `currency: usd\nmodels: [{id: a, pricing: {mode: per_token, inputPerMillion: "1", holdMargin: ${margin}}}]`;

  it('takes a decimal multiplier from 1 to 10 (string or number) and normalizes it', () => {
    const margin = (text: string) => {
      const pricing = parsePricingFile(file(text)).models[0]!.pricing;
      return pricing.mode === 'per_token' ? pricing.holdMargin : undefined;
    };
    expect(margin('"1.25"')).toBe('1.25');
    expect(margin('1.5')).toBe('1.5');
    expect(margin('"1.500"')).toBe('1.5');
    expect(margin('1')).toBe('1');
    expect(margin('"10"')).toBe('10');
  });

  it('refuses bad values with a 400 naming the field', () => {
    for (const bad of ['"0.9"', '0', '"-1.2"', '"abc"', '"1e1"', '"10.5"', '"1.2345"', '""', 'true']) {
      expect(() => parsePricingFile(file(bad)), bad).toThrow(
        expect.objectContaining({ statusCode: 400, param: 'models.0.pricing.holdMargin' }),
      );
    }
    // only per-token prices are held by an estimate
    expect(() =>
      parsePricingFile(
        'currency: usd\nmodels: [{id: a, pricing: {mode: per_request, perRequest: "1", holdMargin: "1.2"}}]',
      ),
    ).toThrow(expect.objectContaining({ statusCode: 400 }));
  });
});

describe('holds through the server', () => {
  let f: ChatFixture;

  beforeAll(async () => {
    f = await startChatFixture({
      env: { TOLLGATE_ADMIN_TOKEN: ROOT },
      familyMargins: true,
      models: [
        // an explicit margin on a name of no known family
        { id: 'explicit', upstreamModel: 'mock-model', pricing: { ...perToken, holdMargin: '1.25' } },
        // the claude family's default (the mock upstream answers any name)
        { id: 'claude', upstreamModel: 'claude-3-5-sonnet-20241022', pricing: perToken },
        // no known family: the conservative default
        { id: 'unknown', upstreamModel: 'mock-model', pricing: perToken },
        {
          id: 'embed',
          upstreamModel: 'mock-embed',
          pricing: { mode: 'per_token', inputPerMillion: '0.02', holdMargin: '2.5' },
          endpoints: ['embeddings'],
        },
      ],
      settings: { maxCompletionTokens: 100 },
    });
  });
  afterAll(() => f?.close());

  const messages = [{ role: 'user' as const, content: 'Tell me about the weather in Zürich, briefly.' }];
  const counted = countPromptTokens(chatRequestSchema.parse({ model: 'x', messages }));

  it('chat: the hold is the prompt estimate × the margin × the price, plus the completion bound', async () => {
    for (const [model, margin] of [
      ['explicit', '1.25'],
      ['claude', '1.3'],
      ['unknown', '1.9'],
    ] as const) {
      const user = `chat-${model}`;
      await f.fund(user, '1.00');
      await f.client.chat.completions.create({ model, user, messages, max_tokens: 40 });
      await f.settled();
      const bound = promptTokensUpperBound(counted, margin);
      expect(bound).toBe(new Money(counted).times(margin).ceil().toNumber());
      expect([model, (await f.holds(user))[0]!.amount]).toEqual([model, tokenCost(price, bound, 40)]);
    }
    // the margin is visible in the hold: 1.9 holds more than 1.25 for the same request
    expect(promptTokensUpperBound(counted, '1.9')).toBeGreaterThan(promptTokensUpperBound(counted, '1.25'));
  });

  it('streamed chat holds the same', async () => {
    await f.fund('chat-stream', '1.00');
    const stream = await f.client.chat.completions.create({
      model: 'explicit',
      user: 'chat-stream',
      messages,
      max_tokens: 40,
      stream: true,
    });
    for await (const _ of stream) {
      // drain
    }
    await f.settled();
    expect((await f.holds('chat-stream'))[0]!.amount).toBe(
      tokenCost(price, promptTokensUpperBound(counted, '1.25'), 40),
    );
  });

  it('Responses: the input estimate × the margin', async () => {
    await f.fund('resp', '1.00');
    f.mock.requests.length = 0;
    await f.client.responses.create({
      model: 'claude',
      user: 'resp',
      instructions: 'Be brief.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hello there, how are you?' }] }],
      max_output_tokens: 30,
    });
    await f.settled();
    const sent = f.mock.requests[0]!.body;
    const input = countResponsesInput(responsesRequestSchema.parse(sent));
    expect((await f.holds('resp'))[0]!.amount).toBe(
      tokenCost(price, promptTokensUpperBound(input, '1.3'), 30),
    );
  });

  it('embeddings: the input estimate × the margin, no output', async () => {
    await f.fund('embedder', '1.00');
    f.mock.requests.length = 0;
    await f.client.embeddings.create({ model: 'embed', user: 'embedder', input: ['one two three', 'four'] });
    await f.settled();
    const sent = f.mock.requests[0]!.body;
    const input = countEmbeddingInput(embeddingsRequestSchema.parse(sent));
    const embedPrice = { inputPerMillion: new Money('0.02'), outputPerMillion: new Money(0) };
    const bound = promptTokensUpperBound(input, '2.5');
    expect(bound).toBe(Math.ceil((input * 5) / 2));
    expect((await f.holds('embedder'))[0]!.amount).toBe(tokenCost(embedPrice, bound, 0));
  });

  it('shows the margin in force in the model listings (admin API and /v1/models)', async () => {
    const listed = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${f.project.id}/models`);
    expect(listed.status).toBe(200);
    const byId = Object.fromEntries(listed.body.models.map((m: any) => [m.id, m.pricing.holdMargin]));
    expect(byId).toEqual({ claude: '1.3', embed: '2.5', explicit: '1.25', unknown: '1.9' });
    const models = await f.client.models.list();
    const v1 = Object.fromEntries(models.data.map((m: any) => [m.id, m.pricing.holdMargin]));
    expect(v1).toEqual(byId);
  });

  it('shows the margin in `tollgate models list` over the admin API', async () => {
    const run = (...args: string[]) =>
      promisify(execFile)(
        process.execPath,
        ['cmd/tollgate.ts', 'models', 'list', '--project', f.project.id, ...args],
        {
          env: { ...process.env, TOLLGATE_URL: f.server.url, TOLLGATE_ADMIN_TOKEN: ROOT, LOG_LEVEL: 'warn' },
          timeout: 60_000,
        },
      );
    const json = JSON.parse((await run('--json')).stdout);
    expect(json.models.find((m: any) => m.id === 'claude').pricing.holdMargin).toBe('1.3');
    const text = (await run()).stdout;
    expect(text).toContain(
      'claude  claude-3-5-sonnet-20241022  0.15 in / 0.6 out per 1M tokens, prompt estimate held × 1.3  [chat, responses]',
    );
  }, 60_000);

  it('refuses a bad margin over the admin API with a 400 on the field, and changes nothing', async () => {
    for (const holdMargin of ['0.5', 'x', '11']) {
      const res = await api(f.server, ROOT, 'PUT', `/admin/v1/projects/${f.project.id}/models/explicit`, {
        upstreamModel: 'mock-model',
        pricing: { ...perToken, holdMargin },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error.param).toBe('pricing.holdMargin');
    }
    const ok = await api(f.server, ROOT, 'PUT', `/admin/v1/projects/${f.project.id}/models/explicit`, {
      upstreamModel: 'mock-model',
      pricing: { ...perToken, holdMargin: '1.3' },
    });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    const listed = await api(f.server, ROOT, 'GET', `/admin/v1/projects/${f.project.id}/models`);
    expect(listed.body.models.find((m: any) => m.id === 'explicit').pricing.holdMargin).toBe('1.3');
  });
});
