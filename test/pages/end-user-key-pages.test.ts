import { describe, expect, it } from 'vitest';
import {
  api,
  type SeededProject,
  seedProject,
  type TestServer,
  withRecordingServer,
} from '../helpers/server.ts';

/**
 * The end user's own keys on the hosted pages: the portal creates one (shown once) and revokes one;
 * a connect link that asks for a key (`?key=NAME`, or `keyName` in `POST /v1/user/connect`) hands one
 * out on connecting, once. Each key then authenticates `/v1` as that user, until revoked.
 */
let server: TestServer;
let project: SeededProject;

withRecordingServer(async (started) => {
  server = started;
  project = await seedProject(server.ctx, { name: 'Agents & Co' });
});

const formHeaders = { 'content-type': 'application/x-www-form-urlencoded', 'sec-fetch-site': 'same-origin' };
/** The portal's hidden proof field. */
const proofOf = (html: string) => /name="confirm" value="([^"]+)"/.exec(html)![1]!;
const post = (url: string, fields: Record<string, string>) =>
  fetch(url, { method: 'POST', redirect: 'manual', headers: formHeaders, body: new URLSearchParams(fields) });
const balanceWith = (key: string) => api(server, key, 'GET', '/v1/user/balance');

describe('the portal', () => {
  it('creates a key of the user (shown once) and revokes it', async () => {
    const link = await api(server, project.apiKey, 'POST', '/v1/user/portal', { user: 'pia' });
    expect(link.status).toBe(200);
    const url: string = link.body.url;
    const page = await (await fetch(url)).text();
    expect(page).toContain('API keys');
    expect(page).toContain('None yet.');

    const created = await post(url, { confirm: proofOf(page), action: 'create_key', name: 'laptop' });
    expect(created.status).toBe(200);
    const html = await created.text();
    const key = /<code id="new-key">(tgu_[A-Za-z0-9_-]+)<\/code>/.exec(html)?.[1];
    expect(key, html).toBeTruthy();
    const balance = await balanceWith(key!);
    expect(balance.status).toBe(200);
    expect(balance.body.user).toBe('pia');
    // Shown once: the page lists it by its prefix only.
    const again = await (await fetch(url)).text();
    expect(again).not.toContain(key!);
    expect(again).toContain(`${key!.slice(0, 12)}…`);

    const keyId = /name="key" value="(ukey_[0-9a-z]+)"/.exec(again)![1]!;
    // Only the page's own form counts.
    const forged = await fetch(url, {
      method: 'POST',
      headers: formHeaders,
      body: new URLSearchParams({ confirm: 'forged', action: 'revoke_key', key: keyId }),
    });
    expect(forged.status).toBe(400);
    expect((await balanceWith(key!)).status).toBe(200);

    const revoked = await post(url, { confirm: proofOf(again), action: 'revoke_key', key: keyId });
    expect(revoked.status).toBe(200);
    expect(await revoked.text()).toContain('Revoked the key “laptop”');
    expect((await balanceWith(key!)).status).toBe(401);
  });

  it("revokes only the user's own keys, and wants a name", async () => {
    const mine = await api(server, project.apiKey, 'POST', '/v1/user/portal', { user: 'pat' });
    const url: string = mine.body.url;
    const proof = proofOf(await (await fetch(url)).text());
    const theirs = await api(server, project.apiKey, 'POST', '/v1/user/keys', { user: 'pam', name: 'x' });
    const res = await post(url, { confirm: proof, action: 'revoke_key', key: theirs.body.id });
    expect(res.status).toBe(404);
    expect((await balanceWith(theirs.body.key)).status).toBe(200);
    const unnamed = await post(url, { confirm: proof, action: 'create_key', name: '' });
    expect(unnamed.status).toBe(400);
  });
});

describe('the connect page', () => {
  it('hands out a key once when the link asks for one', async () => {
    const link = await api(server, project.apiKey, 'POST', '/v1/user/connect', {
      user: 'cora',
      keyName: 'claude-code',
    });
    expect(link.status).toBe(200);
    const url: string = link.body.url;
    expect(url).toMatch(/\/connect\/[A-Za-z0-9_.-]+\?key=claude-code$/);
    const page = await (await fetch(url)).text();
    expect(page).toContain('an API key named “claude-code”');
    const done = await post(url, { confirm: proofOf(page) });
    expect(done.status).toBe(200);
    const key = /<code id="end-user-key">(tgu_[A-Za-z0-9_-]+)<\/code>/.exec(await done.text())?.[1];
    expect(key).toBeTruthy();
    const balance = await balanceWith(key!);
    expect(balance.body).toMatchObject({ user: 'cora', connected: true });
    const listed = await api(server, project.apiKey, 'GET', '/v1/user/keys?user=cora');
    expect(listed.body.data).toEqual([expect.objectContaining({ name: 'claude-code', revokedAt: null })]);
    // The link is single-use: no second key.
    const second = await post(url, { confirm: proofOf(page) });
    expect(second.status).not.toBe(200);
    expect((await api(server, project.apiKey, 'GET', '/v1/user/keys?user=cora')).body.data).toHaveLength(1);
  });

  it('hands out nothing when the link does not ask', async () => {
    const link = await api(server, project.apiKey, 'POST', '/v1/user/connect', { user: 'carl' });
    const page = await (await fetch(link.body.url)).text();
    expect(page).not.toContain('API key');
    const done = await post(link.body.url, { confirm: proofOf(page) });
    expect(await done.text()).not.toContain('tgu_');
    expect((await api(server, project.apiKey, 'GET', '/v1/user/keys?user=carl')).body.data).toEqual([]);
  });
});
