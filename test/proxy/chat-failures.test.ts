import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';
import type { MockBehavior } from '../helpers/mock-upstream.ts';
import { seedProject } from '../helpers/server.ts';

/** Upstream failures (502/504, hold released, nothing charged), client disconnects and the completion bound. */
let f: ChatFixture;

const price = { inputPerMillion: new Money('0.15'), outputPerMillion: new Money('0.6') };
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const TIMEOUT_MS = 400;

const behaviors: Record<string, MockBehavior> = {
  fail500: { failStatus: 500 },
  fail429: { failStatus: 429 },
  fail401: { failStatus: 401 },
  fail400: { failStatus: 400 },
  stall: { stall: true },
  'stall-mid': { stallAfterChunks: 2, tokens: 10 },
  malformed: { malformed: true },
  truncated: { truncateAfterChunks: 2, tokens: 10 },
  slow: { tokens: 40, chunkDelayMs: 40, usage: false },
  runaway: { tokens: 50, ignoreMaxTokens: true, chunkDelayMs: 2 },
};

beforeAll(async () => {
  f = await startChatFixture({
    models: ['ok', ...Object.keys(behaviors)].map((name) => ({
      id: name,
      upstreamModel: name,
      pricing: { mode: 'per_token' as const, inputPerMillion: '0.15', outputPerMillion: '0.6' },
    })),
    env: { UPSTREAM_RESPONSE_TIMEOUT_MS: String(TIMEOUT_MS), HOLD_TTL_SECONDS: '60' },
  });
  for (const [name, behavior] of Object.entries(behaviors)) f.mock.behaviors.set(name, behavior);
});
afterAll(() => f.close());

/** Funds a fresh user and returns a check that the request left the wallet untouched. */
async function freshUser(name: string) {
  await f.fund(name, '5.00');
  return async () => {
    await f.settled();
    expect(await f.wallet(name)).toMatchObject({ balance: '5', held: '0' });
    const entries = await f.ledger(name);
    expect(entries.filter((e) => e.kind === 'charge')).toHaveLength(0);
    // every hold closed without a charge: released by its request, or expired by the sweeper
    expect((await f.holds(name)).filter((h) => h.status === 'open' || h.status === 'settled')).toEqual([]);
  };
}

/**
 * Funds a fresh user and returns a check that the request was charged for what reached the client only:
 * the prompt and `outputs[i]` output tokens per stream, counted by Tollgate (the provider's usage never
 * came) and flagged so on the entries.
 */
async function partlyServedUser(name: string) {
  await f.fund(name, '5.00');
  return async (outputs: number[]) => {
    await f.settled();
    const prompt = countPromptTokens({ model: 'x', messages });
    const charges = (await f.ledger(name)).filter((e) => e.kind === 'charge');
    expect(charges.map((e) => new Money(e.amount).neg().toFixed())).toEqual(
      outputs.map((n) => tokenCost(price, prompt, n)),
    );
    const metadata = await f.ctx.db
      .selectFrom('ledger_entries')
      .select('metadata')
      .where('user_id', '=', (await f.wallet(name))!.userId)
      .where('kind', '=', 'charge')
      .execute();
    for (const { metadata: m } of metadata) {
      expect(m).toMatchObject({ usageSource: 'tollgate', outcome: 'upstream_error' });
    }
    expect((await f.holds(name)).filter((h) => h.status === 'open')).toEqual([]);
  };
}

async function collect(stream: AsyncIterable<OpenAI.ChatCompletionChunk>): Promise<string> {
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
  return text;
}

/** The error a stream of `model` for `user` ends with, read to its end. */
async function streamError(model: string, user: string) {
  const stream = await f.client.chat.completions.create({ model, user, messages, stream: true });
  return collect(stream).catch((e) => e);
}

describe('upstream errors', () => {
  it('a provider 500 becomes a 502 in OpenAI shape; the hold is released and nothing charged', async () => {
    const untouched = await freshUser('e500');
    for (const stream of [false, true]) {
      const err = await f.client.chat.completions
        .create({ model: 'fail500', user: 'e500', messages, stream } as any)
        .catch((e) => e);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.status).toBe(502);
      expect(err.code).toBe('upstream_error');
      expect(err.message).toContain('mock failure 500');
    }
    await untouched();
  });

  it('maps 429 to 429, a refused provider key to 502, a rejected request to its 4xx', async () => {
    const untouched = await freshUser('e4xx');
    const rate = await f.client.chat.completions
      .create({ model: 'fail429', user: 'e4xx', messages })
      .catch((e) => e);
    expect(rate).toBeInstanceOf(OpenAI.RateLimitError);
    const auth = await f.client.chat.completions
      .create({ model: 'fail401', user: 'e4xx', messages })
      .catch((e) => e);
    expect(auth.status).toBe(502);
    expect(auth.code).toBe('upstream_auth_failed');
    const bad = await f.client.chat.completions
      .create({ model: 'fail400', user: 'e4xx', messages })
      .catch((e) => e);
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect(bad.code).toBe('upstream_rejected');
    await untouched();
  });

  it('a provider that does not answer in time gives 504 (streaming or not)', async () => {
    const untouched = await freshUser('estall');
    for (const stream of [false, true]) {
      const started = Date.now();
      const err = await f.client.chat.completions
        .create({ model: 'stall', user: 'estall', messages, stream } as any)
        .catch((e) => e);
      expect(err.status).toBe(504);
      expect(err.code).toBe('upstream_timeout');
      expect(Date.now() - started).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
      expect(Date.now() - started).toBeLessThan(TIMEOUT_MS + 3000);
    }
    await untouched();
  });

  it('a stream that stalls midway ends with an error event the client raises, charged for what it got', async () => {
    const chargedForWhatArrived = await partlyServedUser('emid');
    const stream = await f.client.chat.completions.create({
      model: 'stall-mid',
      user: 'emid',
      messages,
      stream: true,
    });
    let text = '';
    const err = await (async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    })().catch((e) => e);
    expect(text).toBe(' hello hello');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String(err.message)).toContain('timed out');
    await chargedForWhatArrived([2]);
  });

  it('malformed and truncated responses become 502 / an error event (a stream charged for what arrived)', async () => {
    const untouched = await freshUser('ebad');
    const chargedForWhatArrived = await partlyServedUser('ebad-stream');
    const plain = await f.client.chat.completions
      .create({ model: 'malformed', user: 'ebad', messages })
      .catch((e) => e);
    expect(plain.status).toBe(502);
    expect(plain.code).toBe('upstream_malformed');
    await untouched();
    const streamErr = await streamError('malformed', 'ebad-stream');
    expect(streamErr).toBeInstanceOf(OpenAI.APIError);
    expect(String(streamErr.message)).toContain('malformed');
    const cutErr = await streamError('truncated', 'ebad-stream');
    expect(cutErr).toBeInstanceOf(OpenAI.APIError);
    expect(String(cutErr.message)).toContain('ended the stream');
    await chargedForWhatArrived([1, 2]);
  });

  it('an unreachable provider gives 502', async () => {
    const seeded = await seedProject(f.ctx, {
      name: 'Unreachable',
      upstreamUrl: 'http://127.0.0.1:9/v1',
      models: [{ id: 'm', pricing: { mode: 'per_request', perRequest: '0.01' } }],
    });
    const project = { id: seeded.projectId, owner_user_id: 'o', currency: 'usd' };
    const { connectUser } = await import('../../src/users/service.ts');
    const trigger = { source: 't', actorType: 't', actorId: 't' };
    await connectUser(f.ctx.db, f.ctx.events, project, 'u', trigger);
    await f.ctx.billing.deposit({ project, externalId: 'u', amount: '1.00', source: 't', trigger });
    const client = new OpenAI({ baseURL: `${f.server.url}/v1`, apiKey: seeded.apiKey, maxRetries: 0 });
    const err = await client.chat.completions.create({ model: 'm', user: 'u', messages }).catch((e) => e);
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_unreachable');
  });
});

describe('client disconnects', () => {
  it('aborts the upstream request mid-stream and charges what was produced', async () => {
    await f.fund('quitter', '5.00');
    const aborted = f.mock.aborted;
    const controller = new AbortController();
    const stream = await f.client.chat.completions.create(
      { model: 'slow', user: 'quitter', messages, stream: true },
      { signal: controller.signal },
    );
    let received = 0;
    await (async () => {
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta.content) received++;
        if (received === 3) controller.abort();
      }
    })().catch(() => {});
    await expect.poll(() => f.mock.aborted, { timeout: 5000 }).toBe(aborted + 1);
    await f.settled();
    const charged = chargedTotal(await f.ledger('quitter'));
    // no usage arrives: the prompt is counted and so is every token forwarded before the client left
    const prompt = countPromptTokens({ model: 'x', messages });
    const produced = new Money(charged).times(1e6).minus(new Money(prompt).times('0.15')).div('0.6');
    expect(produced.isInteger()).toBe(true);
    expect(produced.toNumber()).toBeGreaterThanOrEqual(3);
    expect(produced.toNumber()).toBeLessThan(40);
    expect(charged).toBe(tokenCost(price, prompt, produced.toNumber()));
    expect((await f.wallet('quitter'))!.held).toBe('0');
  });

  it('a client that leaves before a non-streaming answer aborts the upstream call and pays nothing', async () => {
    const untouched = await freshUser('leaver');
    const aborted = f.mock.aborted;
    const controller = new AbortController();
    const pending = f.client.chat.completions
      .create({ model: 'stall', user: 'leaver', messages }, { signal: controller.signal })
      .catch((e) => e);
    await expect.poll(() => f.mock.inFlight, { timeout: 5000 }).toBeGreaterThan(0);
    controller.abort();
    expect(await pending).toBeInstanceOf(OpenAI.APIUserAbortError);
    await expect.poll(() => f.mock.aborted, { timeout: 5000 }).toBe(aborted + 1);
    await untouched();
  });
});

describe('holds that outlive their request', () => {
  it('are released by the sweeper; the late end of the request then changes nothing', async () => {
    const untouched = await freshUser('orphan');
    const controller = new AbortController();
    const pending = f.client.chat.completions
      .create({ model: 'stall', user: 'orphan', messages }, { signal: controller.signal })
      .catch((e) => e);
    await expect.poll(async () => (await f.wallet('orphan'))!.held, { timeout: 5000 }).not.toBe('0');
    // as if the pod had died: the hold's time is up and the sweeper runs
    await f.ctx.db
      .updateTable('holds')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('status', '=', 'open')
      .execute();
    expect(await f.ctx.billing.sweep()).toBeGreaterThanOrEqual(1);
    expect((await f.wallet('orphan'))!.held).toBe('0');
    controller.abort();
    await pending;
    await untouched();
    await f.ledger('orphan');
    expect((await f.holds('orphan')).map((h) => h.status)).toEqual(['expired']);
  });
});

describe('the completion bound', () => {
  it('stops a stream that goes past the bound the hold pays for, and aborts the provider', async () => {
    await f.fund('runaway', '5.00');
    const aborted = f.mock.aborted;
    const stream = await f.client.chat.completions.create({
      model: 'runaway',
      user: 'runaway',
      messages,
      max_tokens: 10,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    expect(text).toBe(' hello'.repeat(10));
    expect(chunks.findLast((c) => c.choices.length)!.choices[0]!.finish_reason).toBe('length');
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: 10 });
    await expect.poll(() => f.mock.aborted, { timeout: 5000 }).toBe(aborted + 1);
    await f.settled();
    const prompt = countPromptTokens({ model: 'x', messages });
    expect(chargedTotal(await f.ledger('runaway'))).toBe(tokenCost(price, prompt, 10));
  });

  it('charges output the provider reports past the bound it received at the bound (a usage anomaly)', async () => {
    await f.fund('capped', '5.00');
    const reply = await f.client.chat.completions.create({
      model: 'runaway',
      user: 'capped',
      messages,
      max_tokens: 10,
    });
    expect(reply.usage!.completion_tokens).toBe(50);
    await f.settled();
    // the reported input is charged as reported; the output at the bound, not the 50 reported
    expect(chargedTotal(await f.ledger('capped'))).toBe(tokenCost(price, reply.usage!.prompt_tokens, 10));
  });
});

describe('the database', () => {
  it('a paywall decision that cannot reach the ledger answers 503 and forwards nothing', async () => {
    const down = await startChatFixture({
      models: [
        { id: 'm', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.01' } },
      ],
    });
    try {
      await down.fund('u', '1.00');
      // warm the key and project caches, then lose the database
      await down.client.chat.completions.create({ model: 'm', user: 'u', messages });
      await down.settled();
      await down.ctx.database.close();
      const forwarded = down.mock.requests.length;
      const err = await down.client.chat.completions
        .create({ model: 'm', user: 'u', messages })
        .catch((e) => e);
      expect(err.status).toBe(503);
      expect(err.code).toBe('database_unavailable');
      expect(down.mock.requests).toHaveLength(forwarded);
    } finally {
      await down.close();
    }
  });
});
