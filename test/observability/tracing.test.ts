import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/index.ts';
import { applyPricing } from '../../src/models/service.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { logTraceIds, startTracing, tracesUrl, tracingEnabled } from '../../src/tracing/index.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { type DeliveryWorker, startDeliveryWorker } from '../../src/webhooks/worker/index.ts';
import { type ChatFixture, startChatFixture } from '../helpers/chat-fixture.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Traces (OpenTelemetry) end to end: a real Tollgate server exports to an OTLP/HTTP receiver this test
 * owns on loopback. One paid streaming request with a route fallback gives the tree request → admission
 * (limits, hold) → two provider attempts → settle; the delivery of the webhook event it caused is a span
 * of its own trace, linked to the request's; the client's `traceparent` is continued and the provider
 * gets the attempt's. Tracing off: nothing is exported.
 */

interface Received {
  contentType: string;
  body: Buffer;
}

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  links?: Array<{ traceId: string; spanId: string }>;
  status?: { code?: number };
}

/** An OTLP/HTTP receiver: records every export, wakes the waiters. */
async function startReceiver(): Promise<{
  url: string;
  exports: Received[];
  next(): Promise<void>;
  close(): Promise<void>;
}> {
  const exports: Received[] = [];
  let waiters: Array<() => void> = [];
  const server: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      exports.push({ contentType: String(req.headers['content-type']), body: Buffer.concat(parts) });
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      const w = waiters;
      waiters = [];
      for (const wake of w) wake();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/v1/traces`,
    exports,
    next: () => new Promise<void>((resolve) => waiters.push(resolve)),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

function spansOf(exports: Received[]): OtlpSpan[] {
  const spans: OtlpSpan[] = [];
  for (const e of exports) {
    const doc = JSON.parse(e.body.toString('utf8'));
    for (const rs of doc.resourceSpans ?? [])
      for (const ss of rs.scopeSpans ?? []) spans.push(...(ss.spans ?? []));
  }
  return spans;
}

function attr(span: OtlpSpan, key: string): unknown {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  if (!v) return undefined;
  if ('intValue' in v) return Number(v.intValue);
  return Object.values(v)[0];
}

const USER = 'user-secret-id-4711';
const PROMPT = 'the confidential prompt text';
const CLIENT_TRACE = '0af7651916cd43dd8448eb211c80319c';
const CLIENT_SPAN = 'b7ad6b7169203331';

describe('traces over OTLP/HTTP (http/json)', () => {
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let hooks: Server;
  let hookUrl: string;
  let delivered!: Promise<IncomingHttpHeaders>;
  let f: ChatFixture;
  let other: MockUpstream;
  let worker: DeliveryWorker;

  beforeAll(async () => {
    receiver = await startReceiver();
    let onHook!: (h: IncomingHttpHeaders) => void;
    delivered = new Promise((resolve) => {
      onHook = resolve;
    });
    hooks = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200).end('ok');
        onHook(req.headers);
      });
    });
    await new Promise<void>((resolve) => hooks.listen(0, '127.0.0.1', resolve));
    hookUrl = `http://127.0.0.1:${(hooks.address() as { port: number }).port}/hook`;
    f = await startChatFixture({
      models: [
        { id: 'plain', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.01' } },
      ],
      env: {
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        WEBHOOK_POLL_INTERVAL_MS: '100',
      },
    });
    other = await startMockUpstream();
    const ctx = f.ctx;
    const id = f.project.id;
    await upsertProvider(ctx.db, ctx.sealer, id, { name: 'a', baseUrl: f.mock.baseUrl, key: 'sk-a' });
    await upsertProvider(ctx.db, ctx.sealer, id, { name: 'b', baseUrl: other.baseUrl, key: 'sk-b' });
    await applyPricing(ctx.db, id, {
      currency: 'usd',
      models: [
        {
          id: 'traced',
          routes: [
            { provider: 'a', model: 'fail500' },
            { provider: 'b', model: 'ok-b' },
          ],
          pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' },
        },
      ],
    });
    await ctx.projects.changed(id);
    f.mock.behaviors.set('fail500', { failStatus: 500 });
    await createSubscription(
      ctx,
      id,
      { url: hookUrl, events: ['proxy.request.completed'] },
      { createdBy: 'test' },
    );
    worker = startDeliveryWorker(ctx);
    await worker.ready;
  });
  afterAll(async () => {
    await worker?.stop(1000);
    await f?.close();
    await other?.close();
    await receiver?.close();
    await new Promise((resolve) => hooks?.close(resolve));
  });

  it('exports the span tree of a paid streaming request with a fallback, and the linked delivery', async () => {
    expect(f.ctx.tracing.enabled).toBe(true);
    await f.fund(USER, '5');
    const stream = await f.client.chat.completions.create(
      { model: 'traced', user: USER, stream: true, messages: [{ role: 'user', content: PROMPT }] },
      { headers: { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } },
    );
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    await f.settled();
    await delivered;
    // The delivery span ends once its result is in; flush until it has arrived.
    let spans: OtlpSpan[] = [];
    for (let i = 0; i < 50; i++) {
      await f.ctx.tracing.flush();
      spans = spansOf(receiver.exports);
      if (spans.some((s) => s.name === 'tollgate.webhook.delivery')) break;
      await Promise.race([receiver.next(), new Promise((r) => setTimeout(r, 100))]);
    }
    expect(receiver.exports.every((e) => e.contentType.startsWith('application/json'))).toBe(true);

    const request = spans.find((s) => s.name === 'chat traced')!;
    expect(request).toBeDefined();
    // The client's trace is continued.
    expect(request.traceId).toBe(CLIENT_TRACE);
    expect(request.parentSpanId).toBe(CLIENT_SPAN);
    expect(request.kind).toBe(2); // SERVER
    const children = (parent: OtlpSpan) => spans.filter((s) => s.parentSpanId === parent.spanId);
    const admission = children(request).find((s) => s.name === 'tollgate.admission')!;
    expect(admission).toBeDefined();
    expect(children(admission).map((s) => s.name)).toContain('tollgate.hold');
    expect(attr(admission, 'tollgate.decision')).toBe('allowed');
    const attempts = children(request).filter((s) => s.name === 'tollgate.provider.attempt');
    expect(attempts).toHaveLength(2);
    attempts.sort((a, b) => Number(attr(a, 'tollgate.attempt')) - Number(attr(b, 'tollgate.attempt')));
    expect(attempts.map((s) => attr(s, 'tollgate.provider'))).toEqual(['a', 'b']);
    expect(attempts.map((s) => attr(s, 'tollgate.outcome'))).toEqual(['status', 'success']);
    expect(attr(attempts[0]!, 'http.response.status_code')).toBe(500);
    const settle = children(request).find((s) => s.name === 'tollgate.settle')!;
    expect(settle).toBeDefined();
    expect(Number(attr(settle, 'tollgate.amount.charged'))).toBeGreaterThan(0);

    // Attributes of the request span.
    expect(attr(request, 'tollgate.project.id')).toBe(f.project.id);
    expect(attr(request, 'gen_ai.request.model')).toBe('traced');
    expect(attr(request, 'tollgate.api')).toBe('chat');
    expect(attr(request, 'tollgate.decision')).toBe('allowed');
    expect(attr(request, 'tollgate.stream')).toBe(true);
    expect(Number(attr(request, 'gen_ai.usage.input_tokens'))).toBeGreaterThan(0);
    expect(Number(attr(request, 'gen_ai.usage.output_tokens'))).toBeGreaterThan(0);
    expect(attr(request, 'tollgate.amount.charged')).toBe(attr(settle, 'tollgate.amount.charged'));
    expect(attr(request, 'tollgate.currency')).toBe('usd');

    // The provider that answered got the second attempt's traceparent (the client's trace).
    const sent = other.requests.find((r) => r.body.model === 'ok-b')!;
    expect(sent.headers.traceparent).toBe(`00-${CLIENT_TRACE}-${attempts[1]!.spanId}-01`);

    // The delivery: its own trace, linked to the request's.
    const delivery = spans.find((s) => s.name === 'tollgate.webhook.delivery')!;
    expect(delivery).toBeDefined();
    expect(delivery.traceId).not.toBe(CLIENT_TRACE);
    expect(delivery.links?.map((l) => l.traceId)).toContain(CLIENT_TRACE);
    expect(attr(delivery, 'tollgate.event.type')).toBe('proxy.request.completed');
    expect(attr(delivery, 'tollgate.outcome')).toBe('success');

    // Never the end user's id nor the prompt, anywhere in what was exported.
    const all = receiver.exports.map((e) => e.body.toString('utf8')).join('\n');
    expect(all).not.toContain(USER);
    expect(all).not.toContain(PROMPT);
  });

  it('records the decision of a refused request, with no provider attempt', async () => {
    const before = other.requests.length + f.mock.requests.length;
    await f.client.chat.completions.create({
      model: 'traced',
      user: 'not-connected-user',
      messages: [{ role: 'user', content: PROMPT }],
    });
    expect(other.requests.length + f.mock.requests.length).toBe(before);
    let refused: OtlpSpan | undefined;
    for (let i = 0; i < 50 && !refused; i++) {
      await f.ctx.tracing.flush();
      refused = spansOf(receiver.exports).find(
        (s) => s.name === 'chat traced' && attr(s, 'tollgate.decision') === 'connect_required',
      );
      if (!refused) await Promise.race([receiver.next(), new Promise((r) => setTimeout(r, 100))]);
    }
    expect(refused).toBeDefined();
    const spans = spansOf(receiver.exports);
    const children = spans.filter((s) => s.parentSpanId === refused!.spanId).map((s) => s.name);
    expect(children).toContain('tollgate.admission');
    expect(children).not.toContain('tollgate.provider.attempt');
    expect(children).not.toContain('tollgate.settle');
    expect(receiver.exports.map((e) => e.body.toString('utf8')).join('\n')).not.toContain(
      'not-connected-user',
    );
  });
});

describe('tracing settings', () => {
  it('is off unless an endpoint is set or OTEL_TRACES_EXPORTER=otlp; none wins', () => {
    expect(tracingEnabled(loadConfig({}))).toBe(false);
    expect(tracingEnabled(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' }))).toBe(true);
    expect(tracingEnabled(loadConfig({ OTEL_TRACES_EXPORTER: 'otlp' }))).toBe(true);
    expect(
      tracingEnabled(
        loadConfig({ OTEL_TRACES_EXPORTER: 'none', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' }),
      ),
    ).toBe(false);
    expect(
      tracingEnabled(loadConfig({ OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' })),
    ).toBe(false);
    expect(tracesUrl(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318/' }))).toBe(
      'http://c:4318/v1/traces',
    );
    expect(tracesUrl(loadConfig({ OTEL_TRACES_EXPORTER: 'otlp' }))).toBe('http://localhost:4318/v1/traces');
    expect(
      tracesUrl(
        loadConfig({
          OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318',
          OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://t/x',
        }),
      ),
    ).toBe('http://t/x');
  });

  it('exports http/protobuf', async () => {
    const receiver = await startReceiver();
    try {
      const tracing = await startTracing(loadConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url }));
      // Log lines written inside a span carry its ids (the pino mixin); outside, nothing.
      expect(logTraceIds()).toEqual({});
      const ids = await tracing.span('tollgate.protobuf.check', { 'tollgate.api': 'chat' }, async (span) => ({
        logged: logTraceIds(),
        span: span!.spanContext(),
      }));
      expect(ids.logged).toEqual({ traceId: ids.span.traceId, spanId: ids.span.spanId });
      const arrived = receiver.next();
      await tracing.flush();
      await arrived;
      await tracing.shutdown();
      const e = receiver.exports[0]!;
      expect(e.contentType).toBe('application/x-protobuf');
      expect(e.body.length).toBeGreaterThan(0);
      // Strings are stored as they are in protobuf: the span's name and attribute are in the body.
      expect(e.body.includes('tollgate.protobuf.check')).toBe(true);
      expect(e.body.includes('tollgate.api')).toBe(true);
    } finally {
      await receiver.close();
    }
  });
});

describe('tracing off', () => {
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let f: ChatFixture;
  beforeAll(async () => {
    receiver = await startReceiver();
    f = await startChatFixture({
      models: [
        { id: 'plain', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.01' } },
      ],
      // An endpoint, but the exporter is `none`.
      env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url, OTEL_TRACES_EXPORTER: 'none' },
    });
  });
  afterAll(async () => {
    await f?.close();
    await receiver?.close();
  });

  it('exports nothing and sends no traceparent of its own', async () => {
    expect(f.ctx.tracing.enabled).toBe(false);
    await f.fund(USER, '5');
    const answer = await f.client.chat.completions.create({
      model: 'plain',
      user: USER,
      messages: [{ role: 'user', content: PROMPT }],
    });
    expect(answer.choices[0]!.message.content).toBeTruthy();
    await f.settled();
    await f.ctx.tracing.flush();
    expect(receiver.exports).toHaveLength(0);
    expect(f.mock.requests.at(-1)!.headers.traceparent).toBeUndefined();
  });
});
