import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';

/** Exact charging per pricing mode, the hold rule, and subscriptions. */
let f: ChatFixture;

const IN = '0.15';
const OUT = '0.6';
const price = { inputPerMillion: new Money(IN), outputPerMillion: new Money(OUT) };
const messages = [{ role: 'user' as const, content: 'Say hello' }];

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      {
        id: 'per-request',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_request', perRequest: '0.25' },
      },
      {
        id: 'per-token',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_token', inputPerMillion: IN, outputPerMillion: OUT },
      },
      {
        id: 'per-token-no-usage',
        upstreamModel: 'no-usage',
        pricing: { mode: 'per_token', inputPerMillion: IN, outputPerMillion: OUT },
      },
      {
        id: 'pricey',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_token', inputPerMillion: '1000', outputPerMillion: '2000' },
      },
      {
        id: 'pro',
        upstreamModel: 'mock-model',
        pricing: { mode: 'subscription', fee: '3.00', period: '30d' },
      },
      {
        id: 'o-model',
        upstreamModel: 'o3-mini',
        pricing: { mode: 'per_token', inputPerMillion: IN, outputPerMillion: OUT },
      },
    ],
    settings: { maxCompletionTokens: 100 },
  });
  f.mock.behaviors.set('no-usage', { usage: false });
});
afterAll(() => f.close());

/** Three chat completions of `model` for `user`, each answered with the mock's text. */
async function chatThreeTimes(model: string, user: string) {
  for (let i = 0; i < 3; i++) {
    const reply = await f.client.chat.completions.create({ model, user, messages });
    expect(reply.choices[0]!.message.content).toBe(' hello'.repeat(5));
  }
}

describe('per request', () => {
  it('charges the price once per request, through a hold settled at the price', async () => {
    await f.fund('pr', '1.00');
    await chatThreeTimes('per-request', 'pr');
    await f.settled();
    const entries = await f.ledger('pr');
    expect(chargedTotal(entries)).toBe('0.75');
    expect(entries.map((e) => e.kind)).toEqual(['deposit', 'charge', 'charge', 'charge']);
    const holds = await f.holds('pr');
    expect(holds.map((h) => [h.amount, h.status])).toEqual(Array(3).fill(['0.25', 'settled']));
    expect(await f.wallet('pr')).toMatchObject({ balance: '0.25', held: '0' });
  });
});

describe('per token', () => {
  it('charges input × in/1M + output × out/1M from the provider usage, exactly', async () => {
    await f.fund('pt', '1.00');
    await f.client.chat.completions.create({ model: 'per-token', user: 'pt', messages });
    await f.settled();
    // 12 prompt tokens and 5 completion tokens reported by the provider
    const expected = new Money(12).times(IN).plus(new Money(5).times(OUT)).div(1e6).toFixed();
    expect(expected).toBe('0.0000048');
    expect(chargedTotal(await f.ledger('pt'))).toBe(expected);
    expect((await f.wallet('pt'))!.balance).toBe('0.9999952');
  });

  it('holds the prompt (counted, with margin) plus the completion bound, and sends the bound upstream', async () => {
    await f.fund('hold', '1.00');
    f.mock.requests.length = 0;
    await f.client.chat.completions.create({ model: 'per-token', user: 'hold', messages });
    await f.client.chat.completions.create({ model: 'per-token', user: 'hold', messages, max_tokens: 7 });
    await f.client.chat.completions.create({
      model: 'per-token',
      user: 'hold',
      messages,
      max_completion_tokens: 9,
    });
    await f.client.chat.completions.create({ model: 'o-model', user: 'hold', messages });
    await f.settled();
    const [projectCap, clientMax, clientMaxCompletion, reasoning] = f.mock.requests.map((r) => r.body);
    expect(projectCap.max_tokens).toBe(100); // the project's maxCompletionTokens
    expect(clientMax.max_tokens).toBe(7);
    expect(clientMaxCompletion).toMatchObject({ max_completion_tokens: 9 });
    expect(clientMaxCompletion.max_tokens).toBeUndefined();
    expect(reasoning).toMatchObject({ model: 'o3-mini', max_completion_tokens: 100 });
    expect(reasoning.max_tokens).toBeUndefined();

    const holds = await f.ctx.db
      .selectFrom('holds')
      .select(['amount', 'status'])
      .where('project_id', '=', f.project.id)
      .where('user_id', '=', (await f.wallet('hold'))!.userId)
      .orderBy('id')
      .execute();
    const prompt = promptTokensUpperBound(countPromptTokens({ model: 'x', messages }));
    expect(holds.map((h) => new Money(h.amount).toFixed())).toEqual([
      tokenCost(price, prompt, 100),
      tokenCost(price, prompt, 7),
      tokenCost(price, prompt, 9),
      tokenCost(price, prompt, 100),
    ]);
    expect(holds.every((h) => h.status === 'settled')).toBe(true);
  });

  it('multiplies the completion bound by n', async () => {
    await f.fund('multi', '1.00');
    await f.client.chat.completions.create({
      model: 'per-token',
      user: 'multi',
      messages,
      max_tokens: 10,
      n: 3,
    });
    await f.settled();
    const hold = await f.ctx.db
      .selectFrom('holds')
      .select('amount')
      .where('user_id', '=', (await f.wallet('multi'))!.userId)
      .executeTakeFirstOrThrow();
    const prompt = promptTokensUpperBound(countPromptTokens({ model: 'x', messages }));
    expect(new Money(hold.amount).toFixed()).toBe(tokenCost(price, prompt, 30));
  });

  it('counts tokens with the tokenizer when the provider reports no usage (streaming or not)', async () => {
    await f.fund('nousage', '1.00');
    await f.client.chat.completions.create({ model: 'per-token-no-usage', user: 'nousage', messages });
    const stream = await f.client.chat.completions.create({
      model: 'per-token-no-usage',
      user: 'nousage',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    });
    let usage: any;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    await f.settled();
    const prompt = countPromptTokens({ model: 'x', messages });
    // Tollgate reports the usage it counted when the provider sent none and the client asked for it
    expect(usage).toMatchObject({ prompt_tokens: prompt, completion_tokens: 5 });
    const one = tokenCost(price, prompt, 5);
    expect(chargedTotal(await f.ledger('nousage'))).toBe(new Money(one).times(2).toFixed());
  });

  it('gives a top-up link, without calling the provider, when the balance cannot cover the hold', async () => {
    await f.fund('poor', '0.02');
    f.mock.requests.length = 0;
    // the hold is (prompt + 100 tokens) at 1000/2000 per million: more than 0.02
    const reply = await f.client.chat.completions.create({ model: 'pricey', user: 'poor', messages });
    expect(reply.choices[0]!.message.content).toContain('/topup/');
    const hold = tokenCost(
      { inputPerMillion: new Money(1000), outputPerMillion: new Money(2000) },
      promptTokensUpperBound(countPromptTokens({ model: 'x', messages })),
      100,
    );
    // shown rounded up to the currency's minor unit
    const required = new Money(hold).toDecimalPlaces(2, Money.ROUND_UP).toFixed(2);
    expect((reply as any).paywall).toMatchObject({ required, available: '0.02' });
    expect(f.mock.requests).toHaveLength(0);
    // a smaller bound fits the balance: the same user is served
    const small = await f.client.chat.completions.create({
      model: 'pricey',
      user: 'poor',
      messages,
      max_tokens: 1,
    });
    expect(small.choices[0]!.message.content).toBe(' hello');
    await f.settled();
    const entries = await f.ledger('poor');
    // The mock reports 12 prompt tokens, more than the hold assumed: the charge is the reported usage,
    // the excess over the hold taken from the balance.
    const pricey = { inputPerMillion: new Money(1000), outputPerMillion: new Money(2000) };
    const real = tokenCost(pricey, 12, 1);
    const held = tokenCost(pricey, promptTokensUpperBound(countPromptTokens({ model: 'x', messages })), 1);
    expect(new Money(real).gt(held)).toBe(true);
    expect(chargedTotal(entries)).toBe(real);
  });
});

describe('subscription', () => {
  async function periods(user: string) {
    return f.ctx.db
      .selectFrom('model_subscriptions')
      .selectAll()
      .where('user_id', '=', (await f.wallet(user))!.userId)
      .execute();
  }

  it('charges the fee when a period starts, then serves free until it ends, then renews', async () => {
    await f.fund('sub', '7.00');
    await chatThreeTimes('pro', 'sub');
    await f.settled();
    let entries = await f.ledger('sub');
    expect(chargedTotal(entries, 'subscription')).toBe('3');
    expect(await f.holds('sub')).toHaveLength(0);
    const [period] = await periods('sub');
    expect(period!.period_end.getTime() - period!.period_start.getTime()).toBe(30 * 86_400_000);

    // the period ends: the next request starts a new one
    await f.ctx.db
      .updateTable('model_subscriptions')
      .set({ period_start: new Date(Date.now() - 31 * 86_400_000), period_end: new Date(Date.now() - 1000) })
      .where('user_id', '=', period!.user_id)
      .execute();
    await f.client.chat.completions.create({ model: 'pro', user: 'sub', messages });
    entries = await f.ledger('sub');
    expect(chargedTotal(entries, 'subscription')).toBe('6');
    expect((await periods('sub'))[0]!.periods).toBe(2);

    // the next renewal cannot be paid (1.00 left): top-up link with the fee
    await f.ctx.db
      .updateTable('model_subscriptions')
      .set({ period_start: new Date(Date.now() - 31 * 86_400_000), period_end: new Date(Date.now() - 1000) })
      .where('user_id', '=', period!.user_id)
      .execute();
    f.mock.requests.length = 0;
    const refused = await f.client.chat.completions.create({ model: 'pro', user: 'sub', messages });
    expect(refused.choices[0]!.message.content).toContain('/topup/');
    expect((refused as any).paywall).toMatchObject({ required: '3.00', available: '1.00' });
    expect(f.mock.requests).toHaveLength(0);
    expect((await f.wallet('sub'))!.balance).toBe('1');
  });

  it('charges one fee when first requests arrive together', async () => {
    await f.fund('subrace', '10.00');
    const replies = await Promise.all(
      Array.from({ length: 8 }, () =>
        f.client.chat.completions.create({ model: 'pro', user: 'subrace', messages }),
      ),
    );
    expect(replies.every((r) => r.choices[0]!.message.content === ' hello'.repeat(5))).toBe(true);
    expect(chargedTotal(await f.ledger('subrace'), 'subscription')).toBe('3');
  });

  it('a user who is not connected gets the connect link', async () => {
    const reply = await f.client.chat.completions.create({ model: 'pro', user: 'subnobody', messages });
    expect(reply.choices[0]!.message.content).toContain('/connect/');
  });
});
