import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { familyLimits, modelLimitsOf } from '../../src/models/output-limits.ts';
import { setProjectLimits } from '../../src/models/service.ts';
import { countPromptTokens, countResponsesInput } from '../../src/tokens/inputs.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { scrape, sumOf } from '../helpers/metrics-text.ts';
import { api } from '../helpers/server.ts';

/**
 * Every admission has a worst case known before forwarding (issue 35): the provider receives only the
 * bound the hold covered; a request without a bound gets the model's real output limit; a Responses
 * chain is held at its recorded size (an unknown one at the context window); and reported usage above
 * the bounds is an anomaly — charged up to the bounds, recorded as an event, a metric and in the ledger.
 * The provider is a loopback mock whose reported usage each test sets; the client is the official
 * `openai` package.
 */
let f: ChatFixture;
const perToken = (inputPerMillion: string, outputPerMillion: string) => ({
  mode: 'per_token' as const,
  inputPerMillion,
  outputPerMillion,
  holdMargin: '1',
});
const price = (input: string, output: string) => ({
  inputPerMillion: new Money(input),
  outputPerMillion: new Money(output),
});
const BOUNDED = price('1000', '2000');
const CHAIN = price('1000', '1000');
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const PROMPT = countPromptTokens({ model: 'x', messages });
/** The 20 000-token chain's first response (made by the chain tests). */
let first = '';

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'bounded', upstreamModel: 'bounded', pricing: perToken('1000', '2000') },
      { id: 'gpt5', upstreamModel: 'gpt-5-mini', pricing: perToken('0.25', '2') },
      {
        id: 'limited',
        upstreamModel: 'limited',
        pricing: perToken('1000', '2000'),
        maxOutputTokens: 777,
        contextWindow: 1000,
      },
      { id: 'chain', upstreamModel: 'chain', pricing: perToken('1000', '1000'), contextWindow: 50_000 },
    ],
  });
  await f.subscribe(['usage.anomaly']);
});
afterAll(() => f.close());

/** The last request the provider received. */
const lastRequest = () => f.mock.requests.at(-1)!.body;
const balanceOf = async (user: string) => (await f.wallet(user))!.balance;
/** The amount of the user's latest hold. */
const lastHold = async (user: string) => {
  await f.settled();
  return (await f.holds(user)).at(-1)!.amount;
};

describe('the provider receives only the bound the hold covered', () => {
  it('max_completion_tokens 10 beside max_tokens 4000: held and forwarded 10, charged for 10 (0.05 stays above 0)', async () => {
    await f.fund('two-bounds', '0.05');
    f.mock.behaviors.set('bounded', { tokens: 4000 });
    const answer = await f.client.chat.completions.create({
      model: 'bounded',
      user: 'two-bounds',
      messages,
      max_completion_tokens: 10,
      max_tokens: 4000,
    });
    const sent = lastRequest();
    expect(sent.max_completion_tokens).toBe(10);
    expect('max_tokens' in sent).toBe(false);
    expect(answer.usage!.completion_tokens).toBe(10);
    expect(await lastHold('two-bounds')).toBe(tokenCost(BOUNDED, PROMPT, 10));
    // 12 × 0.001 + 10 × 0.002 = 0.032
    expect(await balanceOf('two-bounds')).toBe('0.018');
  });

  it('n choices: the bound is held n times and forwarded once; the provider receives n as sent', async () => {
    await f.fund('choices', '1.00');
    f.mock.behaviors.set('bounded', { tokens: 10 });
    await f.client.chat.completions.create({
      model: 'bounded',
      user: 'choices',
      messages,
      max_tokens: 10,
      n: 3,
    });
    expect(lastRequest()).toMatchObject({ max_tokens: 10, n: 3 });
    expect(await lastHold('choices')).toBe(tokenCost(BOUNDED, PROMPT, 30));
    // 12 × 0.001 + 30 × 0.002 = 0.072
    expect(await balanceOf('choices')).toBe('0.928');
  });
});

describe("no client bound: the model's real output limit", () => {
  it("a gpt-5 model gets its family's 128 000 (max_completion_tokens), on Chat and Responses", async () => {
    await f.fund('no-bound', '5.00');
    f.mock.behaviors.delete('gpt-5-mini');
    await f.client.chat.completions.create({ model: 'gpt5', user: 'no-bound', messages });
    expect(lastRequest().max_completion_tokens).toBe(128_000);
    expect('max_tokens' in lastRequest()).toBe(false);
    expect(await lastHold('no-bound')).toBe(tokenCost(price('0.25', '2'), PROMPT, 128_000));
    await f.client.responses.create({ model: 'gpt5', user: 'no-bound', input: 'Say hello' });
    expect(lastRequest().max_output_tokens).toBe(128_000);
  });

  it("the pricing file's maxOutputTokens", async () => {
    await f.fund('file-bound', '5.00');
    await f.client.chat.completions.create({ model: 'limited', user: 'file-bound', messages });
    expect(lastRequest().max_tokens).toBe(777);
    expect(await lastHold('file-bound')).toBe(tokenCost(BOUNDED, PROMPT, 777));
  });
});

describe('usage above the bounds is an anomaly: charged up to the bounds, recorded', () => {
  it('1e9 completion tokens reported for a bound of 100: charged 100, event, metric, ledger metadata', async () => {
    await f.fund('anomaly', '1.00');
    f.mock.behaviors.set('bounded', { completionTokens: 1e9 });
    const answer = await f.client.chat.completions.create({
      model: 'bounded',
      user: 'anomaly',
      messages,
      max_tokens: 100,
    });
    expect(answer.usage!.completion_tokens).toBe(1e9); // relayed as the provider said
    await f.settled();
    // 12 × 0.001 + 100 × 0.002 = 0.212 (not 2 000 000.012)
    expect(await balanceOf('anomaly')).toBe('0.788');
    const [event] = (await f.events('usage.anomaly')).filter((e) => e.data.excessOutputTokens === 1e9 - 100);
    expect(event.data).toMatchObject({
      api: 'chat',
      model: 'bounded',
      reportedOutputTokens: 1e9,
      outputBound: 100,
      excessOutputTokens: 999_999_900,
      excessInputTokens: 0,
    });
    const entries = await f.ledger('anomaly');
    expect(entries.at(-1)).toMatchObject({ kind: 'charge', amount: '-0.212' });
    const metrics = await scrape(f.server.url);
    expect(sumOf(metrics, 'tollgate_usage_anomalies_total', { model: 'bounded', kind: 'output' })).toBe(1);
    expect(
      sumOf(metrics, 'tollgate_usage_anomalous_tokens_total', { model: 'bounded', kind: 'output' }),
    ).toBe(999_999_900);
  });

  it('input above the context window is charged at the window', async () => {
    await f.fund('wide', '5.00');
    f.mock.behaviors.set('limited', { promptTokens: 5000, completionTokens: 5 });
    await f.client.chat.completions.create({ model: 'limited', user: 'wide', messages, max_tokens: 10 });
    await f.settled();
    // 1000 × 0.001 + 5 × 0.002 = 1.01
    expect(await balanceOf('wide')).toBe('3.99');
    const events = await f.events('usage.anomaly');
    expect(events.find((e) => e.data.model === 'limited').data).toMatchObject({
      reportedInputTokens: 5000,
      inputBound: 1000,
      excessInputTokens: 4000,
      excessOutputTokens: 0,
    });
  });

  it('within the bounds the charge is the usage × the price', async () => {
    await f.fund('within', '1.00');
    f.mock.behaviors.set('bounded', { completionTokens: 100, promptTokens: 40 });
    await f.client.chat.completions.create({ model: 'bounded', user: 'within', messages, max_tokens: 100 });
    await f.settled();
    expect(await balanceOf('within')).toBe(new Money('1').minus(tokenCost(BOUNDED, 40, 100)).toFixed());
    expect((await f.events('usage.anomaly')).filter((e) => e.data.model === 'bounded')).toHaveLength(1);
  });
});

describe('Responses chains are held at their known size', () => {
  const input = 'Go on';
  const counted = countResponsesInput({ model: 'x', input } as never);

  it('a 20 000-token chain: 0.12 is refused with the top-up link, not taken to −19.98', async () => {
    await f.fund('chain-owner', '25.00');
    f.mock.behaviors.set('chain', { promptTokens: 19_990, completionTokens: 10 });
    const r1 = await f.client.responses.create({
      model: 'chain',
      user: 'chain-owner',
      input,
      max_output_tokens: 16,
    });
    first = r1.id;
    await f.settled();
    expect(await balanceOf('chain-owner')).toBe('5');
    const row = await f.ctx.db
      .selectFrom('response_chains')
      .selectAll()
      .where('response_id', '=', first)
      .executeTakeFirstOrThrow();
    expect(Number(row.tokens)).toBe(20_000);

    await f.fund('chain-poor', '0.12');
    const sent = f.mock.requests.length;
    const refused = (await f.client.responses.create({
      model: 'chain',
      user: 'chain-poor',
      input,
      max_output_tokens: 16,
      previous_response_id: first,
    })) as unknown as { paywall: { decision: string; url: string } };
    expect(refused.paywall.decision).toBe('topup_required');
    expect(refused.paywall.url).toMatch(/^http/);
    expect(f.mock.requests.length).toBe(sent); // nothing forwarded
    expect(await balanceOf('chain-poor')).toBe('0.12');
  });

  it('held at input + the recorded 20 000, charged the usage', async () => {
    await f.fund('chain-owner', '20.00');
    f.mock.behaviors.set('chain', { promptTokens: 20_012, completionTokens: 5 });
    await f.client.responses.create({
      model: 'chain',
      user: 'chain-owner',
      input,
      max_output_tokens: 16,
      previous_response_id: first,
    });
    expect(await lastHold('chain-owner')).toBe(tokenCost(CHAIN, counted + 20_000, 16));
    // 25.00 − (20 012 + 5) × 0.001
    expect(await balanceOf('chain-owner')).toBe('4.983');
  });

  it('an unknown chain is held at the context window (refused when it exceeds the available balance)', async () => {
    await f.fund('chain-unknown', '100.00');
    f.mock.behaviors.set('chain', { promptTokens: 100, completionTokens: 5 });
    await f.client.responses.create({
      model: 'chain',
      user: 'chain-unknown',
      input,
      max_output_tokens: 16,
      previous_response_id: 'resp_made_elsewhere',
    });
    expect(await lastHold('chain-unknown')).toBe(tokenCost(CHAIN, 50_000, 16)); // 50.016
    await f.fund('chain-short', '50.00');
    const refused = (await f.client.responses.create({
      model: 'chain',
      user: 'chain-short',
      input,
      max_output_tokens: 16,
      previous_response_id: 'resp_made_elsewhere',
    })) as unknown as { paywall: { decision: string } };
    expect(refused.paywall.decision).toBe('topup_required');
    expect(await balanceOf('chain-short')).toBe('50');
  });

  it('a conversation is held at its latest recorded answer', async () => {
    await f.fund('conversation', '100.00');
    f.mock.behaviors.set('chain', { promptTokens: 300, completionTokens: 5 });
    const opts = { model: 'chain', user: 'conversation', input, max_output_tokens: 16 } as const;
    await f.client.responses.create({ ...opts, conversation: 'conv_T' });
    expect(await lastHold('conversation')).toBe(tokenCost(CHAIN, 50_000, 16)); // not known yet
    await f.client.responses.create({ ...opts, conversation: { id: 'conv_T' } });
    expect(await lastHold('conversation')).toBe(tokenCost(CHAIN, counted + 305, 16));
    // streamed: the ids come from the stream's events
    const stream = await f.client.responses.create({ ...opts, conversation: 'conv_T', stream: true });
    for await (const _ of stream);
    await f.settled();
    const rows = await f.ctx.db
      .selectFrom('response_chains')
      .select('tokens')
      .where('conversation_id', '=', 'conv_T')
      .execute();
    expect(rows.map((r) => Number(r.tokens))).toEqual([305, 305, 305]);
  });
});

describe('spend caps reserve the worst case the hold covers', () => {
  it('a 0.50 daily cap: a request continuing the 20 000-token chain is refused, not served to 80.40', async () => {
    await setProjectLimits(f.ctx.db, f.project.id, { spend: { daily: '0.50' } });
    await f.ctx.projects.changed(f.project.id);
    await f.fund('capped', '100.00');
    const sent = f.mock.requests.length;
    const answer = (await f.client.responses.create({
      model: 'chain',
      user: 'capped',
      input: 'Go on',
      max_output_tokens: 16,
      previous_response_id: first,
    })) as unknown as { paywall: { decision: string } };
    expect(answer.paywall.decision).toBe('spend_cap_reached');
    expect(f.mock.requests.length).toBe(sent);
    expect(await balanceOf('capped')).toBe('100');
  });
});

describe("the project's maxCompletionTokens caps the model's output limit", () => {
  it('a gpt-5 model in a project capped at 500 is held and forwarded 500; a client bound is kept', async () => {
    const capped = await startChatFixture({
      models: [{ id: 'gpt5', upstreamModel: 'gpt-5', pricing: perToken('1', '2') }],
      settings: { maxCompletionTokens: 500 },
    });
    try {
      await capped.fund('u', '1.00');
      await capped.client.chat.completions.create({ model: 'gpt5', user: 'u', messages });
      expect(capped.mock.requests.at(-1)!.body.max_completion_tokens).toBe(500);
      await capped.client.chat.completions.create({ model: 'gpt5', user: 'u', messages, max_tokens: 900 });
      expect(capped.mock.requests.at(-1)!.body.max_tokens).toBe(900);
    } finally {
      await capped.close();
    }
  });

  it('the admin API sets, checks and lists maxOutputTokens and contextWindow', async () => {
    const root = 'root-admin-token-0123456789abcdef';
    const admin = await startChatFixture({ models: [], env: { TOLLGATE_ADMIN_TOKEN: root } });
    try {
      const path = `/admin/v1/projects/${admin.project.id}/models/big`;
      const pricing = perToken('1', '2');
      const bad = await api(admin.server, root, 'PUT', path, { pricing, maxOutputTokens: 0 });
      expect(bad.status).toBe(400);
      expect(JSON.stringify(bad.body)).toContain('maxOutputTokens');
      const ok = await api(admin.server, root, 'PUT', path, {
        upstreamModel: 'mock-model',
        pricing,
        maxOutputTokens: 2048,
        contextWindow: 32_000,
      });
      expect(ok.status).toBe(200);
      const listed = await api(admin.server, root, 'GET', `/admin/v1/projects/${admin.project.id}/models`);
      expect(listed.body.models[0]).toMatchObject({
        id: 'big',
        maxOutputTokens: 2048,
        contextWindow: 32_000,
      });
      await admin.fund('u', '1.00');
      await admin.client.chat.completions.create({ model: 'big', user: 'u', messages });
      expect(admin.mock.requests.at(-1)!.body.max_tokens).toBe(2048);
    } finally {
      await admin.close();
    }
  });

  it('the family table: published limits, the fallback for unknown names', () => {
    expect(familyLimits('gpt-5.1-codex')).toEqual({ maxOutputTokens: 128_000, contextWindow: 400_000 });
    expect(familyLimits('openai/gpt-4o-mini')).toEqual({ maxOutputTokens: 16_384, contextWindow: 128_000 });
    expect(familyLimits('o4-mini')).toEqual({ maxOutputTokens: 100_000, contextWindow: 200_000 });
    expect(familyLimits('anthropic.claude-sonnet-4-5-20250929-v1:0')).toEqual({
      maxOutputTokens: 64_000,
      contextWindow: 200_000,
    });
    expect(familyLimits('claude-opus-4-1')).toEqual({ maxOutputTokens: 32_000, contextWindow: 200_000 });
    expect(familyLimits('claude-opus-5-5')).toEqual({ maxOutputTokens: 64_000, contextWindow: 200_000 });
    expect(familyLimits('claude-3-opus-20240229')).toEqual({
      maxOutputTokens: 4_096,
      contextWindow: 200_000,
    });
    expect(familyLimits('llama-3.3-70b')).toBeUndefined();
    const row = { max_output_tokens: null, context_window: null, upstream_model: 'my-model', routes: null };
    expect(modelLimitsOf(row, 4096)).toEqual({
      maxOutputTokens: 4096,
      contextWindow: 128_000,
      source: 'fallback',
    });
  });
});
