import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { Money } from '../../src/core/money.ts';
import type { ProjectLimits } from '../../src/db/schema.ts';
import { periodOf, setUserSpendCaps } from '../../src/limits/spend.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { api, type TestServer } from '../helpers/server.ts';
import { startPricedPods } from './fixture.ts';

/**
 * Spend caps per end user (per day, per month): the hold amount is reserved atomically before the hold,
 * corrected to the charge at the end, and seeded from the ledger; exact under concurrency, on one pod
 * without Redis and across two pods sharing Redis. A user at the cap gets an assistant message.
 */
const twoPods = Boolean(process.env.TOLLGATE_TEST_REDIS && process.env.TOLLGATE_TEST_PG);
const MODELS: ModelSpec[] = [
  { id: 'flat', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.1' } },
  {
    id: 'tok',
    upstreamModel: 'mock-model',
    pricing: { mode: 'per_token', inputPerMillion: '100', outputPerMillion: '200' },
  },
  {
    id: 'emb',
    upstreamModel: 'mock-embed',
    endpoints: ['embeddings'],
    pricing: { mode: 'per_request', perRequest: '0.1' },
  },
];
const messages = [{ role: 'user' as const, content: 'Say hello' }];

interface Setup {
  pods: TestServer[];
  clients: OpenAI[];
  mock: MockUpstream;
  projectId: string;
  apiKey: string;
  ctx: AppContext;
  limits(limits: ProjectLimits | undefined): Promise<void>;
  fund(user: string): Promise<void>;
  idle(): Promise<void>;
  charges(user: string): Promise<string[]>;
  close(): Promise<void>;
}

async function setup(env: Record<string, string>, podCount: number): Promise<Setup> {
  const started = await startPricedPods(env, podCount, MODELS);
  const { pods, ctx, projectId } = started;
  const s: Setup = {
    ...started,
    clients: pods.map((p) => new OpenAI({ baseURL: `${p.url}/v1`, apiKey: started.apiKey, maxRetries: 0 })),
    async limits(limits) {
      await applyPricing(ctx.db, projectId, {
        currency: 'usd',
        models: MODELS,
        ...(limits ? { limits } : {}),
      });
      for (const pod of pods) await pod.ctx.projects.changed(projectId);
    },
    fund: (user) => started.fund(user, '100.00'),
    async idle() {
      for (const pod of pods) await pod.app.metering.idle();
    },
    async charges(user) {
      await s.idle();
      const rows = await ctx.db
        .selectFrom('ledger_entries as l')
        .innerJoin('end_users as e', 'e.id', 'l.user_id')
        .select('l.amount')
        .where('e.project_id', '=', projectId)
        .where('e.external_id', '=', user)
        .where('l.kind', '=', 'charge')
        .execute();
      return rows.map((r) => new Money(r.amount).neg().toFixed());
    },
  };
  return s;
}

const total = (amounts: string[]) => amounts.reduce((sum, a) => sum.plus(a), new Money(0)).toFixed();

function concurrencySuite(name: string, env: Record<string, string>, podCount: number) {
  describe(name, () => {
    let s: Setup;
    beforeAll(async () => {
      s = await setup(env, podCount);
      await s.limits({ spend: { daily: '0.5', monthly: '20' } });
      await s.fund('crowd');
    });
    afterAll(() => s?.close());

    it('serves exactly up to the cap under concurrency; the others get the cap message', async () => {
      const answers = await Promise.all(
        Array.from({ length: 14 }, (_, i) =>
          s.clients[i % s.clients.length]!.chat.completions.create({
            model: 'flat',
            user: 'crowd',
            messages,
          }),
        ),
      );
      const capped = answers.filter((a) => (a as any).paywall?.decision === 'spend_cap_reached');
      expect(answers.length - capped.length).toBe(5);
      expect(capped).toHaveLength(9);
      const resets = periodOf('day').end.toISOString().replace('.000Z', 'Z');
      expect(capped[0]!.choices[0]!.message.content).toContain('daily spending limit of 0.50 USD');
      expect(capped[0]!.choices[0]!.message.content).toContain(resets);
      const charged = await s.charges('crowd');
      expect(charged).toHaveLength(5);
      expect(total(charged)).toBe('0.5');
    });
  });
}

concurrencySuite('spend caps in one process without Redis', { REDIS_URL: '' }, 1);
describe.skipIf(!twoPods)('across pods', () => {
  concurrencySuite('spend caps across two pods sharing Redis', {}, 2);
});

describe('spend caps', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({}, 1);
    for (const user of ['seeded', 'tokens', 'streamer']) await s.fund(user);
    await createSubscription(
      s.ctx,
      s.projectId,
      { url: 'http://127.0.0.1:9/h', events: ['*'] },
      { createdBy: 't' },
    );
  });
  afterAll(() => s?.close());

  it('counts what the ledger already charged in the period', async () => {
    await s.limits(undefined);
    for (let i = 0; i < 3; i++)
      await s.clients[0]!.chat.completions.create({ model: 'flat', user: 'seeded', messages });
    await s.idle();
    await s.limits({ spend: { daily: '0.5' } });
    const served: boolean[] = [];
    for (let i = 0; i < 4; i++) {
      const a = await s.clients[0]!.chat.completions.create({ model: 'flat', user: 'seeded', messages });
      served.push((a as any).paywall === undefined);
      await s.idle();
    }
    expect(served).toEqual([true, true, false, false]);
    expect(total(await s.charges('seeded'))).toBe('0.5');
  });

  it('reserves the hold and corrects to the charge: a per-user cap of exactly charge + hold lets the second request through, not the third', async () => {
    await s.limits({ spend: { daily: '1000' } });
    await s.clients[0]!.chat.completions.create({ model: 'tok', user: 'tokens', messages });
    await s.idle();
    const [charge] = await s.charges('tokens');
    const hold = await s.ctx.db
      .selectFrom('holds')
      .select('amount')
      .where('project_id', '=', s.projectId)
      .orderBy('created_at', 'desc')
      .executeTakeFirstOrThrow();
    expect(new Money(hold.amount).gt(charge!)).toBe(true);
    await setUserSpendCaps(s.ctx.db, s.projectId, 'tokens', {
      daily: new Money(charge!).plus(hold.amount).toFixed(),
    });
    await s.ctx.projects.changed(s.projectId);
    const second = await s.clients[0]!.chat.completions.create({ model: 'tok', user: 'tokens', messages });
    expect((second as any).paywall).toBeUndefined();
    await s.idle();
    const third = await s.clients[0]!.chat.completions.create({ model: 'tok', user: 'tokens', messages });
    expect((third as any).paywall?.decision).toBe('spend_cap_reached');
    expect(await s.charges('tokens')).toHaveLength(2);
  });

  it('answers a streaming request at the cap with a streamed assistant message, and records the event', async () => {
    await setUserSpendCaps(s.ctx.db, s.projectId, 'streamer', { daily: '0', monthly: '5' });
    await s.ctx.projects.changed(s.projectId);
    const events = await s.clients[0]!.chat.completions.create({
      model: 'flat',
      user: 'streamer',
      messages,
      stream: true,
    });
    let text = '';
    for await (const chunk of events) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toContain('daily spending limit');
    expect(await s.charges('streamer')).toEqual([]);
    const written = await s.ctx.db
      .selectFrom('events')
      .select('envelope')
      .where('project_id', '=', s.projectId)
      .where('type', '=', 'limits.spend.exceeded')
      .execute();
    expect(written.map((e) => (e.envelope as any).data)).toContainEqual(
      expect.objectContaining({ period: 'day', cap: '0', currency: 'usd', model: 'flat', required: '0.1' }),
    );
  });

  it('sets and shows a user’s own caps through the API', async () => {
    await s.limits({ spend: { daily: '2', monthly: '30' } });
    const set = await api(s.pods[0]!, s.apiKey, 'POST', '/v1/user/spend-caps', {
      user: 'apiuser',
      daily: '0.25',
    });
    expect(set.status).toBe(200);
    expect(set.body).toMatchObject({
      user: 'apiuser',
      daily: '0.25',
      monthly: '30',
      override: { daily: '0.25', monthly: null },
    });
    const bad = await api(s.pods[0]!, s.apiKey, 'POST', '/v1/user/spend-caps', {
      user: 'apiuser',
      daily: '-1',
    });
    expect(bad.status).toBe(400);
    await s.fund('apiuser');
    const served = [];
    for (let i = 0; i < 3; i++) {
      const a = await s.clients[0]!.chat.completions.create({ model: 'flat', user: 'apiuser', messages });
      served.push((a as any).paywall === undefined);
      await s.idle();
    }
    expect(served).toEqual([true, true, false]);
    const shown = await api(s.pods[0]!, s.apiKey, 'GET', '/v1/user/spend-caps?user=apiuser');
    expect(shown.body.spent).toEqual({ day: '0.2', month: '0.2' });
    const cleared = await api(s.pods[0]!, s.apiKey, 'POST', '/v1/user/spend-caps', {
      user: 'apiuser',
      daily: null,
    });
    expect(cleared.body).toMatchObject({ daily: '2', override: { daily: null, monthly: null } });
  });

  it('answers each API in its own shape at the cap: a Response, and a 402 for embeddings', async () => {
    await s.fund('shapes');
    await setUserSpendCaps(s.ctx.db, s.projectId, 'shapes', { daily: '0.05' });
    await s.ctx.projects.changed(s.projectId);
    const response = await s.clients[0]!.responses.create({ model: 'flat', user: 'shapes', input: 'hi' });
    expect(response.output_text).toContain('daily spending limit of 0.05 USD');
    const err = await s.clients[0]!.embeddings.create({ model: 'emb', user: 'shapes', input: 'hi' }).catch(
      (e) => e,
    );
    expect(err.status).toBe(402);
    expect(err.code).toBe('spend_cap_reached');
    expect(await s.charges('shapes')).toEqual([]);
  });
});
