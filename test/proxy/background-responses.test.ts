import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { BACKGROUND_GIVE_UP_MS, BackgroundResponses } from '../../src/responses/background.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';
import { json, type ScriptedProvider, sse, startScripted } from '../helpers/scripted-provider.ts';

/**
 * Responses `background: true` is charged what the provider bills: the hold is charged when the
 * provider accepts the request, and the rest goes back once the response is seen finished — by the
 * client's `GET /v1/responses/{id}` (official `openai` client), its cancel, or the poller for those
 * nobody fetches. Before, 0.011 was charged for 1.01 of usage (the output came through unmetered GETs).
 */
let f: ChatFixture;
let scripted: ScriptedProvider;
let background: BackgroundResponses;

/** 1 000 per million in, 2 000 out: 10 input tokens 0.01, 505 output tokens 1.01. */
const PRICES = { mode: 'per_token' as const, inputPerMillion: '1000', outputPerMillion: '2000' };

beforeAll(async () => {
  scripted = await startScripted();
  f = await startChatFixture({
    models: [{ id: 'bg', pricing: PRICES, routes: [{ provider: 'scripted', model: 'bg-model' }] }],
  });
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'scripted',
    baseUrl: `${scripted.url}/v1`,
    key: 'sk-scripted',
  });
  // Unmetered calls go to the provider `default`: the scripted one here too.
  await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, {
    name: 'default',
    baseUrl: `${scripted.url}/v1`,
    key: 'sk-scripted',
  });
  await f.ctx.projects.changed(f.project.id);
  const ctx = f.ctx;
  background = new BackgroundResponses({
    db: ctx.db,
    billing: ctx.billing,
    projects: ctx.projects,
    log: ctx.log,
    retrieve: (project, path, signal) => f.server.app.metering.retrieve(project, path, signal),
  });
});
afterAll(async () => {
  await f.close();
  await scripted.close();
});

function client(user: string): OpenAI {
  return new OpenAI({
    baseURL: `${f.server.url}/v1`,
    apiKey: f.apiKey,
    maxRetries: 0,
    defaultHeaders: { 'X-Service-User': user },
  });
}

const response = (id: string, status: string, usage: unknown, text = '') => ({
  id,
  object: 'response',
  created_at: 1,
  status,
  background: true,
  model: 'bg-model',
  output: text
    ? [
        {
          type: 'message',
          id: 'msg_1',
          role: 'assistant',
          status: 'completed',
          content: [{ type: 'output_text', text, annotations: [] }],
        },
      ]
    : [],
  usage,
});
const USAGE = {
  input_tokens: 10,
  output_tokens: 505,
  total_tokens: 515,
  output_tokens_details: { reasoning_tokens: 500 },
  input_tokens_details: { cached_tokens: 0 },
};

/** Starts a background response `id` for `user` (5.00 funded); returns the hold it was charged. */
async function start(user: string, id: string): Promise<string> {
  await f.fund(user, '5.00');
  scripted.handlers.set('bg-model', (_b, res) => json(res, response(id, 'queued', null)));
  const accepted = await client(user).responses.create({
    model: 'bg',
    background: true,
    max_output_tokens: 1000,
    input: 'Think hard about it.',
  });
  expect(accepted.status).toBe('queued');
  await f.settled();
  const [hold] = await f.holds(user);
  const entries = await f.ledger(user);
  // The whole hold is charged at once (nothing stays reserved in a pod while the provider works).
  expect(chargedTotal(entries, 'responses')).toBe(hold!.amount);
  expect(new Money(hold!.amount).gt('2')).toBe(true); // 1 000 output tokens at 2 000 per million, and the input
  return hold!.amount;
}

async function balance(user: string): Promise<string> {
  await f.settled();
  await f.ledger(user); // (checks balance = Σ entries)
  return new Money((await f.wallet(user))!.balance).toFixed();
}

async function record(id: string) {
  return f.ctx.db
    .selectFrom('background_responses')
    .select(['status', 'held', 'charged', 'excess'])
    .where('response_id', '=', id)
    .executeTakeFirstOrThrow();
}

describe('background responses', () => {
  it('settled from the client’s GET /v1/responses/{id}: 1.02 charged in the end, once', async () => {
    const held = await start('bg-get', 'resp_get');
    expect(await record('resp_get')).toMatchObject({ status: 'pending' });
    expect(await balance('bg-get')).toBe(new Money('5').minus(held).toFixed());

    // Still working: nothing changes.
    scripted.handlers.set('GET /v1/responses/resp_get', (_b, res) =>
      json(res, response('resp_get', 'in_progress', null)),
    );
    expect((await client('bg-get').responses.retrieve('resp_get')).status).toBe('in_progress');
    expect(await balance('bg-get')).toBe(new Money('5').minus(held).toFixed());

    scripted.handlers.set('GET /v1/responses/resp_get', (_b, res) =>
      json(res, response('resp_get', 'completed', USAGE, 'Answer')),
    );
    const done = await client('bg-get').responses.retrieve('resp_get');
    expect(done.output_text).toBe('Answer');
    // 10 × 1000 / 1e6 + 505 × 2000 / 1e6 (reasoning inside output_tokens: total = input + output)
    expect(await balance('bg-get')).toBe('3.98');
    expect(await record('resp_get')).toMatchObject({ status: 'settled', charged: '1.02', excess: '0' });
    const returned = (await f.ledger('bg-get')).filter(
      (e) => e.kind === 'deposit' && e.source === 'responses',
    );
    expect(returned.map((e) => e.amount)).toEqual([new Money(held).minus('1.02').toFixed()]);

    // Retrieved again: settled once.
    await client('bg-get').responses.retrieve('resp_get');
    expect(await balance('bg-get')).toBe('3.98');
  });

  it('settled by the poller when no client fetches it', async () => {
    const held = await start('bg-poll', 'resp_poll');
    scripted.handlers.set('GET /v1/responses/resp_poll', (_b, res) =>
      json(res, response('resp_poll', 'queued', null)),
    );
    const later = new Date(Date.now() + 60_000);
    await background.poll(50, later);
    expect(await record('resp_poll')).toMatchObject({ status: 'pending' });
    expect(await balance('bg-poll')).toBe(new Money('5').minus(held).toFixed());

    scripted.handlers.set('GET /v1/responses/resp_poll', (_b, res) =>
      json(res, response('resp_poll', 'completed', { ...USAGE, output_tokens: 5 }, 'Answer')),
    );
    // Reasoning beside output_tokens (total = 10 + 5 + 500): 505 output tokens, 1.02.
    expect(await background.poll(50, new Date(later.getTime() + 3_600_000))).toBe(1);
    expect(await balance('bg-poll')).toBe('3.98');
    expect(await background.poll(50, new Date(later.getTime() + 7_200_000))).toBe(0);
  });

  it('cancelled before any output, no usage: the whole hold goes back', async () => {
    await start('bg-cancel', 'resp_cancel');
    scripted.handlers.set('POST /v1/responses/resp_cancel/cancel', (_b, res) =>
      json(res, response('resp_cancel', 'cancelled', null)),
    );
    expect((await client('bg-cancel').responses.cancel('resp_cancel')).status).toBe('cancelled');
    expect(await balance('bg-cancel')).toBe('5');
    expect(await record('resp_cancel')).toMatchObject({ status: 'settled', charged: '0' });
  });

  it('a usage above the hold is charged up to the hold, the excess recorded', async () => {
    const held = await start('bg-over', 'resp_over');
    scripted.handlers.set('GET /v1/responses/resp_over', (_b, res) =>
      json(res, response('resp_over', 'completed', { input_tokens: 10, output_tokens: 1_000_000 }, 'x')),
    );
    await client('bg-over').responses.retrieve('resp_over');
    expect(await balance('bg-over')).toBe(new Money('5').minus(held).toFixed());
    const row = await record('resp_over');
    expect(row).toMatchObject({ status: 'settled', charged: new Money(held).toFixed() });
    expect(new Money(row.excess!).plus(held).toFixed()).toBe('2000.01');
  });

  it('a background stream the client leaves goes on at the provider: charged its hold, then settled', async () => {
    await f.fund('bg-stream', '5.00');
    let upstreamClosed!: Promise<void>;
    scripted.handlers.set('bg-model', (_b, res) => {
      upstreamClosed = new Promise((resolve) => res.on('close', () => resolve()));
      const created = response('resp_stream', 'in_progress', null);
      sse(
        res,
        [
          ['response.created', { type: 'response.created', sequence_number: 0, response: created }],
          [
            'response.output_text.delta',
            {
              type: 'response.output_text.delta',
              sequence_number: 1,
              item_id: 'msg_1',
              output_index: 0,
              content_index: 0,
              delta: 'Hello',
            },
          ],
        ],
        'stall',
      );
    });
    const stream = await client('bg-stream').responses.create({
      model: 'bg',
      background: true,
      stream: true,
      max_output_tokens: 1000,
      input: 'Think hard about it.',
    });
    for await (const event of stream) {
      if (event.type === 'response.output_text.delta') break; // the client goes away
    }
    await upstreamClosed;
    await f.settled();
    const [hold] = await f.holds('bg-stream');
    expect(await record('resp_stream')).toMatchObject({ status: 'pending', held: hold!.amount });
    expect(await balance('bg-stream')).toBe(new Money('5').minus(hold!.amount).toFixed());
    scripted.handlers.set('GET /v1/responses/resp_stream', (_b, res) =>
      json(res, response('resp_stream', 'completed', USAGE, 'Hello there')),
    );
    await background.poll(50, new Date(Date.now() + 60_000));
    expect(await balance('bg-stream')).toBe('3.98');
  });

  it('never seen finished: expired after the give-up bound (the provider forgot it: 404 too), the hold stays charged', async () => {
    const held = await start('bg-expire', 'resp_expire');
    await background.poll(50, new Date(Date.now() + BACKGROUND_GIVE_UP_MS + 60_000));
    expect(await record('resp_expire')).toMatchObject({ status: 'expired' });
    expect(await balance('bg-expire')).toBe(new Money('5').minus(held).toFixed());

    const kept = await start('bg-404', 'resp_404'); // no script for its GET: the provider answers 404
    await background.poll(50, new Date(Date.now() + 60_000));
    expect(await record('resp_404')).toMatchObject({ status: 'expired' });
    expect(await balance('bg-404')).toBe(new Money('5').minus(kept).toFixed());
  });
});
