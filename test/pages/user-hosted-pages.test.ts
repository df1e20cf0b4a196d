import { describe, expect, it } from 'vitest';
import { maintenanceJobs } from '../../src/app/jobs.ts';
import { updateProject } from '../../src/projects/service.ts';
import { createLinkToken } from '../../src/users/links.ts';
import {
  api,
  type SeededProject,
  seedProject,
  type TestServer,
  withRecordingServer,
} from '../helpers/server.ts';

let server: TestServer;
let withUrls: SeededProject;
let plain: SeededProject;

withRecordingServer(async (started) => {
  server = started;
  withUrls = await seedProject(server.ctx, {
    name: 'Acme <Chat> & Co',
    settings: {
      returnUrl: 'https://app.example.com/back?from=tollgate',
      checkoutUrl: 'https://pay.example.com/checkout?plan=credits',
    },
  });
  plain = await seedProject(server.ctx, { name: 'Plain app', currency: 'eur' });
});

async function connectLink(project: SeededProject, user: string): Promise<string> {
  const res = await api(server, project.apiKey, 'POST', '/v1/user/connect', { user });
  return res.body.url;
}

const get = (url: string) => fetch(url, { redirect: 'manual' });
/** The hidden fields of the rendered connect page's form, as a form body. */
async function formOf(url: string): Promise<string> {
  const html = await (await get(url)).text();
  const fields = [...html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)];
  return new URLSearchParams(fields.map(([, name, value]) => [name!, value!] as [string, string])).toString();
}
/** Presses Connect as a browser does: posts the rendered page's own form. */
const press = async (url: string) =>
  fetch(url, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', 'sec-fetch-site': 'same-origin' },
    body: await formOf(url),
  });

async function isConnected(project: SeededProject, user: string): Promise<boolean> {
  const res = await api(server, project.apiKey, 'GET', `/v1/user/balance?user=${encodeURIComponent(user)}`);
  return res.body.connected;
}

describe('connect page', () => {
  it('names the project and what connecting allows, with a Connect form and no script', async () => {
    const url = await connectLink(withUrls, 'ann');
    const res = await get(url);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(res.headers.get('referrer-policy')).toBe('no-referrer');
    expect(res.headers.get('cache-control')).toBe('no-store');
    const html = await res.text();
    expect(html).toMatch(/^<!doctype html>\n<html lang="en">/);
    expect(html).toContain('<h1>Connect to Acme &lt;Chat&gt; &amp; Co</h1>');
    expect(html).not.toContain('<Chat>');
    expect(html).toContain('Connecting allows');
    expect(html).toContain('<form method="post">');
    expect(html).toContain('<button type="submit">Connect</button>');
    expect(html).not.toContain('<script');
    expect(html).toContain(':focus-visible');
    expect(await isConnected(withUrls, 'ann')).toBe(false);
  });

  it('connects on the form post, returns to the return URL and emits user.connected once', async () => {
    const url = await connectLink(withUrls, 'bob');
    const res = await press(url);
    expect(res.status).toBe(303);
    expect(res.headers.get('location')).toBe('https://app.example.com/back?from=tollgate');
    expect(await isConnected(withUrls, 'bob')).toBe(true);
    const events = await server.ctx.db
      .selectFrom('events')
      .select('envelope')
      .where('project_id', '=', withUrls.projectId)
      .where('type', '=', 'user.connected')
      .execute();
    expect(events.map((e) => (e.envelope as any).subject.externalId)).toEqual(['bob']);
    expect((events[0]!.envelope as any).trigger).toEqual({
      source: 'connect_page',
      actorType: 'end_user',
      actorId: 'bob',
    });
  });

  it('refuses a used link with 410 on the page and on a second post, changing nothing', async () => {
    const url = await connectLink(withUrls, 'cat');
    expect((await press(url)).status).toBe(303);
    await api(server, withUrls.apiKey, 'POST', '/v1/user/disconnect', { user: 'cat' });
    const page = await get(url);
    expect(page.status).toBe(410);
    expect(await page.text()).toContain('This link was already used');
    const again = await press(url);
    expect(again.status).toBe(410);
    expect(await isConnected(withUrls, 'cat')).toBe(false);
  });

  it('lets exactly one of many concurrent posts of one link through', async () => {
    const url = await connectLink(plain, 'dan');
    const results = await Promise.all(Array.from({ length: 10 }, () => press(url)));
    const statuses = results.map((r) => r.status).sort();
    expect(statuses).toEqual([200, ...Array(9).fill(410)]);
    const done = results.find((r) => r.status === 200)!;
    const html = await done.text();
    expect(html).toContain('You are connected');
    expect(html).toContain('Plain app');
    expect(await isConnected(plain, 'dan')).toBe(true);
  });

  it('shows clear error pages for forged, malformed, expired and wrong-kind links', async () => {
    const url = await connectLink(plain, 'eve');
    const token = url.slice(url.lastIndexOf('/') + 1);
    const [body, signature] = token.split('.') as [string, string];
    const forgedBody = Buffer.from(
      JSON.stringify({ ...JSON.parse(Buffer.from(body, 'base64url').toString()), u: 'mallory' }),
    ).toString('base64url');
    const expired = createLinkToken(
      server.ctx.sealer,
      { kind: 'connect', projectId: plain.projectId, externalId: 'eve', ttlSeconds: 60 },
      Date.now() - 120_000,
    );
    const topup = createLinkToken(server.ctx.sealer, {
      kind: 'topup',
      projectId: plain.projectId,
      externalId: 'eve',
      ttlSeconds: 60,
    });
    const unknownProject = createLinkToken(server.ctx.sealer, {
      kind: 'connect',
      projectId: 'pw_gone',
      externalId: 'eve',
      ttlSeconds: 60,
    });
    const cases: [string, number, string][] = [
      [`${forgedBody}.${signature}`, 400, 'This link is not valid'],
      [`${body}.${signature.slice(0, -2)}xx`, 400, 'This link is not valid'],
      ['garbage', 400, 'This link is incomplete'],
      [`${body}.${signature}.extra`, 400, 'This link is incomplete'],
      [expired, 410, 'This link has expired'],
      [topup, 400, 'This link is not valid here'],
      [unknownProject, 404, 'no longer available'],
    ];
    for (const [bad, status, text] of cases) {
      for (const send of [get, press]) {
        const res = await send(`${server.url}/connect/${bad}`);
        expect(res.status, `${bad} ${send === get ? 'GET' : 'POST'}`).toBe(status);
        expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
        const html = await res.text();
        expect(html).toContain(text);
        expect(html).toContain('Nothing was changed.');
      }
    }
    expect(await isConnected(plain, 'eve')).toBe(false);
    expect(await isConnected(plain, 'mallory')).toBe(false);
    // The untouched link still works.
    expect((await press(url)).status).toBe(200);
  });

  it('forgets used nonces once their links have expired (periodic job)', async () => {
    const url = await connectLink(plain, 'ned');
    expect((await press(url)).status).toBe(200);
    const job = maintenanceJobs.find((j) => j.name === 'link-nonce-cleanup')!;
    expect(await job.run(server.ctx)).toBe(0);
    await server.ctx.db
      .updateTable('used_link_tokens')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('external_id', '=', 'ned')
      .execute();
    expect(await job.run(server.ctx)).toBe(1);
    // The link itself is expired by then, so forgetting its nonce reopens nothing.
  });

  it('does not need an API key and leaves /v1 JSON errors alone', async () => {
    const res = await fetch(`${server.url}/v1/user/balance?user=a`);
    expect(res.status).toBe(401);
    expect(((await res.json()) as any).error.code).toBe('invalid_api_key');
  });
});

describe('connect form hardening', () => {
  const post = (url: string, headers: Record<string, string>, body?: string) =>
    fetch(url, { method: 'POST', redirect: 'manual', headers, ...(body === undefined ? {} : { body }) });

  it('refuses a post that is not the rendered page’s own form, connecting nobody', async () => {
    const url = await connectLink(withUrls, 'scanned');
    const form = await formOf(url);
    const attempts: Array<[Record<string, string>, string | undefined, number]> = [
      [{}, undefined, 400], // a bare POST, as link scanners send
      [{ 'content-type': 'application/json' }, '{}', 400],
      [{ 'content-type': 'text/plain' }, form, 400],
      [{ 'content-type': 'application/x-www-form-urlencoded' }, '', 400],
      [{ 'content-type': 'application/x-www-form-urlencoded' }, 'confirm=connect', 400], // the old static field
      [{ 'content-type': 'application/x-www-form-urlencoded' }, form.replace(/.(?=&|$)/, 'x'), 400],
      [{ 'content-type': 'application/x-www-form-urlencoded', 'sec-fetch-site': 'cross-site' }, form, 403],
    ];
    for (const [headers, body, status] of attempts) {
      const res = await post(url, headers, body);
      expect(res.status, JSON.stringify([headers, body])).toBe(status);
      expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
      expect(res.headers.get('referrer-policy')).toBe('no-referrer');
      expect(await res.text()).toContain('Nothing was changed.');
    }
    expect(await isConnected(withUrls, 'scanned')).toBe(false);
    // The page's own form, from another link, does not fit this one.
    const other = await connectLink(withUrls, 'scanned-2');
    const crossed = await post(
      url,
      { 'content-type': 'application/x-www-form-urlencoded' },
      await formOf(other),
    );
    expect(crossed.status).toBe(400);
    expect(await isConnected(withUrls, 'scanned')).toBe(false);
    // The rendered form itself connects (a browser without Sec-Fetch-Site too).
    const res = await post(url, { 'content-type': 'application/x-www-form-urlencoded' }, form);
    expect(res.status).toBe(303);
    expect(await isConnected(withUrls, 'scanned')).toBe(true);
  });

  it('sends Referrer-Policy and no-store on the 303 after connecting', async () => {
    const res = await press(await connectLink(withUrls, 'referrer'));
    expect(res.status).toBe(303);
    expect(res.headers.get('referrer-policy')).toBe('no-referrer');
    expect(res.headers.get('cache-control')).toBe('no-store');
  });

  it('answers its own 400 page for tokens with NUL or control bytes, before any lookup', async () => {
    const valid = (await connectLink(plain, 'nul')).split('/connect/')[1]!;
    const lookups: string[] = [];
    let current = '';
    const projects = server.ctx.projects;
    const realGet = projects.get.bind(projects);
    projects.get = async (id: string) => {
      lookups.push(`${id} ${current}`);
      return realGet(id);
    };
    for (const token of [
      'abc%00def',
      '%00',
      'a.b%00',
      `${valid}%00`,
      `${valid}%0A`,
      'a%01.b',
      '%7F.x',
      'x'.repeat(5000),
    ]) {
      for (const [method, path] of [
        ['GET', `/connect/${token}`],
        ['POST', `/connect/${token}`],
        ['GET', `/topup/${token}`],
      ] as const) {
        current = `${method} ${path.slice(0, 30)}…${path.slice(-6)}`;
        const res = await fetch(`${server.url}${path}`, {
          method,
          redirect: 'manual',
          ...(method === 'POST'
            ? { headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: 'confirm=connect' }
            : {}),
        });
        expect(res.status, `${method} ${path.slice(0, 60)}`).toBe(400);
        expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
        expect(await res.text()).toContain('This link is incomplete');
      }
    }
    projects.get = realGet;
    expect(lookups).toEqual([]);
  });
});

describe('top-up page', () => {
  it('redirects to the checkout URL with user, amount, currency and project, more than once', async () => {
    const link = await api(server, withUrls.apiKey, 'POST', '/v1/user/topup', {
      user: 'fay',
      amount: '12.5',
    });
    expect(link.body.checkout).toBe('redirect');
    for (let i = 0; i < 2; i++) {
      const res = await get(link.body.url);
      expect(res.status).toBe(303);
      const location = new URL(res.headers.get('location')!);
      expect(location.origin + location.pathname).toBe('https://pay.example.com/checkout');
      expect(Object.fromEntries(location.searchParams)).toEqual({
        plan: 'credits',
        user: 'fay',
        amount: '12.50',
        currency: 'usd',
        project: withUrls.projectId,
      });
    }
  });

  it('sends the amount a refused charge needed', async () => {
    await api(server, withUrls.apiKey, 'POST', '/v1/user/balance/deposit', { user: 'bob', amount: '1.00' });
    const refused = await api(server, withUrls.apiKey, 'POST', '/v1/user/charge', {
      user: 'bob',
      amount: '3.00',
    });
    expect(refused.body.reason).toBe('insufficient_balance');
    const res = await get(refused.body.url);
    expect(res.status).toBe(303);
    // the gap: 3.00 needed, 1.00 available
    expect(new URL(res.headers.get('location')!).searchParams.get('amount')).toBe('2.00');
  });

  it('explains how to top up when the project has no checkout URL', async () => {
    const link = await api(server, plain.apiKey, 'POST', '/v1/user/topup', { user: 'gus', amount: '5' });
    const res = await get(link.body.url);
    expect(res.status).toBe(200);
    const html = await res.text();
    expect(html).toContain('<h1>Top up your Plain app balance</h1>');
    expect(html).toContain('5.00 EUR');
    expect(html).toContain('<strong>gus</strong>');
  });

  it('follows a checkout URL configured after the link was made, and refuses connect links', async () => {
    const link = await api(server, plain.apiKey, 'POST', '/v1/user/topup', { user: 'hal' });
    await updateProject(server.ctx.db, server.ctx.sealer, plain.projectId, {
      settings: { checkoutUrl: 'https://shop.example.org/add-funds' },
    });
    await server.ctx.projects.changed(plain.projectId);
    const res = await get(link.body.url);
    expect(res.status).toBe(303);
    const location = new URL(res.headers.get('location')!);
    expect(location.searchParams.get('user')).toBe('hal');
    expect(location.searchParams.has('amount')).toBe(false);
    const connect = await connectLink(plain, 'hal');
    const wrong = await get(connect.replace('/connect/', '/topup/'));
    expect(wrong.status).toBe(400);
  });
});
