import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type ChatFixture,
  perRequestModel,
  perTokenModel,
  startChatFixture,
} from '../helpers/chat-fixture.ts';

/**
 * Chat events in the outbox, with the spec's envelope, written only when an active subscription of the
 * project can match them (the subscription-aware filter), so an unsubscribed project writes none.
 */
let f: ChatFixture;
const messages = [{ role: 'user' as const, content: 'Hello' }];
const chatTypes = [
  'proxy.request.started',
  'proxy.request.completed',
  'proxy.request.failed',
  'routing.upstream.failed',
  'auth.connection.required',
  'limits.balance.insufficient',
  'balance.charge.created',
];

beforeAll(async () => {
  f = await startChatFixture({
    models: [perTokenModel('m', '1', '2'), perRequestModel('broken', '0.01', 'broken')],
  });
  f.mock.behaviors.set('broken', { failStatus: 500 });
  await f.fund('payer', '1.00');
  await f.fund('empty');
});
afterAll(() => f.close());

async function events(types = chatTypes) {
  await f.settled();
  return f.ctx.db
    .selectFrom('events')
    .select(['type', 'envelope'])
    .where('project_id', '=', f.project.id)
    .where('type', 'in', types)
    .orderBy('seq')
    .execute();
}

async function traffic() {
  await f.client.chat.completions.create({ model: 'm', user: 'payer', messages });
  await f.client.chat.completions.create({ model: 'm', user: 'stranger', messages });
  await f.client.chat.completions.create({ model: 'm', user: 'empty', messages });
  await f.client.chat.completions.create({ model: 'broken', user: 'payer', messages }).catch(() => {});
}

describe('chat events', () => {
  it('writes none while no subscription of the project wants them', async () => {
    await traffic();
    expect(await events()).toEqual([]);
  });

  it('writes the lifecycle, paywall and charge events with the spec envelope once subscribed', async () => {
    await f.subscribe(['*']);
    await traffic();
    const written = await events();
    // Events of different requests are written in the background, each request's in order.
    expect(written.map((e) => e.type).sort()).toEqual(
      [
        'proxy.request.started',
        'balance.charge.created',
        'proxy.request.completed',
        'auth.connection.required',
        'limits.balance.insufficient',
        'proxy.request.started',
        'proxy.request.failed',
        'routing.upstream.failed',
      ].sort(),
    );
    const of = (type: string, model?: string) =>
      written
        .filter((e) => e.type === type && (!model || (e.envelope as any).data.model === model))
        .map((e) => e.envelope as any);
    const [started] = of('proxy.request.started', 'm');
    const [chargeEvent] = of('balance.charge.created');
    const [completed] = of('proxy.request.completed');
    const [connect] = of('auth.connection.required');
    const [topup] = of('limits.balance.insufficient');
    const [failedStarted] = of('proxy.request.started', 'broken');
    const [failed] = of('proxy.request.failed');
    const [routing] = of('routing.upstream.failed');
    const position = (envelope: any) => written.findIndex((e) => (e.envelope as any).id === envelope.id);
    expect(position(started)).toBeLessThan(position(chargeEvent));
    expect(position(chargeEvent)).toBeLessThan(position(completed));
    expect(position(failedStarted)).toBeLessThan(position(failed));
    // Routing reports each failed attempt as it happens, before the request's own failure.
    expect(position(failedStarted)).toBeLessThan(position(routing));
    expect(position(routing)).toBeLessThan(position(failed));
    expect(failed.data.requestId).toBe(failedStarted.data.requestId);
    expect(routing.data).toMatchObject({ requestId: failed.data.requestId, provider: 'default', attempt: 1 });
    for (const envelope of written.map((e) => e.envelope as any)) {
      expect(envelope).toMatchObject({
        paywallId: f.project.id,
        ownerUserId: f.project.owner_user_id,
        version: '1.0',
        status: 'pending',
        trigger: { source: 'api', actorType: 'api_key' },
        subject: { type: 'user' },
        metadata: expect.any(Object),
      });
      expect(envelope.id).toMatch(/^evt_/);
      expect(Number.isNaN(Date.parse(envelope.createdAt))).toBe(false);
    }
    expect(started.data).toMatchObject({ model: 'm', stream: false, holdAmount: expect.any(String) });
    expect(started.subject.externalId).toBe('payer');
    const charge = await f.ctx.db
      .selectFrom('ledger_entries')
      .select(['id', 'amount'])
      .where('kind', '=', 'charge')
      .where('project_id', '=', f.project.id)
      .orderBy('id', 'desc')
      .executeTakeFirstOrThrow();
    expect(chargeEvent.data).toMatchObject({
      activityId: charge.id,
      source: 'chat',
      currency: 'usd',
      externalUserId: 'payer',
      amount: '0.000022', // 12 × 1/1M + 5 × 2/1M
    });
    expect(completed.data).toMatchObject({
      requestId: started.data.requestId,
      model: 'm',
      inputTokens: 12,
      outputTokens: 5,
      amount: '0.000022',
      currency: 'usd',
      finishReason: 'stop',
      outcome: 'success',
    });
    expect(connect.data).toEqual({ model: 'm', operation: 'chat' });
    expect(connect.subject.externalId).toBe('stranger');
    expect(topup.data).toMatchObject({ model: 'm', operation: 'chat', available: '0.00', currency: 'usd' });
    expect(failed.data).toMatchObject({ model: 'broken', status: 502, code: 'upstream_error' });
    expect(routing.data).toMatchObject({ model: 'broken', upstreamStatus: 500 });
  });

  it('writes only what the subscriptions match', async () => {
    await f.ctx.db.deleteFrom('events').where('project_id', '=', f.project.id).execute();
    await f.ctx.db
      .updateTable('webhook_subscriptions')
      .set({ is_active: false })
      .where('project_id', '=', f.project.id)
      .execute();
    await f.subscribe(['balance.*'], 'http://127.0.0.1:9/hook2');
    await traffic();
    expect((await events()).map((e) => e.type)).toEqual(['balance.charge.created']);
  });
});
