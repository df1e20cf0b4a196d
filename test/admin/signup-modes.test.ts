import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createInvite } from '../../src/admin/accounts.ts';
import { loadConfig } from '../../src/config/index.ts';
import { api, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * TOLLGATE_SIGNUP closes open sign-up (issue 22, item 1): `invite` (the default outside `dev`) needs an
 * invite code for the address, made by a full-access admin; `closed` lets only a full-access admin make
 * accounts; `open` is the old behaviour (dev, and the test helper). The admin API and the dashboard's
 * sign-up form follow the same rule (403, or back to the form with the reason), and a refused sign-up says nothing about
 * whether the address has an account.
 */
const ROOT = 'root-token-for-signup-tests-0123456789';
const PASSWORD = 'a long enough password';
let invite: TestServer;
let closed: TestServer;

beforeAll(async () => {
  invite = await startTestServer({ TOLLGATE_SIGNUP: 'invite', TOLLGATE_ADMIN_TOKEN: ROOT });
  closed = await startTestServer({ TOLLGATE_SIGNUP: 'closed', TOLLGATE_ADMIN_TOKEN: ROOT });
});
afterAll(async () => {
  await invite?.close();
  await closed?.close();
});

const signUp = (server: TestServer, body: Record<string, unknown>, bearer?: string) =>
  api(server, bearer, 'POST', '/admin/v1/developers', { password: PASSWORD, ...body });

/** A sign-up through the dashboard form (with its CSRF cookie); the redirect's location. */
async function dashboardSignUp(
  server: TestServer,
  form: Record<string, string>,
  query = '',
  formPage = '/dashboard/signup',
) {
  const page = await fetch(`${server.url}${formPage}${query}`);
  const text = await page.text();
  const csrf = /name="csrf" value="([^"]+)"/.exec(text)![1]!;
  const cookie = (page.headers.get('set-cookie') ?? '').split(';')[0]!;
  const res = await fetch(`${server.url}/dashboard/signup`, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf, password: PASSWORD, ...form }).toString(),
    redirect: 'manual',
  });
  const body = await res.text();
  return {
    page: text,
    status: res.status,
    body,
    location: decodeURIComponent(res.headers.get('location') ?? ''),
  };
}

describe('TOLLGATE_SIGNUP', () => {
  it('defaults to invite (dev turns it to open)', () => {
    expect(loadConfig({}).TOLLGATE_SIGNUP).toBe('invite');
    expect(() => loadConfig({ TOLLGATE_SIGNUP: 'sometimes' })).toThrow(/TOLLGATE_SIGNUP/);
  });

  it('invite: no code, a forged or foreign code, then a real one; only full access invites', async () => {
    const none = await signUp(invite, { email: 'new@example.com' });
    expect(none.status).toBe(403);
    expect(none.body.error.code).toBe('invite_required');

    const made = await api(invite, ROOT, 'POST', '/admin/v1/invites', { email: 'New@Example.com' });
    expect(made.status).toBe(201);
    expect(made.body).toMatchObject({ object: 'invite', email: 'new@example.com' });
    expect(made.body.url).toContain('/dashboard/signup?invite=tgi_');
    const code = made.body.code as string;

    const foreign = await signUp(invite, { email: 'other@example.com', invite: code });
    expect(foreign.status).toBe(403);
    expect(foreign.body.error.code).toBe('invalid_invite');
    const forged = await signUp(invite, { email: 'new@example.com', invite: `${code.slice(0, -2)}xx` });
    expect(forged.body.error.code).toBe('invalid_invite');
    const expired = createInvite(invite.ctx.sealer, 'new@example.com', 1, Date.now() - 2 * 86_400_000);
    expect((await signUp(invite, { email: 'new@example.com', invite: expired.code })).body.error.code).toBe(
      'invalid_invite',
    );

    const ok = await signUp(invite, { email: 'new@example.com', invite: code });
    expect(ok.status, JSON.stringify(ok.body)).toBe(202);
    const signedIn = await api(invite, undefined, 'POST', '/admin/v1/sessions', {
      email: 'new@example.com',
      password: PASSWORD,
    });
    expect(signedIn.status).toBe(201);
    const session = signedIn.body.session.token as string;
    // Used again: the same answer as a new address (sign-up does not tell who has an account).
    const again = await signUp(invite, { email: 'new@example.com', invite: code });
    expect({ status: again.status, body: again.body }).toEqual({ status: ok.status, body: ok.body });
    // Without a code the answer does not tell that the address is taken.
    expect((await signUp(invite, { email: 'new@example.com' })).body.error.code).toBe('invite_required');
    // A developer cannot invite.
    const byDeveloper = await api(invite, session, 'POST', '/admin/v1/invites', { email: 'x@example.com' });
    expect(byDeveloper.status).toBe(403);
    // A full-access admin may create an account directly.
    expect((await signUp(invite, { email: 'direct@example.com' }, ROOT)).status).toBe(202);
    // A developer's bearer does not count as full access.
    const withSession = await signUp(invite, { email: 'friend@example.com' }, session);
    expect(withSession.body.error.code).toBe('invite_required');
  });

  it('invite: the dashboard form asks for the code and follows the same rule', async () => {
    const refused = await dashboardSignUp(invite, { email: 'dash@example.com' });
    expect(refused.page).toContain('name="invite"');
    // back to the form with the reason, chosen by code
    expect(refused.status).toBe(303);
    expect(refused.location).toBe('/dashboard/signup?error=invite_required');
    const shown = await fetch(`${invite.url}${refused.location}`);
    expect(await shown.text()).toContain('needs an invite code');
    const made = await api(invite, ROOT, 'POST', '/admin/v1/invites', { email: 'dash@example.com' });
    const code = made.body.code as string;
    const ok = await dashboardSignUp(
      invite,
      { email: 'dash@example.com', invite: code },
      `?invite=${encodeURIComponent(code)}`,
    );
    expect(ok.page).toContain(`value="${code}"`);
    expect(ok.status).toBe(303);
    expect(ok.location).toBe('/dashboard/signin?done=signed_up');
  });

  it('invite: `tollgate invite create` over the admin API makes a code that signs up', async () => {
    const run = (token: string, ...args: string[]) =>
      promisify(execFile)(process.execPath, ['cmd/tollgate.ts', ...args], {
        env: {
          ...process.env,
          DATABASE_URL: '',
          REDIS_URL: '',
          TOLLGATE_URL: invite.url,
          TOLLGATE_ADMIN_TOKEN: token,
          LOG_LEVEL: 'warn',
        },
        encoding: 'utf8',
        timeout: 60_000,
      });
    const { stdout } = await run(
      ROOT,
      'invite',
      'create',
      '--email',
      'cli@example.com',
      '--days',
      '3',
      '--json',
    );
    const made = JSON.parse(stdout) as { code: string; url: string; expiresAt: string };
    expect(made.url).toContain('/dashboard/signup?invite=tgi_');
    expect(Date.parse(made.expiresAt) - Date.now()).toBeGreaterThan(2.9 * 86_400_000);
    expect(Date.parse(made.expiresAt) - Date.now()).toBeLessThan(3.1 * 86_400_000);
    expect((await signUp(invite, { email: 'cli@example.com', invite: made.code })).status).toBe(202);
    const bad = await run(ROOT, 'invite', 'create', '--email', 'cli2@example.com', '--days', '365').catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((bad as { code: number }).code).not.toBe(0);
    expect((bad as { stderr: string }).stderr).toContain('expiresInDays');
  });

  it('closed: nobody signs up but a full-access admin, invite or not', async () => {
    const made = createInvite(closed.ctx.sealer, 'closed@example.com');
    const res = await signUp(closed, { email: 'closed@example.com', invite: made.code });
    expect(res.status).toBe(403);
    expect(res.body.error.code).toBe('signup_closed');
    // the pages offer no sign-up at all
    const signUpPage = await (await fetch(`${closed.url}/dashboard/signup`)).text();
    expect(signUpPage).toContain('Sign-up is closed');
    expect(signUpPage).not.toContain('name="password"');
    expect(await (await fetch(`${closed.url}/dashboard/signin`)).text()).not.toContain('Create an account');
    // and a sign-up posted anyway (with the sign-in form's CSRF token) is refused
    const dash = await dashboardSignUp(closed, { email: 'closed@example.com' }, '', '/dashboard/signin');
    expect(dash.status).toBe(303);
    expect(dash.location).toBe('/dashboard/signup?error=signup_closed');
    expect(await (await fetch(`${closed.url}${dash.location}`)).text()).toContain('Sign-up is closed');
    expect((await signUp(closed, { email: 'closed@example.com' }, ROOT)).status).toBe(202);
  });
});
