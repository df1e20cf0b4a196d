import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { isPrivateAddress } from '../../src/net/destination.ts';
import { getProject } from '../../src/projects/service.ts';
import { buildRequest, Sender, sign } from '../../src/webhooks/deliver.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { verifyWebhook } from '../../src/webhooks/verify.ts';
import { startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import type { Receiver } from '../helpers/https-receiver.ts';
import { type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';
import { startWebhookBench, type WebhookBench } from './fixture.ts';

let server: TestServer;
let receiver: Receiver;
let project: SeededProject;
/** The same context with private destinations refused, as in production. */
let strict: AppContext;

let bench: WebhookBench<TestServer>;
beforeAll(async () => {
  bench = await startWebhookBench((env) => startTestServer(env), {
    WEBHOOK_MAX_ATTEMPTS: '2',
    WEBHOOK_BACKOFF_BASE_MS: '20',
  });
  ({ receiver, started: server } = bench);
  strict = { ...server.ctx, config: { ...server.ctx.config, WEBHOOK_ALLOW_PRIVATE_NETWORKS: false } };
  project = await seedProject(server.ctx);
});
afterAll(() => bench?.close());

describe('destination checks', () => {
  it.each([
    ['127.0.0.1', true],
    ['127.9.9.9', true],
    ['10.0.0.5', true],
    ['172.16.3.4', true],
    ['172.32.0.1', false],
    ['192.168.1.1', true],
    ['169.254.169.254', true],
    ['100.100.100.200', true],
    ['0.0.0.0', true],
    ['224.0.0.1', true],
    ['8.8.8.8', false],
    ['93.184.215.14', false],
    ['::1', true],
    ['::', true],
    ['fe80::1', true],
    ['fd00:ec2::254', true],
    ['::ffff:127.0.0.1', true],
    ['::ffff:a00:1', true],
    ['64:ff9b::a9fe:a9fe', true],
    ['::ffff:8.8.8.8', false],
    ['2606:4700:4700::1111', false],
    // IPv6 forms that embed an IPv4 address are judged by that address as well.
    ['::7f00:1', true], // IPv4-compatible ::127.0.0.1
    ['::127.0.0.1', true],
    ['::a00:1', true],
    ['::ffff:0:7f00:1', true], // IPv4-translated (RFC 6145)
    ['2002:7f00:1::', true], // 6to4 of 127.0.0.1
    ['2002:a9fe:a9fe::1', true], // 6to4 of 169.254.169.254
    ['2002:808:808::1', false], // 6to4 of 8.8.8.8
    ['64:ff9b::7f00:1', true], // NAT64 (RFC 6052)
    ['64:ff9b::808:808', false],
    ['64:ff9b:1::a00:1', true], // local-use NAT64 (RFC 8215)
    ['2001:0:4136:e378:8000:63bf:80ff:fffe', true], // Teredo, client 127.0.0.1 (obfuscated)
    ['2001:0:a00:1:8000:63bf:f7f7:f7f7', true], // Teredo, server 10.0.0.1
    ['2001:0:808:808:8000:63bf:f7f7:f7f7', false], // Teredo, server and client 8.8.8.8
    // Non-global IPv6 that the old list missed.
    ['100::1', true],
    ['2001:2::1', true], // benchmarking
    ['3fff::1', true], // documentation (RFC 9637)
    ['5f00::1', true], // segment routing
    ['1::1', true], // outside 2000::/3, unallocated
    ['not-an-address', true],
  ])('%s private: %s', (address, expected) => {
    expect(isPrivateAddress(address)).toBe(expected);
  });

  it.each([
    'https://127.0.0.1/hook',
    'https://localhost/hook',
    'https://api.localhost/hook',
    'https://169.254.169.254/latest/meta-data',
    'https://[::1]/hook',
    'https://[::ffff:10.0.0.1]/hook',
    'https://10.1.2.3:8443/hook',
    'https://metadata.google.internal/computeMetadata',
    'https://0x7f000001/hook',
    'https://2130706433/hook',
    'https://[::7f00:1]/hook',
    'https://[::127.0.0.1]/hook',
    'https://[2002:7f00:1::]/hook',
    'https://[64:ff9b::127.0.0.1]/hook',
    'https://[::ffff:0:127.0.0.1]/hook',
    'https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook',
  ])('refuses %s at creation unless private networks are allowed', async (url) => {
    await expect(
      createSubscription(strict, project.projectId, { url, events: ['*'] }, { createdBy: 'test' }),
    ).rejects.toMatchObject({ status: 400, param: 'url' });
  });

  it('accepts a public address literal, and plain HTTP only when allowed', async () => {
    const ok = await createSubscription(
      strict,
      project.projectId,
      { url: 'https://93.184.215.14/hook', events: ['*'] },
      { createdBy: 'test' },
    );
    expect(ok.subscription.isActive).toBe(true);
    // The test configuration allows plain HTTP.
    const http = await createSubscription(
      server.ctx,
      project.projectId,
      { url: 'http://127.0.0.1:1/hook', events: ['user.*'] },
      { createdBy: 'test' },
    );
    expect(http.subscription.url).toBe('http://127.0.0.1:1/hook');
    await server.ctx.db
      .deleteFrom('webhook_subscriptions')
      .where('project_id', '=', project.projectId)
      .execute();
  });

  it('refuses at send time a name that resolves to a private address, before any byte is sent', async () => {
    const sender = new Sender(strict.config);
    const signed = buildRequest(
      { id: 'dlv_x', subscriptionId: 'whsub_x', attempts: 1, createdAt: 'a', updatedAt: 'b' },
      {
        id: 'evt_x',
        paywallId: 'pw',
        ownerUserId: 'o',
        type: 't.x',
        version: '1.0',
        status: 'pending',
        createdAt: 'c',
        trigger: { source: 's', actorType: 'a', actorId: 'i' },
        subject: { type: 'user', id: 'u', externalId: 'e' },
        data: {},
        metadata: {},
      },
      'secret-secret-secret-secret',
      {},
    );
    const byName = await sender.send(`${receiver.url}/ssrf`, signed);
    expect(byName.status).toBeUndefined();
    expect(byName.error).toBe('refused: localhost is not a public address');
    const byAddress = await sender.send(`https://127.0.0.1:${receiver.port}/ssrf`, signed);
    expect(byAddress.error).toMatch(/^refused: 127\.0\.0\.1/);
    for (const literal of ['[::7f00:1]', '[::127.0.0.1]', '[2002:7f00:1::]']) {
      const embedded = await sender.send(`https://${literal}:${receiver.port}/ssrf`, signed);
      expect(embedded.status).toBeUndefined();
      expect(embedded.error).toMatch(/^refused: /);
    }
    await sender.close();
    expect(receiver.received).toHaveLength(0);

    // The same through a worker: a subscription saved while allowed, sent by a strict worker.
    const p = await seedProject(server.ctx);
    const { subscription } = await createSubscription(
      server.ctx,
      p.projectId,
      { url: `${receiver.url}/ssrf-worker`, events: ['balance.*'] },
      { createdBy: 'test' },
    );
    const projectRow = await getProject(server.ctx.db, p.projectId);
    await server.ctx.billing.deposit({
      project: projectRow,
      externalId: 'u',
      amount: '1',
      source: 'test',
      trigger: { source: 't', actorType: 't', actorId: 't' },
    });
    const worker = startDeliveryWorker(strict, { pollIntervalMs: 50 });
    try {
      const deadline = Date.now() + 10_000;
      let row: { status: string; attempts: number; last_error: string | null } | undefined;
      while (Date.now() < deadline) {
        row = await server.ctx.db
          .selectFrom('webhook_deliveries')
          .select(['status', 'attempts', 'last_error'])
          .where('subscription_id', '=', subscription.id)
          .executeTakeFirst();
        if (row?.status === 'error') break;
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(row).toMatchObject({ status: 'error', attempts: 2 });
      expect(row!.last_error).toMatch(/^refused: localhost is not a public address/);
    } finally {
      await worker.stop(1000);
    }
    expect(receiver.received).toHaveLength(0);
  });
});

describe('verifyWebhook', () => {
  const secret = 'whsec_receiver-side-test-secret';
  const now = new Date('2026-01-01T00:00:00.000Z');
  const body = JSON.stringify({
    delivery: {
      id: 'dlv_1',
      subscriptionId: 'whsub_1',
      attempts: 1,
      createdAt: now.toISOString(),
      updatedAt: now.toISOString(),
    },
    event: { id: 'evt_1', type: 'balance.deposit.created', status: 'pending' },
  });
  const headers = (over: Record<string, string | undefined> = {}) => ({
    'X-Service-Signature': sign(secret, body),
    'X-Service-Timestamp': now.toISOString(),
    ...over,
  });

  it('accepts a genuine delivery (record or Headers) and returns the payload', () => {
    const ok = verifyWebhook(secret, body, headers(), { now });
    expect(ok.ok).toBe(true);
    if (ok.ok) expect(ok.payload.event.id).toBe('evt_1');
    expect(verifyWebhook(secret, Buffer.from(body), new Headers(headers()), { now }).ok).toBe(true);
    expect(verifyWebhook(secret, body, headers(), { now: new Date(now.getTime() + 299_000) }).ok).toBe(true);
  });

  it.each([
    ['a changed body', { body: body.replace('dlv_1', 'dlv_2') }, 'signature_mismatch'],
    ['another secret', { secret: 'whsec_someone-else' }, 'signature_mismatch'],
    ['no signature', { headers: { 'X-Service-Signature': undefined } }, 'missing_signature'],
    ['a short signature', { headers: { 'X-Service-Signature': 'abcd' } }, 'malformed_signature'],
    ['a non-hex signature', { headers: { 'X-Service-Signature': 'z'.repeat(64) } }, 'malformed_signature'],
    ['no timestamp', { headers: { 'X-Service-Timestamp': undefined } }, 'missing_timestamp'],
    ['a garbage timestamp', { headers: { 'X-Service-Timestamp': 'yesterday' } }, 'malformed_timestamp'],
    ['an old delivery', { now: new Date(now.getTime() + 301_000) }, 'timestamp_out_of_window'],
    [
      'a timestamp not matching the signed body',
      { headers: { 'X-Service-Timestamp': new Date(now.getTime() + 1000).toISOString() } },
      'timestamp_mismatch',
    ],
  ])('rejects %s', (_name, change: Record<string, any>, reason) => {
    const result = verifyWebhook(change.secret ?? secret, change.body ?? body, headers(change.headers), {
      now: change.now ?? now,
    });
    expect(result).toEqual({ ok: false, reason });
  });
});
