import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/** Dashboard sessions over plain HTTP: cookies, CSRF on every form post, sign-out, the sign-in rate limit. */
let server: TestServer;
beforeAll(async () => {
  // The test's requests come from loopback, which stands for a trusted TLS-terminating proxy here.
  server = await startTestServer({ TOLLGATE_TRUSTED_PROXIES: '127.0.0.1' });
});
afterAll(async () => {
  await server?.close();
});

interface Got {
  headers: Headers;
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
    headers: res.headers,
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

/** Signs up, then signs in (sign-up answers alike for new and taken addresses, and starts no session). */
async function signUp(email: string, headers: Record<string, string> = {}) {
  const form = await request('/dashboard/signup');
  const anon = cookieValue(form.cookies, 'tollgate_csrf')!;
  const signedUp = await request('/dashboard/signup', {
    form: { csrf: csrfOf(form.text)!, email, password: 'a long enough password' },
    cookie: `tollgate_csrf=${anon}`,
    headers,
  });
  expect(signedUp.location).toBe('/dashboard/signin?done=signed_up');
  const done = await request('/dashboard/signin', {
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
    expect(done.location).toBe('/dashboard');
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
    // Every attempt counts (5 per e-mail and address): the sign-in after sign-up, then 4 wrong ones.
    for (let i = 0; i < 4; i++) {
      const wrong = await attempt(`wrong password ${i}`);
      expect(wrong.location).toBe('/dashboard/signin?error=invalid_credentials');
    }
    const limited = await attempt('a long enough password');
    expect(limited.location).toBe('/dashboard/signin?error=sign_in_rate_limited');
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0);
    const shown = await request(limited.location!);
    expect(shown.text).toContain('Too many sign-in attempts. Try again later.');
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
