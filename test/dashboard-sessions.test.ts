import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';

/** Dashboard sessions over plain HTTP: cookies, CSRF on every form post, sign-out, the sign-in rate limit. */
let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => {
  await server?.close();
});

interface Got {
  status: number;
  location: string | null;
  cookies: string[];
  text: string;
}

async function request(
  path: string,
  init: {
    method?: string;
    form?: Record<string, string>;
    cookie?: string;
    headers?: Record<string, string>;
  } = {},
): Promise<Got> {
  const res = await fetch(server.url + path, {
    method: init.method ?? (init.form ? 'POST' : 'GET'),
    redirect: 'manual',
    headers: {
      ...(init.cookie ? { cookie: init.cookie } : {}),
      ...(init.form ? { 'content-type': 'application/x-www-form-urlencoded' } : {}),
      ...init.headers,
    },
    ...(init.form ? { body: new URLSearchParams(init.form).toString() } : {}),
  });
  return {
    status: res.status,
    location: res.headers.get('location'),
    cookies: res.headers.getSetCookie(),
    text: await res.text(),
  };
}

const cookieValue = (cookies: string[], name: string) =>
  cookies
    .find((c) => c.startsWith(`${name}=`))
    ?.split(';')[0]
    ?.slice(name.length + 1);
const csrfOf = (html: string) => /name="csrf" value="([^"]+)"/.exec(html)?.[1];

async function signUp(email: string, headers: Record<string, string> = {}) {
  const form = await request('/dashboard/signup');
  const anon = cookieValue(form.cookies, 'tollgate_csrf')!;
  const done = await request('/dashboard/signup', {
    form: { csrf: csrfOf(form.text)!, email, password: 'a long enough password' },
    cookie: `tollgate_csrf=${anon}`,
    headers,
  });
  return { done, session: cookieValue(done.cookies, 'tollgate_session')! };
}

describe('dashboard sessions', () => {
  it('sends visitors to sign in, and sets HttpOnly SameSite=Strict cookies (Secure behind https)', async () => {
    const home = await request('/dashboard');
    expect(home.status).toBe(303);
    expect(home.location).toBe('/dashboard/signin');
    const missing = await request('/dashboard/no-such-page');
    expect(missing.status).toBe(404);
    expect(missing.text).toContain('<h1>Not found</h1>');

    const form = await request('/dashboard/signup');
    expect(form.status).toBe(200);
    expect(form.text).toContain('<label for="email">E-mail</label>');
    const anonCookie = form.cookies.find((c) => c.startsWith('tollgate_csrf='))!;
    expect(anonCookie).toMatch(/HttpOnly/);
    expect(anonCookie).toMatch(/SameSite=Strict/);

    const { done } = await signUp('cookie@example.com');
    expect(done.status).toBe(303);
    expect(done.location).toBe('/dashboard/start');
    const session = done.cookies.find((c) => c.startsWith('tollgate_session='))!;
    expect(session).toMatch(/HttpOnly/);
    expect(session).toMatch(/SameSite=Strict/);
    expect(session).not.toMatch(/Secure/);

    const behindTls = await signUp('tls@example.com', { 'x-forwarded-proto': 'https' });
    expect(behindTls.done.cookies.find((c) => c.startsWith('tollgate_session='))).toMatch(/; Secure/);
  });

  it('refuses form posts without the CSRF token, with a wrong one, or from another site', async () => {
    const noToken = await request('/dashboard/signup', {
      form: { email: 'x@example.com', password: 'a long enough password' },
    });
    expect(noToken.status).toBe(403);

    const { session } = await signUp('csrf@example.com');
    const cookie = `tollgate_session=${session}`;
    const start = await request('/dashboard/start', { cookie });
    expect(start.status).toBe(200);
    const csrf = csrfOf(start.text)!;
    const form = { csrf, name: 'X', baseUrl: 'echo://local', apiKey: 'k', currency: 'usd' };

    expect((await request('/dashboard/start', { cookie, form: { ...form, csrf: 'wrong' } })).status).toBe(
      403,
    );
    expect(
      (await request('/dashboard/start', { cookie, form, headers: { origin: 'https://evil.example' } }))
        .status,
    ).toBe(403);
    expect(
      (await request('/dashboard/start', { cookie, form, headers: { 'sec-fetch-site': 'cross-site' } }))
        .status,
    ).toBe(403);
    // The anonymous token does not stand in for the session's.
    const anon = await request('/dashboard/signin');
    const anonToken = cookieValue(anon.cookies, 'tollgate_csrf')!;
    expect(
      (
        await request('/dashboard/start', {
          cookie: `${cookie}; tollgate_csrf=${anonToken}`,
          form: { ...form, csrf: anonToken },
        })
      ).status,
    ).toBe(403);

    const ok = await request('/dashboard/start', { cookie, form });
    expect(ok.status).toBe(200);
    expect(ok.text).toMatch(/tg_[A-Za-z0-9_-]{20,}/);

    // Sign-out ends the session on the server, not just in the browser.
    const out = await request('/dashboard/signout', { cookie, form: { csrf } });
    expect(out.status).toBe(303);
    expect(cookieValue(out.cookies, 'tollgate_session')).toBe('');
    expect((await request('/dashboard', { cookie })).location).toBe('/dashboard/signin');
  });

  it('rate-limits failed sign-ins', async () => {
    await signUp('limited@example.com');
    const form = await request('/dashboard/signin');
    const anon = cookieValue(form.cookies, 'tollgate_csrf')!;
    const attempt = (password: string) =>
      request('/dashboard/signin', {
        form: { csrf: csrfOf(form.text)!, email: 'limited@example.com', password },
        cookie: `tollgate_csrf=${anon}`,
      });
    for (let i = 0; i < 5; i++) {
      const wrong = await attempt(`wrong password ${i}`);
      expect(decodeURIComponent(wrong.location ?? '')).toMatch(/Incorrect e-mail or password/);
    }
    const limited = await attempt('a long enough password');
    expect(decodeURIComponent(limited.location ?? '')).toMatch(/Too many failed sign-in attempts/);
    expect(cookieValue(limited.cookies, 'tollgate_session')).toBeUndefined();
  });

  it('shows a developer only their own projects', async () => {
    const a = await signUp('dash-a@example.com');
    const b = await signUp('dash-b@example.com');
    const start = await request('/dashboard/start', { cookie: `tollgate_session=${b.session}` });
    await request('/dashboard/start', {
      cookie: `tollgate_session=${b.session}`,
      form: {
        csrf: csrfOf(start.text)!,
        name: 'B only',
        baseUrl: 'echo://local',
        apiKey: 'k',
        currency: 'usd',
      },
    });
    const projectId = (
      await server.ctx.db
        .selectFrom('projects')
        .select('id')
        .where('name', '=', 'B only')
        .executeTakeFirstOrThrow()
    ).id;
    const seen = await request(`/dashboard/projects/${projectId}`, {
      cookie: `tollgate_session=${a.session}`,
    });
    expect(seen.status).toBe(404);
    expect(seen.text).not.toContain('B only');
  });
});
