import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ECHO_UPSTREAM } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { type Sample, scrape, sumOf } from '../helpers/metrics-text.ts';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * The metering metrics move with real traffic through the real server: chat completions answered by the
 * echo provider (refused and served, streamed and not), deposits and charges over the REST API, and
 * webhook deliveries sent by the delivery worker to a receiver on loopback.
 */
let server: TestServer;
let project: SeededProject;
const trigger = { source: 'test', actorType: 'admin', actorId: 'test' };
const messages = [{ role: 'user', content: 'Count the tokens of this sentence' }];

beforeAll(async () => {
  server = await startTestServer();
  project = await seedProject(server.ctx, {
    upstreamUrl: ECHO_UPSTREAM,
    models: [
      { id: 'echo-req', pricing: { mode: 'per_request', perRequest: '0.25' } },
      { id: 'echo-tok', pricing: { mode: 'per_token', inputPerMillion: '1000', outputPerMillion: '2000' } },
    ],
  });
});
afterAll(async () => {
  await server?.close();
});

async function connect(user: string): Promise<void> {
  const ref = (await server.ctx.projects.get(project.projectId))!;
  await connectUser(server.ctx.db, server.ctx.events, ref, user, trigger);
}

function chat(model: string, user: string, stream = false) {
  return api(server, project.apiKey, 'POST', '/v1/chat/completions', {
    model,
    user,
    messages,
    stream,
    max_tokens: 50,
    ...(stream ? { stream_options: { include_usage: true } } : {}),
  });
}

/** The usage chunk of a streamed reply (text/event-stream). */
function streamedUsage(body: string): { prompt_tokens: number; completion_tokens: number } {
  const chunks = body
    .split('\n')
    .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)));
  const usage = chunks.find((c) => c.usage)?.usage;
  if (!usage) throw new Error(`no usage chunk in ${body}`);
  return usage;
}

/** Difference of a metric between two scrapes, for the samples whose labels include `where`. */
function delta(before: Sample[], after: Sample[], name: string, where: Record<string, string> = {}) {
  return sumOf(after, name, where) - sumOf(before, name, where);
}

const p = () => ({ project: project.projectId });

describe('chat requests', () => {
  it('counts a user who is not connected as connect_required, with no tokens and no charge', async () => {
    const before = await scrape(server.url);
    const res = await chat('echo-req', 'stranger');
    expect(res.status).toBe(200);
    expect(res.headers.get('x-tollgate-paywall')).toBe('connect_required');
    const after = await scrape(server.url);
    const where = {
      ...p(),
      model: 'echo-req',
      decision: 'connect_required',
      outcome: 'link',
      stream: 'false',
    };
    expect(delta(before, after, 'tollgate_requests_total', where)).toBe(1);
    expect(delta(before, after, 'tollgate_requests_total', { ...p(), decision: 'allowed' })).toBe(0);
    expect(delta(before, after, 'tollgate_input_tokens_total', p())).toBe(0);
    expect(delta(before, after, 'tollgate_charged_amount_total', p())).toBe(0);
    expect(delta(before, after, 'tollgate_upstream_latency_seconds_count', p())).toBe(0);
  });

  it('counts a connected user without balance as topup_required, streamed or not', async () => {
    await connect('poor');
    const before = await scrape(server.url);
    expect((await chat('echo-req', 'poor')).headers.get('x-tollgate-paywall')).toBe('topup_required');
    expect((await chat('echo-req', 'poor', true)).headers.get('x-tollgate-paywall')).toBe('topup_required');
    const after = await scrape(server.url);
    const where = { ...p(), model: 'echo-req', decision: 'topup_required', outcome: 'link' };
    expect(delta(before, after, 'tollgate_requests_total', { ...where, stream: 'false' })).toBe(1);
    expect(delta(before, after, 'tollgate_requests_total', { ...where, stream: 'true' })).toBe(1);
    expect(delta(before, after, 'tollgate_charged_amount_total', p())).toBe(0);
  });

  it('counts deposits in currency units, once per idempotency key', async () => {
    await connect('rich');
    const before = await scrape(server.url);
    const body = { user: 'rich', amount: '5.00' };
    const headers = { 'idempotency-key': 'metrics-deposit-1' };
    expect(
      (await api(server, project.apiKey, 'POST', '/v1/user/balance/deposit', body, headers)).status,
    ).toBe(201);
    const replay = await api(server, project.apiKey, 'POST', '/v1/user/balance/deposit', body, headers);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    const after = await scrape(server.url);
    expect(delta(before, after, 'tollgate_deposited_amount_total', { ...p(), currency: 'usd' })).toBe(5);
  });

  it('counts served requests: decision, outcome, tokens, the charged amount and latencies', async () => {
    const before = await scrape(server.url);
    const replies = [await chat('echo-req', 'rich'), await chat('echo-req', 'rich')];
    for (const r of replies) {
      expect(r.status).toBe(200);
      expect(r.headers.get('x-tollgate-paywall')).toBeNull();
    }
    const usage = replies.map((r) => r.body.usage as { prompt_tokens: number; completion_tokens: number });
    // Charges are settled off the response path: wait (bounded) for the counter, not for time.
    const after = await scrapeUntil((s) => delta(before, s, 'tollgate_charged_amount_total', p()) >= 0.5);

    const m = { ...p(), model: 'echo-req' };
    const served = { ...m, decision: 'allowed', outcome: 'success', stream: 'false' };
    expect(delta(before, after, 'tollgate_requests_total', served)).toBe(2);
    const input = usage.reduce((n, u) => n + u.prompt_tokens, 0);
    const output = usage.reduce((n, u) => n + u.completion_tokens, 0);
    expect(input).toBeGreaterThan(0);
    expect(delta(before, after, 'tollgate_input_tokens_total', m)).toBe(input);
    expect(delta(before, after, 'tollgate_output_tokens_total', m)).toBe(output);
    const charged = { ...m, currency: 'usd', source: 'chat' };
    expect(delta(before, after, 'tollgate_charged_amount_total', charged)).toBeCloseTo(0.5, 9);
    expect(delta(before, after, 'tollgate_upstream_latency_seconds_count', { ...m, stream: 'false' })).toBe(
      2,
    );
    expect(delta(before, after, 'tollgate_overhead_latency_seconds_count', m)).toBe(2);
    const overhead = delta(before, after, 'tollgate_overhead_latency_seconds_sum', m);
    expect(overhead).toBeGreaterThanOrEqual(0);
    expect(overhead).toBeLessThan(10);
    expect(sumOf(after, 'tollgate_holds_open', p())).toBe(0);
  });

  it('counts a streamed per-token request with its time to first token and its exact cost', async () => {
    const before = await scrape(server.url);
    const res = await chat('echo-tok', 'rich', true);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-tollgate-paywall')).toBeNull();
    const usage = streamedUsage(res.body as string);
    const cost = (usage.prompt_tokens * 1000 + usage.completion_tokens * 2000) / 1_000_000;
    const m = { ...p(), model: 'echo-tok' };
    const after = await scrapeUntil((s) => delta(before, s, 'tollgate_charged_amount_total', m) > 0);

    const served = { ...m, decision: 'allowed', outcome: 'success', stream: 'true' };
    expect(delta(before, after, 'tollgate_requests_total', served)).toBe(1);
    expect(delta(before, after, 'tollgate_time_to_first_token_seconds_count', m)).toBe(1);
    expect(delta(before, after, 'tollgate_upstream_latency_seconds_count', { ...m, stream: 'true' })).toBe(1);
    expect(delta(before, after, 'tollgate_input_tokens_total', m)).toBe(usage.prompt_tokens);
    expect(delta(before, after, 'tollgate_output_tokens_total', m)).toBe(usage.completion_tokens);
    expect(delta(before, after, 'tollgate_charged_amount_total', { ...m, source: 'chat' })).toBeCloseTo(
      cost,
      9,
    );
    expect(sumOf(after, 'tollgate_holds_open', p())).toBe(0);
  });

  it('counts manual charges with source api and no model', async () => {
    const before = await scrape(server.url);
    const res = await api(server, project.apiKey, 'POST', '/v1/user/charge', {
      user: 'rich',
      amount: '1.00',
    });
    expect(res.body.success).toBe(true);
    const after = await scrape(server.url);
    const where = { ...p(), model: '', currency: 'usd', source: 'api' };
    expect(delta(before, after, 'tollgate_charged_amount_total', where)).toBe(1);
  });

  it('never labels a series with the end user', async () => {
    const samples = await scrape(server.url);
    for (const s of samples) {
      for (const value of Object.values(s.labels)) expect(['stranger', 'poor', 'rich']).not.toContain(value);
    }
  });
});

describe('webhook deliveries', () => {
  let receiver: http.Server;
  let receiverUrl = '';
  let worker: DeliveryWorker | undefined;

  beforeAll(async () => {
    // /ok answers 200, /gone 410 (ends the delivery at once), /busy 503 (retried later: stays pending).
    receiver = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.statusCode = req.url === '/ok' ? 200 : req.url === '/gone' ? 410 : 503;
        res.end();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await worker?.stop(1000);
    await new Promise((resolve) => receiver?.close(resolve));
  });

  it('counts deliveries by outcome, their attempts and duration, and reports the pending queue', async () => {
    for (const path of ['/ok', '/gone', '/busy']) {
      const res = await api(server, project.apiKey, 'POST', '/v1/webhooks/subscriptions', {
        url: receiverUrl + path,
        events: ['balance.*'],
      });
      expect(res.status).toBe(201);
    }
    const before = await scrape(server.url);
    const deposit = { user: 'rich', amount: '1.00' };
    expect((await api(server, project.apiKey, 'POST', '/v1/user/balance/deposit', deposit)).status).toBe(201);
    worker = startDeliveryWorker(server.ctx, { pollIntervalMs: 50, statsIntervalMs: 50 });
    await worker.ready;

    const after = await scrapeUntil(
      (s) =>
        delta(before, s, 'tollgate_webhook_deliveries_total', { ...p(), outcome: 'success' }) >= 1 &&
        delta(before, s, 'tollgate_webhook_deliveries_total', { ...p(), outcome: 'error' }) >= 1 &&
        delta(before, s, 'tollgate_webhook_deliveries_total', { ...p(), outcome: 'retry' }) >= 1 &&
        sumOf(s, 'tollgate_webhook_deliveries_pending') >= 1 &&
        sumOf(s, 'tollgate_webhook_oldest_pending_age_seconds') > 0,
    );
    expect(delta(before, after, 'tollgate_events_fanned_out_total')).toBeGreaterThanOrEqual(1);
    // Attempts are observed when a delivery ends: one attempt each for the success and the 410.
    expect(delta(before, after, 'tollgate_webhook_delivery_attempts_count', { outcome: 'success' })).toBe(1);
    expect(delta(before, after, 'tollgate_webhook_delivery_attempts_sum', { outcome: 'success' })).toBe(1);
    expect(delta(before, after, 'tollgate_webhook_delivery_attempts_count', { outcome: 'error' })).toBe(1);
    expect(delta(before, after, 'tollgate_webhook_delivery_attempts_count', { outcome: 'retry' })).toBe(0);
    expect(delta(before, after, 'tollgate_webhook_delivery_duration_seconds_count')).toBeGreaterThanOrEqual(
      3,
    );
    // The 503 is retried with a 30 s backoff: it stays pending, and the oldest pending age is below a minute.
    expect(sumOf(after, 'tollgate_webhook_oldest_pending_age_seconds')).toBeLessThan(60);
  });
});

/** Scrapes until `accept` holds (bounded: 15 s); returns the accepted scrape. */
async function scrapeUntil(accept: (samples: Sample[]) => boolean): Promise<Sample[]> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const samples = await scrape(server.url);
    if (accept(samples)) return samples;
    if (Date.now() > deadline) throw new Error('metrics did not reach the expected values within 15 s');
    await new Promise((r) => setTimeout(r, 25));
  }
}
