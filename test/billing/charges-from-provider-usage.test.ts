import type OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatForCurrency, Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { countEmbeddingInput, countPromptTokens, countResponsesInput } from '../../src/tokens/inputs.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { scrape, sumOf } from '../helpers/metrics-text.ts';

/**
 * The charge is the provider's usage × the price, always — also when the provider counts more tokens
 * than Tollgate's estimate (a Claude, Llama or Mistral model behind an OpenAI-compatible endpoint): the
 * excess over the hold comes from the balance, and what the balance cannot cover is a debt, recorded,
 * announced and refused until a deposit covers it.
 */
let f: ChatFixture;
const ROOT = 'root-admin-token-0123456789abcdef';
const price = { inputPerMillion: new Money(1000), outputPerMillion: new Money(2000) };
const perToken = { mode: 'per_token' as const, inputPerMillion: '1000', outputPerMillion: '2000' };
const messages = [{ role: 'user' as const, content: 'Say hello to the whole wide world, politely' }];
const responsesInput = 'Say hello to the whole wide world, politely';
const embeddingsInput = ['one sentence to embed', 'and another one'];

/** The provider reports `factor` × what Tollgate counts (input) and × the pieces produced (output). */
const FACTORS = { x1_5: 1.5, x3: 3 } as const;
const PIECES = 5;

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      ...Object.keys(FACTORS).map((name) => ({
        id: `chat-${name}`,
        upstreamModel: `chat-${name}`,
        pricing: perToken,
      })),
      ...Object.keys(FACTORS).map((name) => ({
        id: `resp-${name}`,
        upstreamModel: `resp-${name}`,
        pricing: perToken,
      })),
      ...Object.keys(FACTORS).map((name) => ({
        id: `emb-${name}`,
        upstreamModel: `emb-${name}`,
        pricing: perToken,
        endpoints: ['embeddings' as const],
      })),
      { id: 'issue', upstreamModel: 'issue', pricing: perToken },
      { id: 'quiet', upstreamModel: 'quiet', pricing: perToken },
    ],
    settings: { maxCompletionTokens: 100 },
    env: { TOLLGATE_ADMIN_TOKEN: ROOT },
  });
  const chatCount = countPromptTokens({ model: 'x', messages });
  const respCount = countResponsesInput({ model: 'x', input: responsesInput } as never);
  const embCount = countEmbeddingInput({ model: 'x', input: embeddingsInput } as never);
  for (const [name, factor] of Object.entries(FACTORS)) {
    // (output within the bound the provider receives, 8: above it is an anomaly, usage-bounds.test.ts)
    const output = Math.min(Math.ceil(PIECES * factor), 8);
    f.mock.behaviors.set(`chat-${name}`, {
      promptTokens: Math.ceil(chatCount * factor),
      completionTokens: output,
    });
    f.mock.behaviors.set(`resp-${name}`, {
      promptTokens: Math.ceil(respCount * factor),
      completionTokens: output,
    });
    f.mock.behaviors.set(`emb-${name}`, { promptTokens: Math.ceil(embCount * factor) });
  }
  // The issue's provider: 300 input and 5 output tokens for a short prompt.
  f.mock.behaviors.set('issue', { promptTokens: 300, completionTokens: 5 });
  // A provider that sends no usage: Tollgate counts, and flags the charge as an estimate.
  f.mock.behaviors.set('quiet', { usage: false });
  await f.subscribe(['balance.*']);
});
afterAll(() => f.close());

/** The user's charges, oldest first, with their holds and what the entry says about its usage. */
async function charges(user: string) {
  await f.settled();
  await f.ledger(user); // balance = Σ entries, held = Σ open holds
  const wallet = (await f.wallet(user))!;
  return f.ctx.db
    .selectFrom('ledger_entries as l')
    .innerJoin('holds as h', 'h.id', 'l.hold_id')
    .select(['l.amount', 'l.balance_after', 'l.metadata', 'h.amount as hold'])
    .where('l.user_id', '=', wallet.userId)
    .where('l.kind', '=', 'charge')
    .orderBy('l.id')
    .execute();
}

describe('every API, streaming or not, charges the usage the provider reports', () => {
  for (const [name, factor] of Object.entries(FACTORS)) {
    it(`chat completions with a provider reporting ${factor}× Tollgate's count`, async () => {
      const user = `chat-${name}`;
      await f.fund(user, '100.00');
      const reported: Array<{ prompt: number; completion: number }> = [];
      const plain = await f.client.chat.completions.create({ model: user, user, messages });
      reported.push({ prompt: plain.usage!.prompt_tokens, completion: plain.usage!.completion_tokens });
      const bounded = await f.client.chat.completions.create({ model: user, user, messages, max_tokens: 8 });
      reported.push({ prompt: bounded.usage!.prompt_tokens, completion: bounded.usage!.completion_tokens });
      const stream = await f.client.chat.completions.create({
        model: user,
        user,
        messages,
        max_tokens: 8,
        stream: true,
        stream_options: { include_usage: true },
      });
      let usage: OpenAI.CompletionUsage | undefined | null;
      for await (const chunk of stream) usage = chunk.usage ?? usage;
      reported.push({ prompt: usage!.prompt_tokens, completion: usage!.completion_tokens });

      const entries = await charges(user);
      expect(entries.map((e) => new Money(e.amount).neg().toFixed())).toEqual(
        reported.map((r) => tokenCost(price, r.prompt, r.completion)),
      );
      for (const [i, e] of entries.entries()) {
        expect(e.metadata).toMatchObject({
          usageSource: 'provider',
          inputTokens: reported[i]!.prompt,
          outputTokens: reported[i]!.completion,
        });
      }
      // with max_tokens the estimate is below the reported usage: charged above the hold
      expect(new Money(entries[1]!.amount).neg().gt(entries[1]!.hold)).toBe(true);
    });

    it(`the Responses API with a provider reporting ${factor}× Tollgate's count`, async () => {
      const user = `resp-${name}`;
      await f.fund(user, '100.00');
      const answer = await f.client.responses.create({
        model: user,
        user,
        input: responsesInput,
        max_output_tokens: 8,
      });
      const stream = await f.client.responses.create({
        model: user,
        user,
        input: responsesInput,
        max_output_tokens: 8,
        stream: true,
      });
      let streamed: OpenAI.Responses.ResponseUsage | undefined;
      for await (const event of stream)
        if (event.type === 'response.completed') streamed = event.response.usage;
      const entries = await charges(user);
      expect(entries.map((e) => new Money(e.amount).neg().toFixed())).toEqual(
        [answer.usage!, streamed!].map((u) => tokenCost(price, u.input_tokens, u.output_tokens)),
      );
      expect(entries.every((e) => new Money(e.amount).neg().gt(e.hold))).toBe(true);
    });

    it(`embeddings with a provider reporting ${factor}× Tollgate's count`, async () => {
      const user = `emb-${name}`;
      await f.fund(user, '100.00');
      const answer = await f.client.embeddings.create({ model: user, user, input: embeddingsInput });
      const entries = await charges(user);
      expect(entries.map((e) => new Money(e.amount).neg().toFixed())).toEqual([
        tokenCost(price, answer.usage.prompt_tokens, 0),
      ]);
      expect(new Money(entries[0]!.amount).neg().gt(entries[0]!.hold)).toBe(true);
    });
  }
});

describe('a debt when the reported usage exceeds the balance', () => {
  it('charges the whole usage, goes below zero, refuses with a link for the debt plus the request, and serves again after a deposit', async () => {
    await f.fund('short', '0.20');
    const served = await f.client.chat.completions.create({
      model: 'issue',
      user: 'short',
      messages,
      max_tokens: 50,
    });
    expect(served.usage).toMatchObject({ prompt_tokens: 300, completion_tokens: 5 });
    const [entry] = await charges('short');
    // 300 × 1000/1M + 5 × 2000/1M = 0.31, the issue's number, from a balance of 0.20
    expect(new Money(entry!.amount).neg().toFixed()).toBe('0.31');
    expect(new Money(entry!.balance_after).toFixed()).toBe('-0.11');
    const wallet = await f.wallet('short');
    expect(wallet).toMatchObject({ balance: '-0.11', held: '0', available: '-0.11' });

    // the balance API shows the negative balance as such
    const balance = await fetch(`${f.server.url}/v1/user/balance?user=short`, {
      headers: { authorization: `Bearer ${f.apiKey}` },
    });
    expect(balance.status).toBe(200);
    expect(await balance.json()).toMatchObject({ balance: '-0.11', available: '-0.11' });
    const activity = await fetch(`${f.server.url}/v1/user/activity?user=short`, {
      headers: { authorization: `Bearer ${f.apiKey}` },
    });
    expect(JSON.stringify(await activity.json())).toContain('-0.11');

    expect(await f.events('balance.debt.created')).toEqual([
      expect.objectContaining({
        data: expect.objectContaining({
          externalUserId: 'short',
          amount: '0.11',
          charged: '0.31',
          debt: '0.11',
          balance: '-0.11',
        }),
      }),
    ]);

    // refused, with a top-up link for the debt plus the next request
    f.mock.requests.length = 0;
    const refused = await f.client.chat.completions.create({
      model: 'issue',
      user: 'short',
      messages,
      max_tokens: 50,
    });
    expect(f.mock.requests).toHaveLength(0);
    const paywall = (
      refused as unknown as { paywall: { decision: string; required: string; available: string } }
    ).paywall;
    expect(paywall.decision).toBe('topup_required');
    expect(paywall.available).toBe('-0.11');
    expect(new Money(paywall.required).minus('0.11').toFixed(2)).toBe(
      new Money(entry!.hold).toDecimalPlaces(2, Money.ROUND_UP).toFixed(2),
    );
    expect(refused.choices[0]!.message.content).toContain('/topup/');

    // a deposit covering the debt clears it, and the user is served again
    await f.ctx.billing.deposit({
      project: f.project,
      externalId: 'short',
      amount: '1.00',
      source: 'test',
      trigger: { source: 'test', actorType: 'test', actorId: 'test' },
    });
    const [cleared] = await f.events('balance.debt.cleared');
    expect(cleared).toMatchObject({ data: { amount: '0.11', balance: '0.89' } });
    const again = await f.client.chat.completions.create({
      model: 'issue',
      user: 'short',
      messages,
      max_tokens: 50,
    });
    expect(again.choices[0]!.message.content).toBe(' hello'.repeat(5));
    expect((await f.wallet('short'))!.balance).toBe('0.58');
  });

  it('5×N concurrent requests still serve at most N, and the ledger holds every cent charged', async () => {
    // The hold of one request covers N = 4 of them; each is charged 0.31 (more than its hold).
    const [probe] = await (async () => {
      await f.fund('probe', '10.00');
      await f.client.chat.completions.create({ model: 'issue', user: 'probe', messages, max_tokens: 50 });
      return charges('probe');
    })();
    const holdAmount = new Money(probe!.hold);
    const N = 4;
    const start = holdAmount.times(N).toDecimalPlaces(6, Money.ROUND_UP);
    await f.fund('crowd', start.toFixed());
    const answers = await Promise.all(
      Array.from({ length: 5 * N }, () =>
        f.client.chat.completions.create({ model: 'issue', user: 'crowd', messages, max_tokens: 50 }),
      ),
    );
    const served = answers.filter((a) => !(a as unknown as { paywall?: unknown }).paywall);
    expect(served.length).toBeGreaterThanOrEqual(1);
    expect(served.length).toBeLessThanOrEqual(N);
    const entries = await charges('crowd');
    expect(entries).toHaveLength(served.length);
    expect(entries.every((e) => new Money(e.amount).neg().toFixed() === '0.31')).toBe(true);
    const wallet = (await f.wallet('crowd'))!;
    expect(wallet.balance).toBe(start.minus(new Money('0.31').times(served.length)).toFixed());
    expect(wallet.held).toBe('0');
  });

  it('counts overage and debt in the metrics, per project and model', async () => {
    const samples = await scrape(f.server.url);
    const where = { project: f.project.id, model: 'issue', currency: 'usd' };
    expect(sumOf(samples, 'tollgate_charge_overage_amount_total', where)).toBeGreaterThan(0);
    // the debt of 'short' (0.11), and whatever the crowd's last charges could not cover
    expect(sumOf(samples, 'tollgate_debt_created_amount_total', where)).toBeGreaterThanOrEqual(0.11 - 1e-9);
  });
});

describe('the reconciliation report', () => {
  const report = (query: string) =>
    fetch(`${f.server.url}/admin/v1/projects/${f.project.id}/reports/reconciliation${query}`, {
      headers: { authorization: `Bearer ${ROOT}` },
    });

  it('puts the tokens charged next to the tokens the provider reported, per day and model, as JSON and CSV', async () => {
    await f.fund('rec', '10.00');
    await f.fund('rec-short', '0.20'); // its charge of 0.31 leaves a debt of 0.11
    await f.client.chat.completions.create({ model: 'issue', user: 'rec-short', messages, max_tokens: 50 });
    const served = await f.client.chat.completions.create({
      model: 'issue',
      user: 'rec',
      messages,
      max_tokens: 50,
    });
    const quiet = await f.client.chat.completions.create({
      model: 'quiet',
      user: 'rec',
      messages,
      max_tokens: 50,
    });
    expect(quiet.usage).toBeUndefined();
    await f.settled();

    const res = await report('?days=1');
    expect(res.status).toBe(200);
    const body = (await res.json()) as { currency: string; data: Array<Record<string, string | number>> };
    expect(body.currency).toBe('usd');
    const rows = body.data.filter((r) => r.model === 'issue');
    expect(rows).toHaveLength(1);
    const row = rows[0]!;
    // every 'issue' charge of this file: reported by the provider, 300 input and 5 output tokens each
    const entries = await f.ctx.db
      .selectFrom('ledger_entries')
      .select(['amount', 'metadata'])
      .where('project_id', '=', f.project.id)
      .where('kind', '=', 'charge')
      .execute();
    const issue = entries.filter((e) => (e.metadata as { model?: string }).model === 'issue');
    expect(row).toMatchObject({
      requests: issue.length,
      providerReported: issue.length,
      estimated: 0,
      inputTokens: 300 * issue.length,
      providerInputTokens: 300 * issue.length,
      outputTokens: 5 * issue.length,
      providerOutputTokens: 5 * issue.length,
      amount: formatForCurrency(
        issue.reduce((sum, e) => sum.minus(e.amount), new Money(0)),
        'usd',
      ),
      estimatedAmount: '0.00',
    });
    expect(new Money(row.overage as string).gt(0)).toBe(true);
    expect(new Money(row.debt as string).gte('0.11')).toBe(true);
    expect(served.usage!.prompt_tokens).toBe(300);
    // the request without usage: an estimate, none of its tokens reported by the provider
    const quietRow = body.data.find((r) => r.model === 'quiet')!;
    const counted = countPromptTokens({ model: 'x', messages });
    expect(quietRow).toMatchObject({
      requests: 1,
      providerReported: 0,
      estimated: 1,
      inputTokens: counted,
      outputTokens: PIECES,
      providerInputTokens: 0,
      providerOutputTokens: 0,
      amount: formatForCurrency(tokenCost(price, counted, PIECES), 'usd'),
    });
    expect(quietRow.estimatedAmount).toBe(quietRow.amount);

    const csv = await report('?days=1&format=csv');
    expect(csv.status).toBe(200);
    expect(csv.headers.get('content-type')).toContain('text/csv');
    expect(csv.headers.get('content-disposition')).toContain('attachment');
    const lines = (await csv.text()).trimEnd().split('\r\n');
    expect(lines[0]).toBe(
      'day,model,requests,providerReported,estimated,inputTokens,cachedInputTokens,outputTokens,reasoningTokens,providerInputTokens,providerOutputTokens,amount,estimatedAmount,held,overage,debt,anomalousTokens',
    );
    const issueLine = lines.find((l) => l.split(',')[1] === 'issue')!;
    expect(issueLine.split(',')).toEqual([
      row.day,
      'issue',
      ...[
        'requests',
        'providerReported',
        'estimated',
        'inputTokens',
        'cachedInputTokens',
        'outputTokens',
        'reasoningTokens',
        'providerInputTokens',
        'providerOutputTokens',
        'amount',
        'estimatedAmount',
        'held',
        'overage',
        'debt',
        'anomalousTokens',
      ].map((c) => String(row[c])),
    ]);

    expect((await report('?days=0')).status).toBe(400);
    expect((await report('?format=xml')).status).toBe(400);
  });
});
