import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { Money } from '../../src/core/money.ts';
import { buildServer } from '../../src/http/server.ts';
import { ECHO_UPSTREAM, getProject } from '../../src/projects/service.ts';
import { createTestContext } from '../helpers/context.ts';
import { scrape, sumOf } from '../helpers/metrics-text.ts';
import {
  api,
  connectTo,
  depositFor,
  type SeededProject,
  seedProject,
  type TestServer,
} from '../helpers/server.ts';

/**
 * One log line per `/v1` request at the default level (src/http/request-logger.ts), with what the
 * metered flow decided (src/metering/request-log.ts) — and never the prompt or the end user's id; and
 * requests Tollgate's own validation refuses counted as `invalid_request` in `tollgate_requests_total`,
 * not as provider failures.
 */
let server: TestServer;
let project: SeededProject;
const lines: Array<Record<string, any>> = [];
const SECRET_PROMPT = 'the launch code is 0000';
let aliceHash: string | undefined;

beforeAll(async () => {
  const ctx: AppContext = await createTestContext({ LOG_LEVEL: 'info' });
  // The server's log, as pino writes it to stdout, kept here.
  ctx.log = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const app: FastifyInstance = await buildServer(ctx);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  ctx.publicBaseUrl = url;
  server = {
    ctx,
    app,
    url,
    async close() {
      await app.close();
      await ctx.close();
    },
  };
  project = await seedProject(ctx, {
    upstreamUrl: ECHO_UPSTREAM,
    models: [
      { id: 'echo-tok', pricing: { mode: 'per_token', inputPerMillion: '1000', outputPerMillion: '2000' } },
    ],
  });
  await connectTo(server, project, 'alice');
  await depositFor(ctx, await getProject(ctx.db, project.projectId), 'alice', '10.00');
});
afterAll(() => server?.close());

/** The request lines written since `from`, once the responses ended. */
function requestLines(from: number): Array<Record<string, any>> {
  return lines.slice(from).filter((l) => l.msg === 'request');
}

function chat(user: string, body: Record<string, unknown> = {}) {
  return api(
    server,
    project.apiKey,
    'POST',
    '/v1/chat/completions',
    { model: 'echo-tok', messages: [{ role: 'user', content: SECRET_PROMPT }], max_tokens: 20, ...body },
    { 'x-service-user': user },
  );
}

describe('the request log line', () => {
  it('writes one line for a served request: its ids, route, status, model, decision, the amount charged and duration', async () => {
    const from = lines.length;
    const res = await chat('alice');
    expect(res.status).toBe(200);
    await server.app.metering.idle();
    const [line, ...more] = requestLines(from);
    expect(more).toEqual([]);
    const { prompt_tokens: input, completion_tokens: output } = res.body.usage;
    const cost = new Money(input).times('1000').plus(new Money(output).times('2000')).div(1_000_000);
    expect(line).toMatchObject({
      level: 30,
      method: 'POST',
      route: '/v1/chat/completions',
      status: 200,
      project: project.projectId,
      requestId: res.headers.get('x-tollgate-request-id'),
      model: 'echo-tok',
      decision: 'allowed',
      outcome: 'success',
      charged: cost.toFixed(),
      currency: 'usd',
    });
    // The end user, as a keyed hash: 12 characters, the same for every request of one user.
    expect(line!.user).toMatch(/^[\w-]{12}$/);
    const again = lines.length;
    await chat('alice');
    expect(requestLines(again)[0]!.user).toBe(line!.user);
    aliceHash = line!.user;
    expect(line!.reqId).toBeDefined();
    expect(line!.ms).toBeGreaterThanOrEqual(0);
    const text = JSON.stringify(line);
    expect(text).not.toContain(SECRET_PROMPT);
    expect(text).not.toContain('alice');
  });

  it('names the paywall decision of a refused user, charged nothing', async () => {
    const from = lines.length;
    const res = await chat('bob');
    expect(res.headers.get('x-tollgate-paywall')).toBe('connect_required');
    const [line] = requestLines(from);
    expect(line).toMatchObject({
      status: 200,
      decision: 'connect_required',
      charged: '0',
    });
    expect(line!.user).toMatch(/^[\w-]{12}$/);
    expect(line!.user).not.toBe(aliceHash);
  });

  it('writes a line for requests the metered flow never sees: a bad key, a schema 400, an unknown URL, a balance read', async () => {
    const from = lines.length;
    expect((await api(server, 'tg_wrong', 'GET', '/v1/models')).status).toBe(401);
    expect((await chat('alice', { messages: 'not a list' })).status).toBe(400);
    expect((await api(server, project.apiKey, 'GET', '/v1/nothing-here')).status).toBe(404);
    expect((await api(server, project.apiKey, 'GET', '/v1/user/balance?user=alice')).status).toBe(200);
    const got = requestLines(from).map(({ method, route, status, decision, model }) => ({
      method,
      route,
      status,
      decision,
      model,
    }));
    expect(got).toEqual([
      { method: 'GET', route: '/v1/models', status: 401, decision: undefined, model: undefined },
      {
        method: 'POST',
        route: '/v1/chat/completions',
        status: 400,
        decision: 'invalid_request',
        model: 'echo-tok',
      },
      { method: 'GET', route: 'unmatched', status: 404, decision: undefined, model: undefined },
      { method: 'GET', route: '/v1/user/balance', status: 200, decision: undefined, model: undefined },
    ]);
  });
});

describe('requests refused by Tollgate’s own validation', () => {
  const where = () => ({ project: project.projectId, decision: 'invalid_request', outcome: 'refused' });

  it('counts a field the translation cannot carry as invalid_request, not as a provider failure', async () => {
    const before = await scrape(server.url);
    const from = lines.length;
    // An Anthropic file-sourced image, to a model reached through Chat Completions (the echo provider).
    const res = await api(
      server,
      project.apiKey,
      'POST',
      '/v1/messages',
      {
        model: 'echo-tok',
        max_tokens: 20,
        messages: [
          { role: 'user', content: [{ type: 'image', source: { type: 'file', file_id: 'file_1' } }] },
        ],
      },
      { 'x-service-user': 'alice', 'anthropic-version': '2023-06-01' },
    );
    expect(res.status).toBe(400);
    expect(res.body.error.code).toBe('untranslatable_field');
    const after = await scrape(server.url);
    const delta = (name: string, labels: Record<string, string>) =>
      sumOf(after, name, labels) - sumOf(before, name, labels);
    expect(delta('tollgate_requests_total', { ...where(), model: 'echo-tok', stream: 'false' })).toBe(1);
    expect(delta('tollgate_requests_total', { project: project.projectId, decision: 'allowed' })).toBe(0);
    expect(delta('tollgate_upstream_errors_total', { project: project.projectId })).toBe(0);
    expect(requestLines(from)).toMatchObject([
      { route: '/v1/messages', status: 400, model: 'echo-tok', decision: 'invalid_request', charged: '0' },
    ]);
  });

  it('counts schema and unknown-model refusals of the metered APIs, the model label bounded', async () => {
    const before = await scrape(server.url);
    expect((await chat('alice', { messages: 'not a list', stream: true })).status).toBe(400);
    expect((await chat('alice', { model: 'no-such-model' })).status).toBe(404);
    expect((await api(server, project.apiKey, 'POST', '/v1/responses', { model: 'echo-tok' })).status).toBe(
      400,
    );
    const after = await scrape(server.url);
    const delta = (labels: Record<string, string>) =>
      sumOf(after, 'tollgate_requests_total', labels) - sumOf(before, 'tollgate_requests_total', labels);
    expect(delta({ ...where(), model: 'echo-tok', stream: 'true' })).toBe(1);
    expect(delta({ ...where(), model: 'echo-tok', stream: 'false' })).toBe(1);
    expect(delta({ ...where(), model: '' })).toBe(1);
    expect(after.some((s) => s.labels.model === 'no-such-model')).toBe(false);
  });
});
