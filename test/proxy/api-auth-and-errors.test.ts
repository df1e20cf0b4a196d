import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, type SeededProject, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

let server: TestServer;
let project: SeededProject;

beforeAll(async () => {
  server = await startTestServer({ BODY_LIMIT_BYTES: '2048' });
  project = await seedProject(server.ctx, {
    models: [{ id: 'quick', pricing: { mode: 'per_request', perRequest: '0.01' } }],
  });
});
afterAll(() => server?.close());

describe('authentication', () => {
  it('rejects a missing, malformed or unknown key with 401 invalid_api_key', async () => {
    for (const header of [undefined, 'Basic abc', 'Bearer tg_unknown']) {
      const res = await fetch(`${server.url}/v1/models`, {
        headers: header ? { authorization: header } : {},
      });
      expect(res.status).toBe(401);
      const body = (await res.json()) as any;
      expect(body.error).toMatchObject({
        type: 'authentication_error',
        code: 'invalid_api_key',
        param: null,
      });
      expect(typeof body.error.message).toBe('string');
    }
  });

  it('makes the official openai client raise AuthenticationError', async () => {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'tg_wrong', maxRetries: 0 });
    await expect(client.models.list()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  });

  it('stops accepting a key as soon as it is revoked', async () => {
    const extra = await seedProject(server.ctx);
    expect((await api(server, extra.apiKey, 'GET', '/v1/models')).status).toBe(200);
    await server.ctx.keys.revoke(extra.apiKeyId);
    expect((await api(server, extra.apiKey, 'GET', '/v1/models')).status).toBe(401);
  });
});

describe('errors', () => {
  it('answers malformed JSON with 400 invalid_json', async () => {
    const res = await api(server, project.apiKey, 'POST', '/v1/models', '{"model":', {});
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_json' });
  });

  it('answers a body over the limit with 413', async () => {
    const res = await api(
      server,
      project.apiKey,
      'POST',
      '/v1/models',
      JSON.stringify({ x: 'y'.repeat(4096) }),
    );
    expect(res.status).toBe(413);
    expect(res.body.error).toMatchObject({ code: 'request_too_large' });
  });

  it('answers an unknown URL with 404 in the OpenAI shape', async () => {
    const res = await api(server, project.apiKey, 'GET', '/v1/nothing-here');
    expect(res.status).toBe(404);
    expect(res.body.error).toMatchObject({ type: 'not_found_error', code: 'unknown_url' });
  });

  it('answers a malformed URL with 400 in the OpenAI shape', async () => {
    const res = await api(server, project.apiKey, 'GET', '/v1/models/%zz');
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ type: 'invalid_request_error', code: 'FST_ERR_BAD_URL' });
  });

  it('answers an unknown model with 404 model_not_found', async () => {
    const res = await api(server, project.apiKey, 'GET', '/v1/models/nope');
    expect(res.status).toBe(404);
    expect(res.body.error).toMatchObject({ code: 'model_not_found', param: 'model' });
  });
});

describe('health', () => {
  it('reports live and ready', async () => {
    expect((await api(server, undefined, 'GET', '/healthz')).body).toEqual({ status: 'ok' });
    const ready = await api(server, undefined, 'GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.body).toMatchObject({ status: 'ready', checks: { database: 'ok', migrations: 'ok' } });
  });
});
