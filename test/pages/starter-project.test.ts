import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  api,
  connectTo,
  depositFor,
  signUpAndIn,
  startTestServer,
  type TestServer,
} from '../helpers/server.ts';

/**
 * A project that starts without a provider key (issue 38): "Start with the echo provider" on the
 * dashboard's new-project page (and `starter: true` on the admin API) makes the project on the
 * built-in echo provider with a starter price list, so the key page's "Try it" snippet is answered at
 * once — a connect link for a new user, the echo of the message for a funded one — never
 * `model_not_found`.
 */
const ROOT = 'root-admin-token-for-starter-tests-0123456789';
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer({ TOLLGATE_ADMIN_TOKEN: ROOT, TOLLGATE_SIGNUP: 'open' });
});
afterAll(async () => {
  await server?.close();
});

/** The page's text as a browser shows it (the entities the HTML escaping writes, decoded). */
const decodeEntities = (html: string) =>
  html
    .replaceAll('&#39;', "'")
    .replaceAll('&quot;', '"')
    .replaceAll('&lt;', '<')
    .replaceAll('&gt;', '>')
    .replaceAll('&amp;', '&');

const form = (cookie: string, body: Record<string, string>) => ({
  method: 'POST',
  redirect: 'manual' as const,
  headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
  body: new URLSearchParams(body).toString(),
});

describe('a new project on the echo provider', () => {
  it('from the dashboard: the key page’s snippet is answered the moment it is shown', async () => {
    const session = await signUpAndIn(server, {
      email: `starter-${Date.now()}@example.com`,
      password: 'correct horse battery staple',
    });
    const cookie = `tollgate_session=${encodeURIComponent(session)}`;
    const start = await (await fetch(`${server.url}/dashboard/start`, { headers: { cookie } })).text();
    expect(start).toContain('Connect your model provider');
    expect(start).toContain('Start with the echo provider');
    const csrf = /name="csrf" value="([^"]+)"/.exec(start)![1]!;

    const res = await fetch(
      `${server.url}/dashboard/start/echo`,
      form(cookie, { csrf, name: 'Try it', currency: 'usd' }),
    );
    expect(res.status).toBe(200);
    const page = decodeEntities(await res.text());
    expect(page).toContain('connect your model provider');
    // The JavaScript snippet, as a developer would copy it.
    const snippet = /<pre id="snippet-js">([\s\S]*?)<\/pre>/.exec(page)![1]!;
    const baseURL = /baseURL: '([^']+)'/.exec(snippet)![1]!;
    const apiKey = /apiKey: '([^']+)'/.exec(snippet)![1]!;
    const model = /model: '([^']+)'/.exec(snippet)![1]!;
    expect(model).toBe('starter-echo');

    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
    const ask = async () =>
      (
        await client.chat.completions.create({
          model,
          user: 'user-42', // your end user
          messages: [{ role: 'user', content: 'Hello' }],
        })
      ).choices[0]!.message.content!;
    // A new user is answered with the link to connect (the paywall's first step), not model_not_found.
    expect(await ask()).toMatch(/\/connect\//);

    const project = await server.ctx.db
      .selectFrom('projects')
      .selectAll()
      .where('name', '=', 'Try it')
      .executeTakeFirstOrThrow();
    await connectTo(server, { projectId: project.id }, 'user-42', project.owner_user_id ?? 'o');
    await depositFor(server.ctx, project, 'user-42', '1.00');
    expect(await ask()).toContain('Hello');
  });

  it('over the admin API: `starter: true` begins on the echo provider with the starter prices', async () => {
    const created = await api(server, ROOT, 'POST', '/admin/v1/projects', {
      name: 'API starter',
      starter: true,
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body.project.provider.baseUrl).toBe('echo://local');
    const models = await api(server, ROOT, 'GET', `/admin/v1/projects/${created.body.project.id}/models`);
    expect(models.body.models.map((m: { id: string }) => m.id)).toEqual(['starter-echo']);

    const plain = await api(server, ROOT, 'POST', '/admin/v1/projects', { name: 'API plain' });
    expect(plain.body.project.provider.baseUrl).toBeNull();
  });
});
