import { execFile } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser, disconnectUser } from '../../src/users/service.ts';
import {
  type ChatFixture,
  ledgerEntriesOf,
  perRequestModel,
  startChatFixture,
} from '../helpers/chat-fixture.ts';

/**
 * Credit grants (promotional, trial, goodwill credit — not money): granted with an optional expiry and a
 * priority, spent before paid balance (highest priority, then soonest expiry), every charge entry naming
 * the grants it drew on; at expiry the unspent rest leaves as its own entry. Trials once per user; and
 * the low-balance alerts.
 */
let f: ChatFixture;
const ROOT = 'root-admin-token-0123456789abcdef';
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const messages = [{ role: 'user' as const, content: 'Hello' }];

beforeAll(async () => {
  f = await startChatFixture({
    models: [perRequestModel('thirty', '0.30')],
    settings: { lowBalanceThreshold: '0.50' },
    env: { TOLLGATE_ADMIN_TOKEN: ROOT },
  });
  await f.subscribe(['balance.*']);
});
afterAll(() => f.close());

async function api(
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<Omit<Response, 'json'> & { json(): Promise<any> }> {
  return fetch(`${f.server.url}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${path.startsWith('/admin') ? ROOT : f.apiKey}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers,
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

async function events(type: string, user: string) {
  const envelopes: Array<{ data: Record<string, unknown> }> = await f.events(type);
  return envelopes.filter((e) => e.data.externalUserId === user);
}

async function entries(user: string) {
  await f.settled();
  await f.ledger(user); // balance = Σ entries, held = Σ open holds
  const wallet = (await f.wallet(user))!;
  return ledgerEntriesOf(f.ctx, wallet.userId, ['kind', 'amount', 'source', 'metadata', 'balance_after']);
}

describe('granting credit', () => {
  it('POST /v1/user/credits grants once per Idempotency-Key, and the balance shows paid and credits apart', async () => {
    await f.fund('alice', '1.00');
    const body = {
      user: 'alice',
      amount: '5',
      reason: 'promo',
      priority: 2,
      metadata: { campaign: 'launch' },
    };
    const first = await api('POST', '/v1/user/credits', body, { 'idempotency-key': 'grant-1' });
    expect(first.status).toBe(201);
    const granted = await first.json();
    expect(granted).toMatchObject({
      object: 'credit_grant',
      user: 'alice',
      amount: '5.00',
      remaining: '5.00',
      reason: 'promo',
      priority: 2,
      expiresAt: null,
      balance: '6.00',
      metadata: { campaign: 'launch' },
    });
    const replay = await api('POST', '/v1/user/credits', body, { 'idempotency-key': 'grant-1' });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect((await replay.json()).id).toBe(granted.id);

    // an unknown query parameter is refused, as anywhere under /v1/user: nothing is granted
    const stray = await api('POST', '/v1/user/credits?project=proj_other', body, {
      'idempotency-key': 'grant-2',
    });
    expect(stray.status).toBe(400);
    expect((await stray.json()).error).toMatchObject({ type: 'invalid_request_error', param: 'project' });

    const balance = await (await api('GET', '/v1/user/balance?user=alice')).json();
    expect(balance).toMatchObject({ balance: '6.00', paid: '1.00', credits: '5.00', available: '6.00' });
    const list = await (await api('GET', '/v1/user/credits?user=alice')).json();
    expect(list.data).toHaveLength(1);
    expect((await entries('alice')).map((e) => e.kind)).toEqual(['deposit', 'grant']);
    expect(await events('balance.credit.granted', 'alice')).toEqual([
      expect.objectContaining({
        data: expect.objectContaining({ amount: '5', grantId: granted.id, reason: 'promo', priority: 2 }),
      }),
    ]);
  });

  it('refuses a bad grant with 400 and writes nothing', async () => {
    await f.fund('bad', '1.00');
    for (const body of [
      { user: 'bad', amount: '0', reason: 'promo' },
      { user: 'bad', amount: '1', reason: 'Not A Reason!' },
      { user: 'bad', amount: '1', reason: 'promo', expiresAt: '2001-01-01T00:00:00Z' },
      { user: 'bad', amount: '1', reason: 'promo', expiresAt: 'tomorrow' },
      { user: 'bad', amount: '1.001', reason: 'promo' },
      { user: 'bad', amount: '1', reason: 'promo', priority: 1.5 },
    ]) {
      const res = await api('POST', '/v1/user/credits', body);
      expect({ body, status: res.status }).toEqual({ body, status: 400 });
    }
    expect((await entries('bad')).map((e) => e.kind)).toEqual(['deposit']);
  });

  it('the admin API grants and lists credits too', async () => {
    await f.fund('admin-granted', '0.10');
    const res = await api('POST', `/admin/v1/projects/${f.project.id}/users/admin-granted/credits`, {
      amount: '3',
      reason: 'goodwill',
    });
    expect(res.status).toBe(201);
    expect(await res.json()).toMatchObject({ amount: '3.00', reason: 'goodwill', balance: '3.10' });
    const list = await (
      await api('GET', `/admin/v1/projects/${f.project.id}/users/admin-granted/credits`)
    ).json();
    expect(list.data.map((g: { reason: string }) => g.reason)).toEqual(['goodwill']);
  });
});

describe('the CLI', () => {
  it('`tollgate users grant` grants over the admin API, and refuses a bad reason', async () => {
    await f.fund('cli-user', '0.50');
    // Asynchronously: the server under test runs in this process.
    const run = (...args: string[]) =>
      new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
        execFile(
          process.execPath,
          ['cmd/tollgate.ts', ...args],
          {
            env: { ...process.env, TOLLGATE_URL: f.server.url, TOLLGATE_ADMIN_TOKEN: ROOT },
            timeout: 60_000,
          },
          (err, stdout, stderr) => resolve({ status: err ? (err.code as number) : 0, stdout, stderr }),
        );
      });
    const base = ['users', 'grant', '--project', f.project.id, '--user', 'cli-user', '--amount', '1.5'];
    const ok = await run(...base, '--reason', 'goodwill', '--priority', '3', '--json');
    expect(ok.stderr).toBe('');
    expect(ok.status).toBe(0);
    expect(JSON.parse(ok.stdout)).toMatchObject({
      amount: '1.50',
      reason: 'goodwill',
      priority: 3,
      balance: '2.00',
    });
    const text = await run(
      ...base,
      '--reason',
      'promo',
      '--expires',
      new Date(Date.now() + 86_400_000).toISOString(),
    );
    expect(text.status).toBe(0);
    expect(text.stdout).toMatch(
      /^Granted 1\.50 usd of promo credit to cli-user \(expires .+\); balance 3\.50 usd/,
    );
    const bad = await run(...base, '--reason', 'Free Money');
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain('reason');
    expect((await f.wallet('cli-user'))!.granted).toBe('3');
  });
});

describe('spending credit', () => {
  it('charges spend grants first — highest priority, then soonest expiry — and each entry names its draws', async () => {
    await f.fund('bob', '10.00');
    const grant = async (amount: string, priority: number, days?: number) =>
      (
        await (
          await api('POST', '/v1/user/credits', {
            user: 'bob',
            amount,
            reason: 'promo',
            priority,
            ...(days ? { expiresAt: new Date(Date.now() + days * 86_400_000).toISOString() } : {}),
          })
        ).json()
      ).id as string;
    const late = await grant('0.25', 0, 9);
    const soon = await grant('0.25', 0, 3);
    const high = await grant('0.25', 5);
    // three chats at 0.30 (the settle path) and one manual charge (the charge path)
    for (let i = 0; i < 3; i++)
      await f.client.chat.completions.create({ model: 'thirty', user: 'bob', messages });
    const manual = await api('POST', '/v1/user/charge', { user: 'bob', amount: '0.20' });
    expect(manual.status).toBe(200);

    const charges = (await entries('bob')).filter((e) => e.kind === 'charge');
    expect(charges.map((e) => (e.metadata as { grants?: unknown }).grants)).toEqual([
      [
        { grant: high, amount: '0.25' },
        { grant: soon, amount: '0.05' },
      ],
      [
        { grant: soon, amount: '0.2' },
        { grant: late, amount: '0.1' },
      ],
      [{ grant: late, amount: '0.15' }],
      undefined, // grants spent: from paid balance
    ]);
    const wallet = (await f.wallet('bob'))!;
    expect(wallet).toMatchObject({ balance: '9.65', granted: '0', paid: '9.65' });
  });

  it('an expired grant leaves the balance with its unspent rest, exactly, as its own entry', async () => {
    await f.fund('carol', '1.00');
    const created = await (
      await api('POST', '/v1/user/credits', { user: 'carol', amount: '2', reason: 'promo' })
    ).json();
    await f.client.chat.completions.create({ model: 'thirty', user: 'carol', messages }); // draws 0.30
    // the grant's time is up
    await f.ctx.db
      .updateTable('credit_grants')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', created.id)
      .execute();
    // while it is past its expiry and not yet swept, it is not drawn on: this charge is paid money
    await f.client.chat.completions.create({ model: 'thirty', user: 'carol', messages });
    expect(await f.ctx.billing.expireGrants()).toBeGreaterThanOrEqual(1);
    const all = await entries('carol');
    expect(all.map((e) => [e.kind, new Money(e.amount).toFixed()])).toEqual([
      ['deposit', '1'],
      ['grant', '2'],
      ['charge', '-0.3'],
      ['charge', '-0.3'],
      ['grant_expiry', '-1.7'],
    ]);
    expect(await f.wallet('carol')).toMatchObject({ balance: '0.7', granted: '0', paid: '0.7' });
    expect(await events('balance.credit.expired', 'carol')).toEqual([
      expect.objectContaining({ data: expect.objectContaining({ amount: '1.7', grantId: created.id }) }),
    ]);
    // run again: nothing left to expire for carol
    await f.ctx.billing.expireGrants();
    expect((await entries('carol')).filter((e) => e.kind === 'grant_expiry')).toHaveLength(1);
  });
});

describe('trials', () => {
  it('gives the project trial once per user, also across disconnect and reconnect', async () => {
    const set = await api('PATCH', `/admin/v1/projects/${f.project.id}`, {
      settings: { trial: { amount: '2.00', expiresInDays: 7 } },
    });
    expect(set.status).toBe(200);
    const users = `/admin/v1/projects/${f.project.id}/users/trialist`;
    for (const action of ['connect', 'disconnect', 'connect']) {
      expect((await api('POST', `${users}/${action}`)).status).toBe(200);
    }
    // a user connected directly by the service gets it too, once
    const project = await getProject(f.ctx.db, f.project.id);
    await connectUser(f.ctx.db, f.ctx.events, project, 'trialist-2', trigger);
    await disconnectUser(f.ctx.db, f.ctx.events, project, 'trialist-2', trigger);
    await connectUser(f.ctx.db, f.ctx.events, project, 'trialist-2', trigger);
    expect((await entries('trialist-2')).map((e) => e.kind)).toEqual(['grant']);
    const all = await entries('trialist');
    expect(all.map((e) => [e.kind, e.source, new Money(e.amount).toFixed()])).toEqual([
      ['grant', 'trial', '2'],
    ]);
    const [grant] = await f.ctx.db
      .selectFrom('credit_grants')
      .selectAll()
      .where('user_id', '=', (await f.wallet('trialist'))!.userId)
      .execute();
    expect(grant).toMatchObject({ reason: 'trial', remaining: '2' });
    const days = (grant!.expires_at!.getTime() - grant!.created_at.getTime()) / 86_400_000;
    expect(days).toBeCloseTo(7, 2);
  });
});

describe('low-balance alerts', () => {
  it('balance.low once per crossing of the threshold, balance.depleted at zero, on both charge paths', async () => {
    await f.fund('dora', '1.20');
    // 1.20 → 0.90 → 0.60 → 0.30 (crosses 0.50) → 0.00 (depleted)
    for (let i = 0; i < 3; i++)
      await f.client.chat.completions.create({ model: 'thirty', user: 'dora', messages });
    const low = await events('balance.low', 'dora');
    expect(low.map((e) => e.data)).toEqual([
      expect.objectContaining({ balance: '0.3', threshold: '0.5', currency: 'usd' }),
    ]);
    const charged = await api('POST', '/v1/user/charge', { user: 'dora', amount: '0.30' });
    expect(charged.status).toBe(200);
    expect((await events('balance.depleted', 'dora')).map((e) => e.data)).toEqual([
      expect.objectContaining({ balance: '0' }),
    ]);
    // a deposit lifts it above the threshold; the next crossing alerts again
    await f.ctx.billing.deposit({
      project: f.project,
      externalId: 'dora',
      amount: '0.60',
      source: 'test',
      trigger,
    });
    await f.client.chat.completions.create({ model: 'thirty', user: 'dora', messages });
    expect(await events('balance.low', 'dora')).toHaveLength(2);
  });

  it("a user's own threshold overrides the project's (POST /v1/user/alerts), and null gives it back", async () => {
    await f.fund('erin', '3.00');
    expect(await (await api('GET', '/v1/user/alerts?user=erin')).json()).toMatchObject({
      lowBalanceThreshold: '0.50',
      source: 'project',
    });
    const set = await api('POST', '/v1/user/alerts', { user: 'erin', lowBalanceThreshold: '2.50' });
    expect(set.status).toBe(200);
    expect(await set.json()).toMatchObject({ lowBalanceThreshold: '2.50', source: 'user' });
    expect(
      (await api('POST', '/v1/user/alerts', { user: 'erin', lowBalanceThreshold: '0.001' })).status,
    ).toBe(400);
    // 3.00 → 2.70 → 2.40: below the user's 2.50 (the project's 0.50 is far away)
    for (let i = 0; i < 2; i++)
      await f.client.chat.completions.create({ model: 'thirty', user: 'erin', messages });
    expect((await events('balance.low', 'erin')).map((e) => e.data)).toEqual([
      expect.objectContaining({ balance: '2.4', threshold: '2.5' }),
    ]);
    const reset = await api('POST', '/v1/user/alerts', { user: 'erin', lowBalanceThreshold: null });
    expect(await reset.json()).toMatchObject({ lowBalanceThreshold: '0.50', source: 'project' });
  });
});
