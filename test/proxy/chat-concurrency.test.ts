import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';

/**
 * No overspend, ever: a balance that covers exactly N requests, 5×N concurrent requests → at most N are
 * served, the rest get the top-up link, and the ledger adds up to the balance to the last decimal. The
 * requests meet in group-commit batches; on Postgres and on the embedded database, with a hold per request
 * and with escrow's slices (src/billing/escrow.ts).
 */
let f: ChatFixture;
const N = 5;
const messages = [{ role: 'user' as const, content: 'Tell me something' }];
const price = { inputPerMillion: new Money('0.15'), outputPerMillion: new Money('0.6') };
const MAX = 5;
const promptUpper = promptTokensUpperBound(countPromptTokens({ model: 'x', messages }));

async function start(env: Record<string, string>) {
  f = await startChatFixture({
    env,
    models: [
      { id: 'per-request', upstreamModel: 'quick', pricing: { mode: 'per_request', perRequest: '0.07' } },
      {
        id: 'per-token',
        upstreamModel: 'exact',
        pricing: { mode: 'per_token', inputPerMillion: '0.15', outputPerMillion: '0.6' },
      },
    ],
  });
  f.mock.behaviors.set('quick', { chunkDelayMs: 5 });
  // The provider uses exactly what the hold pays for, so the real cost of a request equals its hold.
  f.mock.behaviors.set('exact', { promptTokens: promptUpper, tokens: MAX, chunkDelayMs: 5 });
}

async function race(model: string, user: string, perRequestCost: string) {
  const balance = new Money(perRequestCost).times(N).toFixed();
  await f.fund(user, balance);
  const before = f.mock.requests.length;
  const results = await Promise.all(
    Array.from({ length: 5 * N }, async (_, i) => {
      const stream = i % 2 === 1;
      if (!stream) {
        const reply = await f.client.chat.completions.create({ model, user, messages, max_tokens: MAX });
        return reply.choices[0]!.message.content!;
      }
      const chunks = await f.client.chat.completions.create({
        model,
        user,
        messages,
        max_tokens: MAX,
        stream: true,
      });
      let text = '';
      for await (const chunk of chunks) text += chunk.choices[0]?.delta.content ?? '';
      return text;
    }),
  );
  await f.settled();
  const served = results.filter((r) => r === ' hello'.repeat(MAX)).length;
  const toppedUp = results.filter((r) => r.includes('/topup/')).length;
  expect(served + toppedUp).toBe(5 * N);
  expect(served).toBeLessThanOrEqual(N);
  expect(served).toBeGreaterThan(0);
  expect(f.mock.requests.length - before).toBe(served);

  await f.giveBack(user); // escrow: the rest of the pod's slice comes back (as when idle)
  const entries = await f.ledger(user); // checks balance = Σ entries and held = Σ open holds
  const wallet = (await f.wallet(user))!;
  expect(wallet.held).toBe('0');
  const charged = chargedTotal(entries);
  expect(charged).toBe(new Money(perRequestCost).times(served).toFixed());
  expect(new Money(wallet.balance).plus(charged).toFixed()).toBe(balance);
  return { served, wallet };
}

const escrow = { ESCROW_IDLE_MS: '30000', ESCROW_SLICE_REQUESTS: '16' };

describe.each([
  ['Postgres', {}],
  ['Postgres with escrow (slices of 16 requests, given back when idle)', escrow],
  ['the embedded database', { DATABASE_URL: '' }],
  ['the embedded database with escrow', { ...escrow, DATABASE_URL: '' }],
])('no overspend under concurrency, on %s', (_name, env: Record<string, string>) => {
  beforeAll(() => start(env));
  afterAll(() => f.close());

  it('per request: exactly N of 5×N concurrent requests are served, to the last decimal', async () => {
    const { served, wallet } = await race('per-request', 'racer-pr', '0.07');
    expect(served).toBe(N);
    expect(wallet.balance).toBe('0');
  });

  it('per token: at most N served when the balance covers N requests at their bound', async () => {
    const cost = tokenCost(price, promptUpper, MAX);
    const { served, wallet } = await race('per-token', 'racer-pt', cost);
    expect(served).toBe(N);
    expect(wallet.balance).toBe('0');
  });
});
