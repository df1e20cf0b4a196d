import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { createTestContext } from '../helpers/context.ts';
import type { Receiver } from '../helpers/https-receiver.ts';
import { seedProject } from '../helpers/server.ts';
import { startWebhookBench, type WebhookBench } from './fixture.ts';

let receiver: Receiver;
let embedded: AppContext;

let bench: WebhookBench<AppContext>;

beforeAll(async () => {
  bench = await startWebhookBench((env) => createTestContext(env), {
    DATABASE_URL: '',
    WEBHOOK_POLL_INTERVAL_MS: '50',
  });
  ({ receiver, started: embedded } = bench);
});
afterAll(() => bench?.close());

describe('embedded database', () => {
  it('fans out and delivers on the single-connection embedded Postgres (tollgate dev)', async () => {
    expect(embedded.database.kind).toBe('embedded');
    const worker = startDeliveryWorker(embedded);
    try {
      const p = await seedProject(embedded);
      const { subscription, secret } = await createSubscription(
        embedded,
        p.projectId,
        { url: `${receiver.url}/embedded`, events: ['balance.*'] },
        { createdBy: 'test' },
      );
      receiver.secrets.set(subscription.id, secret);
      const project = await getProject(embedded.db, p.projectId);
      const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
      for (let i = 0; i < 3; i++)
        await embedded.billing.deposit({
          project,
          externalId: `u${i}`,
          amount: '1',
          source: 'test',
          trigger,
        });
      const reqs = await receiver.waitFor((all) => all.length >= 3);
      expect(reqs.every((r) => r.verified && r.body.delivery.attempts === 1)).toBe(true);
      expect(new Set(reqs.map((r) => r.body.event.id)).size).toBe(3);
    } finally {
      await worker.stop(1000);
    }
  });
});
