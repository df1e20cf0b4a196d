import net from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelRow } from '../../src/db/schema.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { listProviders, removeProvider, upsertProvider } from '../../src/routing/providers.ts';
import { Router } from '../../src/routing/router.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { type ChatFixture, chargedTotal, startChatFixture } from '../helpers/chat-fixture.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Routing with fallback against real providers on loopback (two mock servers, a refused port, a hanging
 * provider): each failure before the first byte moves to the next route, streaming or not, and the
 * request is charged exactly once, at the price of the model the client asked for.
 */
let f: ChatFixture;
let other: MockUpstream;
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const PRICE = '0.01';

function model(id: string, routes: ModelSpec['routes']): ModelSpec {
  return { id, routes, pricing: { mode: 'per_request', perRequest: PRICE } };
}

/** A model served by `first`'s provider and model, else by `then`'s. */
function fallback(id: string, first: [string, string], then: [string, string]): ModelSpec {
  return model(
    id,
    [first, then].map(([provider, model]) => ({ provider: provider!, model: model! })),
  );
}

const MODELS: ModelSpec[] = [
  fallback('refused', ['dead', 'ok'], ['a', 'ok-a']),
  fallback('hanging', ['slow', 'hang'], ['b', 'ok-b']),
  fallback('err500', ['a', 'fail500'], ['b', 'ok-b']),
  fallback('limited', ['a', 'rate429'], ['b', 'ok-b']),
  fallback('cut', ['a', 'cut'], ['b', 'ok-b']),
  fallback('flaky', ['a', 'flaky'], ['b', 'ok-b']),
  fallback('all-down', ['a', 'fail500-2'], ['b', 'fail503']),
  model('retry-short', [{ provider: 'a', model: 'rate429-short' }]),
  model('spread', [
    { provider: 'a', model: 'w-a', priority: 0, weight: 3 },
    { provider: 'b', model: 'w-b', priority: 0, weight: 1 },
  ]),
];

async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

beforeAll(async () => {
  f = await startChatFixture({
    models: [
      { id: 'plain', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: PRICE } },
    ],
    env: { ROUTING_CIRCUIT_FAILURES: '2', ROUTING_CIRCUIT_COOLDOWN_MS: '800' },
  });
  other = await startMockUpstream();
  const ctx = f.ctx;
  const id = f.project.id;
  await upsertProvider(ctx.db, ctx.sealer, id, { name: 'a', baseUrl: f.mock.baseUrl, key: 'sk-a' });
  await upsertProvider(ctx.db, ctx.sealer, id, { name: 'b', baseUrl: other.baseUrl, key: 'sk-b' });
  await upsertProvider(ctx.db, ctx.sealer, id, {
    name: 'dead',
    baseUrl: `http://127.0.0.1:${await closedPort()}/v1`,
  });
  await upsertProvider(ctx.db, ctx.sealer, id, {
    name: 'slow',
    baseUrl: f.mock.baseUrl,
    timeouts: { responseMs: 300 },
  });
  await applyPricing(ctx.db, id, {
    currency: 'usd',
    models: [
      { id: 'plain', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: PRICE } },
      ...MODELS,
    ],
  });
  await ctx.projects.changed(id);
  f.mock.behaviors.set('hang', { stall: true });
  f.mock.behaviors.set('fail500', { failStatus: 500 });
  f.mock.behaviors.set('fail500-2', { failStatus: 500 });
  other.behaviors.set('fail503', { failStatus: 503 });
  f.mock.behaviors.set('rate429', { failStatus: 429, retryAfter: '30' });
  f.mock.behaviors.set('cut', { truncateAfterChunks: 1, tokens: 5 });
  f.mock.behaviors.set('flaky', { failStatus: 500 });
  await createSubscription(ctx, id, { url: 'http://127.0.0.1:9/hook', events: ['*'] }, { createdBy: 'test' });
});
afterAll(async () => {
  await f?.close();
  await other?.close();
});

const sentTo = (mock: MockUpstream, upstreamModel: string) =>
  mock.requests.filter((r) => r.body.model === upstreamModel).length;

async function ask(modelId: string, user: string, stream: boolean): Promise<string> {
  if (!stream) {
    const answer = await f.client.chat.completions.create({ model: modelId, user, messages });
    return answer.choices[0]!.message.content ?? '';
  }
  const events = await f.client.chat.completions.create({ model: modelId, user, messages, stream: true });
  let text = '';
  for await (const chunk of events) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}

async function charges(user: string) {
  await f.settled();
  const entries = await f.ledger(user);
  const wallet = await f.wallet(user);
  return {
    count: entries.filter((e) => e.kind === 'charge').length,
    total: chargedTotal(entries),
    held: wallet!.held,
  };
}

async function routingEvents(type: string) {
  const envelopes: Array<{ data: Record<string, unknown> }> = await f.events(type);
  return envelopes.map((e) => e.data);
}

describe('providers', () => {
  it('the project upstream is the provider `default`; keys are sealed at rest and sent to the provider', async () => {
    const names = (await listProviders(f.ctx.db, f.project.id)).map((p) => p.name);
    expect(names).toEqual(['a', 'b', 'dead', 'default', 'slow']);
    const rows = await f.ctx.db.selectFrom('providers').select(['name', 'key_sealed']).execute();
    for (const row of rows) expect(row.key_sealed ?? '').not.toContain('sk-');
    await f.fund('keys', '1.00');
    await ask('err500', 'keys', false);
    const toB = other.requests.at(-1)!;
    expect(toB.headers.authorization).toBe('Bearer sk-b');
  });

  it('removes a provider; a route to a missing provider counts as a failed attempt', async () => {
    await upsertProvider(f.ctx.db, f.ctx.sealer, f.project.id, { name: 'tmp', baseUrl: other.baseUrl });
    expect(await removeProvider(f.ctx.db, f.project.id, 'tmp')).toBe(true);
    expect(await removeProvider(f.ctx.db, f.project.id, 'tmp')).toBe(false);
  });
});

describe('fallback before the first byte', () => {
  for (const stream of [false, true]) {
    const mode = stream ? 'streaming' : 'non-streaming';

    it(`a refused connection moves to the next route (${mode}), charged once`, async () => {
      const user = `refused-${stream}`;
      await f.fund(user, '1.00');
      const before = sentTo(f.mock, 'ok-a');
      expect(await ask('refused', user, stream)).toBe(' hello hello hello hello hello');
      expect(sentTo(f.mock, 'ok-a')).toBe(before + 1);
      expect(await charges(user)).toEqual({ count: 1, total: PRICE, held: '0' });
    });

    it(`a hanging provider times out and the next route answers (${mode}), charged once`, async () => {
      const user = `hanging-${stream}`;
      await f.fund(user, '1.00');
      const started = Date.now();
      expect(await ask('hanging', user, stream)).toBe(' hello hello hello hello hello');
      expect(Date.now() - started).toBeGreaterThanOrEqual(250);
      expect(await charges(user)).toEqual({ count: 1, total: PRICE, held: '0' });
    });

    it(`a 500 moves to the next route (${mode}), charged once`, async () => {
      const user = `err500-${stream}`;
      await f.fund(user, '1.00');
      expect(await ask('err500', user, stream)).toBe(' hello hello hello hello hello');
      expect(await charges(user)).toEqual({ count: 1, total: PRICE, held: '0' });
    });
  }

  it('a 429 with a Retry-After longer than the deadline moves on, and keeps the route aside until then', async () => {
    await f.fund('limited', '1.00');
    const before = sentTo(f.mock, 'rate429');
    expect(await ask('limited', 'limited', false)).toBe(' hello hello hello hello hello');
    expect(await ask('limited', 'limited', true)).toBe(' hello hello hello hello hello');
    // The second request did not try the rate-limited route again (Retry-After: 30).
    expect(sentTo(f.mock, 'rate429')).toBe(before + 1);
    expect(await charges('limited')).toEqual({ count: 2, total: '0.02', held: '0' });
  });

  it('a 429 whose Retry-After fits the deadline is waited for and the route tried again, charged once', async () => {
    await f.fund('patient', '1.00');
    f.mock.behaviors.set('rate429-short', { failStatus: 429, retryAfter: '1' });
    // The provider recovers while Tollgate waits out its Retry-After.
    const recover = setTimeout(() => f.mock.behaviors.set('rate429-short', {}), 300);
    const started = Date.now();
    expect(await ask('retry-short', 'patient', false)).toBe(' hello hello hello hello hello');
    clearTimeout(recover);
    expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    expect(sentTo(f.mock, 'rate429-short')).toBe(2);
    expect(await charges('patient')).toEqual({ count: 1, total: PRICE, held: '0' });
  });

  it('a stream cut after its first byte is not retried: the client gets an error, charged for what it got', async () => {
    await f.fund('cut', '1.00');
    const beforeB = sentTo(other, 'ok-b');
    const err = await ask('cut', 'cut', true).catch((e) => e);
    expect(err).toBeInstanceOf(Error);
    expect(sentTo(other, 'ok-b')).toBe(beforeB);
    // content reached the client: a per-request model charges its price (issue 21: what reached the client)
    expect(await charges('cut')).toEqual({ count: 1, total: '0.01', held: '0' });
  });

  it('when every route fails, the last failure is answered and nothing is charged', async () => {
    await f.fund('down', '1.00');
    const err = await ask('all-down', 'down', false).catch((e) => e);
    expect(err.status).toBe(502);
    expect(await charges('down')).toEqual({ count: 0, total: '0', held: '0' });
  });

  it('records each failed attempt and the fallback as events', async () => {
    const failed = await routingEvents('routing.upstream.failed');
    expect(failed.some((d) => d.provider === 'dead' && String(d.reason).startsWith('connection'))).toBe(true);
    expect(failed.some((d) => d.provider === 'slow' && String(d.reason).startsWith('timeout'))).toBe(true);
    expect(failed.some((d) => d.provider === 'a' && d.upstreamStatus === 429)).toBe(true);
    const down = failed.filter((d) => d.model === 'all-down');
    expect(down.map((d) => d.provider)).toEqual(['a', 'b']);
    const used = await routingEvents('routing.fallback.used');
    expect(used.some((d) => d.model === 'refused' && d.provider === 'a' && d.firstProvider === 'dead')).toBe(
      true,
    );
    for (const d of used) expect(typeof d.requestId).toBe('string');
    // One request's events are written in the order they happened.
    const requestId = used.find((d) => d.model === 'refused')!.requestId;
    const ofRequest = await f.ctx.db
      .selectFrom('events')
      .select('type')
      .where('project_id', '=', f.project.id)
      .where(sql<boolean>`envelope->'data'->>'requestId' = ${requestId}`)
      .orderBy('seq')
      .execute();
    expect(ofRequest.map((e) => e.type)).toEqual([
      'proxy.request.started',
      'routing.upstream.failed',
      'routing.fallback.used',
      'proxy.request.completed',
    ]);
  });
});

describe('circuit breaker', () => {
  it('opens after consecutive failures, skips the route, lets one probe through after the cool-down and closes', async () => {
    await f.fund('circuit', '1.00');
    const tried = () => sentTo(f.mock, 'flaky');
    await ask('flaky', 'circuit', false);
    await ask('flaky', 'circuit', true);
    expect(tried()).toBe(2); // ROUTING_CIRCUIT_FAILURES=2: now open
    await ask('flaky', 'circuit', false);
    expect(tried()).toBe(2); // skipped while open
    expect((await routingEvents('routing.circuit.opened')).filter((d) => d.model === 'flaky')).toHaveLength(
      1,
    );
    f.mock.behaviors.set('flaky', {});
    await new Promise((resolve) => setTimeout(resolve, 900));
    await ask('flaky', 'circuit', false); // the probe
    expect(tried()).toBe(3);
    await ask('flaky', 'circuit', false);
    expect(tried()).toBe(4);
    expect((await routingEvents('routing.circuit.closed')).filter((d) => d.model === 'flaky')).toHaveLength(
      1,
    );
    expect(await charges('circuit')).toEqual({ count: 5, total: '0.05', held: '0' });
  });
});

describe('weights', () => {
  it('spread routes of equal priority in proportion to their weight', () => {
    const router = new Router(f.ctx, undefined as never);
    const project = { id: 'p', providers: new Map() } as never;
    const row = { routes: MODELS.find((m) => m.id === 'spread')!.routes } as unknown as ModelRow;
    let first = 0;
    const n = 20_000;
    for (let i = 0; i < n; i++) if (router.order(project, row)[0]!.route.provider === 'a') first++;
    expect(first / n).toBeGreaterThan(0.73);
    expect(first / n).toBeLessThan(0.77);
  });

  it('end to end, both routes of equal priority serve traffic', async () => {
    await f.fund('spread', '5.00');
    for (let i = 0; i < 40; i++) await ask('spread', 'spread', false);
    const a = sentTo(f.mock, 'w-a');
    const b = sentTo(other, 'w-b');
    expect(a + b).toBe(40);
    expect(a).toBeGreaterThan(b);
    expect(b).toBeGreaterThan(0);
    expect(await charges('spread')).toEqual({ count: 40, total: '0.4', held: '0' });
  });
});

describe('every metered API is routed', () => {
  it('the Responses API falls back too (streaming and not), charged once each', async () => {
    await f.fund('responses', '1.00');
    const plain = await f.client.responses.create({ model: 'err500', user: 'responses', input: 'Say hello' });
    expect(plain.output_text).toBe(' hello hello hello hello hello');
    const events = await f.client.responses.create({
      model: 'refused',
      user: 'responses',
      input: 'hi',
      stream: true,
    });
    let text = '';
    for await (const event of events) if (event.type === 'response.output_text.delta') text += event.delta;
    expect(text).toBe(' hello hello hello hello hello');
    await f.settled();
    const entries = await f.ledger('responses');
    expect(chargedTotal(entries, 'responses')).toBe('0.02');
  });
});
