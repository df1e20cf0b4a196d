import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import type { ProjectLimits } from '../../src/db/schema.ts';
import { Limits } from '../../src/limits/index.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { api, type TestServer } from '../helpers/server.ts';
import { startPricedPods } from './fixture.ts';

/**
 * Rate limits per project, API key and end user (requests and tokens per minute): exact across two
 * pods sharing Redis and in one process without Redis; OpenAI's 429 and `x-ratelimit-*` headers.
 */
const twoPods = Boolean(process.env.TOLLGATE_TEST_REDIS && process.env.TOLLGATE_TEST_PG);
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const MODELS: ModelSpec[] = [
  {
    id: 'm',
    upstreamModel: 'mock-model',
    pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' },
  },
];
const messages = [{ role: 'user', content: 'Say hello' }];

interface Setup {
  pods: TestServer[];
  mock: MockUpstream;
  projectId: string;
  apiKey: string;
  close(): Promise<void>;
}

async function setup(env: Record<string, string>, podCount: number, limits: ProjectLimits): Promise<Setup> {
  const s = await startPricedPods(env, podCount, MODELS);
  await applyPricing(s.ctx.db, s.projectId, { currency: 'usd', models: MODELS, limits });
  await s.ctx.projects.changed(s.projectId);
  await new Promise((resolve) => setTimeout(resolve, 50));
  for (const pod of s.pods) pod.ctx.projects.changed(s.projectId).catch(() => {});
  return s;
}

async function fund(ctx: AppContext, projectId: string, user: string) {
  const project = await getProject(ctx.db, projectId);
  await connectUser(ctx.db, ctx.events, project, user, trigger);
  await ctx.billing.deposit({ project, externalId: user, amount: '10.00', source: 'test', trigger });
}

/** Waits for a fresh one-minute window when the current one ends too soon for the test. */
async function freshWindow(needMs = 10_000) {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < needMs) await new Promise((resolve) => setTimeout(resolve, left + 50));
}

const chat = (pod: TestServer, key: string, user: string, extra: Record<string, unknown> = {}) =>
  api(pod, key, 'POST', '/v1/chat/completions', { model: 'm', user, messages, ...extra });

describe.skipIf(!twoPods)('rate limits across two pods sharing Redis', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({}, 2, { project: { rpm: 1000 }, user: { rpm: 4, tpm: 100_000 } });
    for (const user of ['alice', 'bob', 'carol']) await fund(s.pods[0]!.ctx, s.projectId, user);
    await createSubscription(
      s.pods[0]!.ctx,
      s.projectId,
      { url: 'http://127.0.0.1:9/h', events: ['*'] },
      { createdBy: 't' },
    );
  });
  afterAll(() => s?.close());

  it('the N+1st request in the window gets 429 with OpenAI’s shape and headers, whichever pod serves it', async () => {
    await freshWindow();
    const seen: Array<{ status: number; headers: Headers; body: any }> = [];
    for (let i = 0; i < 5; i++) seen.push(await chat(s.pods[i % 2]!, s.apiKey, 'alice'));
    expect(seen.map((r) => r.status)).toEqual([200, 200, 200, 200, 429]);
    expect(seen.slice(0, 4).map((r) => r.headers.get('x-ratelimit-remaining-requests'))).toEqual([
      '3',
      '2',
      '1',
      '0',
    ]);
    for (const r of seen) {
      expect(r.headers.get('x-ratelimit-limit-requests')).toBe('4');
      expect(r.headers.get('x-ratelimit-reset-requests')).toMatch(/^\d+s$/);
      expect(r.headers.get('x-ratelimit-limit-tokens')).toBe('100000');
    }
    const refused = seen[4]!;
    expect(refused.body.error.code).toBe('rate_limit_exceeded');
    expect(refused.body.error.type).toBe('rate_limit_error');
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(refused.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    // Another user is not limited by alice's requests.
    expect((await chat(s.pods[1]!, s.apiKey, 'bob')).status).toBe(200);
    // A refused request did not touch money: alice has four charges, no open hold.
    for (const pod of s.pods) await pod.app.metering.idle();
    const events = await s.pods[0]!.ctx.db.selectFrom('events')
      .select('envelope')
      .where('project_id', '=', s.projectId)
      .where('type', '=', 'limits.rate.exceeded')
      .execute();
    expect(events.map((e) => (e.envelope as any).data)).toEqual([
      expect.objectContaining({ scope: 'user', limit: 'requests', value: 4, operation: 'chat', model: 'm' }),
    ]);
  });

  it('is exact under concurrency across pods', async () => {
    await freshWindow();
    const all = await Promise.all(
      Array.from({ length: 12 }, (_, i) => chat(s.pods[i % 2]!, s.apiKey, 'carol')),
    );
    expect(all.filter((r) => r.status === 200)).toHaveLength(4);
    expect(all.filter((r) => r.status === 429)).toHaveLength(8);
  });
});

describe('rate limits in one process without Redis', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({ REDIS_URL: '' }, 1, { key: { rpm: 3 }, user: { tpm: 1000 } });
    for (const user of ['dave', 'erin', 'frank']) await fund(s.pods[0]!.ctx, s.projectId, user);
  });
  afterAll(() => s?.close());

  it('counts in memory, exactly, concurrent requests included', async () => {
    await freshWindow();
    expect(s.pods[0]!.ctx.bus.kind).toBe('memory');
    const all = await Promise.all(Array.from({ length: 7 }, () => chat(s.pods[0]!, s.apiKey, 'dave')));
    expect(all.filter((r) => r.status === 200)).toHaveLength(3);
    const refused = all.filter((r) => r.status === 429);
    expect(refused).toHaveLength(4);
    expect(refused[0]!.headers.get('x-ratelimit-limit-requests')).toBe('3');
    expect(refused[0]!.body.error.message).toMatch(/API key/);
  });
});

describe('the /v1/user routes', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({ REDIS_URL: '' }, 1, { key: { rpm: 10 } });
    await fund(s.pods[0]!.ctx, s.projectId, 'hal');
  });
  afterAll(() => s?.close());

  it('count against the key’s rate limit: 10 of 60 balance reads answered, then 429', async () => {
    await freshWindow();
    const all = await Promise.all(
      Array.from({ length: 60 }, () => api(s.pods[0]!, s.apiKey, 'GET', '/v1/user/balance?user=hal')),
    );
    expect(all.filter((r) => r.status === 200)).toHaveLength(10);
    const refused = all.filter((r) => r.status === 429);
    expect(refused).toHaveLength(50);
    expect(refused[0]!.headers.get('x-ratelimit-limit-requests')).toBe('10');
    // and a metered request of the same key in this minute is refused too: one budget
    expect((await chat(s.pods[0]!, s.apiKey, 'hal')).status).toBe(429);
  });
});

describe('tokens per minute', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({ REDIS_URL: '' }, 1, { user: { tpm: 1000 } });
    await fund(s.pods[0]!.ctx, s.projectId, 'gina');
  });
  afterAll(() => s?.close());

  it('counts the estimated prompt at admission and corrects it to the usage at the end; streams carry the headers', async () => {
    await freshWindow();
    const first = await chat(s.pods[0]!, s.apiKey, 'gina');
    expect(first.status).toBe(200);
    const estimate = 1000 - Number(first.headers.get('x-ratelimit-remaining-tokens'));
    expect(estimate).toBeGreaterThan(0);
    await s.pods[0]!.app.metering.idle();
    const used = first.body.usage.prompt_tokens + first.body.usage.completion_tokens;
    const res = await fetch(`${s.pods[0]!.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', user: 'gina', messages, stream: true }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    expect(res.headers.get('x-ratelimit-remaining-tokens')).toBe(String(1000 - used - estimate));
    expect(res.headers.get('x-ratelimit-limit-tokens')).toBe('1000');
    await res.text();
  });

  it('a request whose prompt alone is over the limit gets 429 about tokens', async () => {
    const big = [{ role: 'user', content: 'hello '.repeat(1500) }];
    const res = await api(s.pods[0]!, s.apiKey, 'POST', '/v1/chat/completions', {
      model: 'm',
      user: 'gina',
      messages: big,
    });
    expect(res.status).toBe(429);
    expect(res.body.error.message).toMatch(/TPM/);
  });
});

describe('when Redis cannot be reached', () => {
  function limitsWith(failOpen: boolean) {
    const counts: string[] = [];
    const ctx = {
      config: { REDIS_URL: 'redis://127.0.0.1:1', LIMITS_FAIL_OPEN: failOpen },
      bus: { prefix: 'x:' },
      metrics: { limitsBackendErrors: { inc: (l: { outcome: string }) => counts.push(l.outcome) } },
      log: { warn: () => {} },
    } as unknown as AppContext;
    return { limits: new Limits(ctx), counts };
  }
  const request = {
    project: { id: 'p', limits: { user: { rpm: 1 } }, spendCaps: new Map() },
    apiKeyId: 'k',
    externalId: 'u',
    model: 'm',
    operation: 'chat',
    estimateTokens: () => 1,
  } as never;

  it('fails open by default and counts it', async () => {
    const { limits, counts } = limitsWith(true);
    expect(await limits.check({}, request, '0')).toEqual({ ok: true, headers: {} });
    expect(counts).toEqual(['allowed']);
    await limits.close();
  });

  it('fails closed with 503 when LIMITS_FAIL_OPEN=false', async () => {
    const { limits, counts } = limitsWith(false);
    const err = await limits.check({}, request, '0').catch((e) => e);
    expect(err.status).toBe(503);
    expect(err.code).toBe('limits_unavailable');
    expect(counts).toEqual(['refused']);
    await limits.close();
  });
});
