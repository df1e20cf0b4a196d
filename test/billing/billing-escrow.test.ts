import { sql } from 'kysely';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findWallet } from '../../src/billing/ledger.ts';
import { applySlices } from '../../src/billing/statements.ts';
import { Money } from '../../src/core/money.ts';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { newTestId } from '../helpers/context.ts';
import { scrape, sumOf } from '../helpers/metrics-text.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Escrow (src/billing/escrow.ts) on two pods (slices of 16 requests, given back after 30 s idle) (two servers on one database and one
 * Redis): a pod admits a warm wallet's requests from its slice without a statement, every response is
 * still charged exactly and durably before its last byte (another pod reads it at once), and the balance
 * a pod is sitting on is never a reason to refuse — another pod's request, a manual charge, idleness,
 * shutdown, or the sweeper (a dead pod) gets it back.
 */
const trigger = { source: 'test', actorType: 'test', actorId: 'escrow' };
const escrow = { ESCROW_IDLE_MS: '30000', ESCROW_SLICE_REQUESTS: '16' };
const messages = [{ role: 'user' as const, content: 'Say hello' }];

let mock: MockUpstream;
let podA: TestServer;
let podB: TestServer;
let project: Project;
let apiKey: string;
const shared = { id: newTestId() };

const client = (pod: TestServer) =>
  new OpenAI({ baseURL: `${pod.url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });

async function fund(user: string, amount: string) {
  await connectUser(podA.ctx.db, podA.ctx.events, project, user, trigger);
  await podA.ctx.billing.deposit({ project, externalId: user, amount, source: 'test', trigger });
}

/** A reservation of 0.1 for `user` on pod A, which the test needs granted. */
async function reserveOnPodA(user: string) {
  const reserved = await podA.ctx.billing.hold({ project, externalId: user, amount: '0.1', purpose: 'chat' });
  if (!reserved.ok) throw new Error('refused');
  return reserved;
}

async function chat(pod: TestServer, user: string, model = 'm'): Promise<string> {
  const reply = await client(pod).chat.completions.create({ model, user, messages, max_tokens: 20 });
  return reply.choices[0]!.message.content ?? '';
}

async function balanceOver(pod: TestServer, user: string) {
  const res = await fetch(`${pod.url}/v1/user/balance?user=${user}`, {
    headers: { authorization: `Bearer ${apiKey}` },
  });
  expect(res.status).toBe(200);
  return (await res.json()) as { balance: string; held: string; available: string };
}

/**
 * The user's charges, the pods' slices of the wallet (`slices`: the internal `end_users.held`), and the
 * ledger invariants (balance = Σ entries, slices = Σ open slices, reserved = Σ open slices' reserved),
 * read in one statement: a slice given back between two reads (the idle timer) must not look like a
 * broken invariant. The wallet is what users see: `held` is what requests in flight reserved.
 */
async function ledger(user: string) {
  const wallet = (await findWallet(podA.ctx.db, project.id, user))!;
  const { rows } = await sql<{
    balance: string;
    held: string;
    reserved: string;
    entries: string;
    slices: string;
    reservations: string;
  }>`
    SELECT e.balance, e.held, e.reserved,
           (SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE user_id = e.id) AS entries,
           (SELECT coalesce(sum(amount), 0) FROM holds WHERE user_id = e.id AND status = 'open') AS slices,
           (SELECT coalesce(sum(reserved), 0) FROM holds WHERE user_id = e.id AND status = 'open') AS reservations
    FROM end_users e WHERE e.id = ${wallet.userId}
  `.execute(podA.ctx.db);
  const now = rows[0]!;
  expect(new Money(now.entries).toFixed()).toBe(new Money(now.balance).toFixed());
  expect(new Money(now.slices).toFixed()).toBe(new Money(now.held).toFixed());
  expect(new Money(now.reservations).toFixed()).toBe(new Money(now.reserved).toFixed());
  const entries = await podA.ctx.db
    .selectFrom('ledger_entries')
    .select(['kind', 'amount', 'metadata'])
    .where('user_id', '=', wallet.userId)
    .orderBy('id')
    .execute();
  const charges = entries.filter((e) => e.kind === 'charge');
  const charged = charges.reduce((sum, e) => sum.minus(e.amount), new Money(0));
  return { wallet, slices: new Money(now.held).toFixed(), charges, charged };
}

/** One request's reservation, as its charge entry recorded it. */
async function holdOfOneRequest(): Promise<Money> {
  await fund('probe', '5');
  await chat(podA, 'probe');
  const { charges } = await ledger('probe');
  return new Money((charges[0]!.metadata as { holdAmount: string }).holdAmount);
}

beforeAll(async () => {
  mock = await startMockUpstream({ defaults: { tokens: 5 } });
  podA = await startTestServer(escrow, shared);
  podB = await startTestServer(escrow, shared);
  const seeded = await seedProject(podA.ctx, {
    upstreamUrl: mock.baseUrl,
    upstreamKey: 'sk-mock',
    models: [
      {
        id: 'm',
        upstreamModel: 'mock-model',
        pricing: { mode: 'per_token', inputPerMillion: '3', outputPerMillion: '15' },
      },
      { id: 'flat', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.02' } },
    ],
  });
  apiKey = seeded.apiKey;
  project = await getProject(podA.ctx.db, seeded.projectId);
});

afterAll(async () => {
  await podA?.close();
  await podB?.close();
  await mock?.close();
});

describe('escrow on two pods', () => {
  it('admits a warm wallet from memory, charges every response exactly, and another pod reads each charge at once', async () => {
    await fund('warm', '1');
    const before = await scrape(podA.url);
    const admitted = (from: string, samples: typeof before) =>
      sumOf(samples, 'tollgate_escrow_admissions_total', { project: project.id, from });
    let expected = new Money(1);
    for (let i = 0; i < 8; i++) {
      expect(await chat(podA, 'warm')).toBe(' hello'.repeat(5));
      const { charges } = await ledger('warm');
      expect(charges).toHaveLength(i + 1);
      expected = expected.plus(charges[i]!.amount);
      // read-your-writes across pods: the charge committed before the response's last byte
      expect(new Money((await balanceOver(podB, 'warm')).balance).toFixed()).toBe(expected.toFixed());
    }
    const after = await scrape(podA.url);
    // one slice taken from the database, then seven requests from memory
    expect(admitted('database', after) - admitted('database', before)).toBe(1);
    expect(admitted('memory', after) - admitted('memory', before)).toBe(7);
    // the slice stays with the pod while the wallet is busy (not spent), and nobody outside the pod sees
    // it: nothing is in flight, so nothing is held and the whole balance is available
    const { wallet, slices, charged } = await ledger('warm');
    expect(new Money(slices).gt(0)).toBe(true);
    expect(new Money(wallet.balance).toFixed()).toBe(new Money(1).minus(charged).toFixed());
    expect(wallet.held).toBe('0');
    expect(await balanceOver(podB, 'warm')).toMatchObject({ held: '0.00', available: wallet.balance });
  });

  it('serves a request on another pod from the balance a pod is sitting on (the slice is asked back)', async () => {
    const hold = await holdOfOneRequest();
    // enough for three requests' holds: pod A's slice takes all of it
    await fund('split', hold.times(3).toFixed());
    expect(await chat(podA, 'split')).toBe(' hello'.repeat(5));
    const { wallet, slices } = await ledger('split');
    expect(new Money(wallet.balance).minus(slices).lt(hold)).toBe(true); // pod A holds the rest
    expect(wallet.held).toBe('0');
    // pod B has no slice and the database no available balance: pod A gives its slice back, B serves
    expect(await chat(podB, 'split')).toBe(' hello'.repeat(5));
    const { charges } = await ledger('split');
    expect(charges).toHaveLength(2);
  });

  it('lets a manual charge on another pod through when only a slice stands in its way', async () => {
    // a slice is 16 requests' worth (0.32): pod A's takes the whole balance
    await fund('manual', '0.30');
    await chat(podA, 'manual', 'flat');
    const { wallet, slices } = await ledger('manual');
    expect(wallet).toMatchObject({ balance: '0.28', held: '0', available: '0.28' });
    expect(slices).toBe('0.28');
    const amount = '0.25';
    const res = await fetch(`${podB.url}/v1/user/charge`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ user: 'manual', amount }),
    });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ success: true });
    const after = await ledger('manual');
    expect(after.charges).toHaveLength(2);
    // and pod A, asked for its slice, still serves the wallet from what is left (or refuses with a link)
    expect(await chat(podA, 'manual', 'flat')).toBe(' hello'.repeat(5));
    await ledger('manual');
  });

  it('charges a late settle once when the sweeper took the slice of a pod it thought dead', async () => {
    await fund('late', '1');
    const reserved = await reserveOnPodA('late');
    await podA.ctx.db
      .updateTable('holds')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', reserved.hold.id)
      .execute();
    expect((await ledger('late')).wallet.held).toBe('0.1'); // a request in flight
    expect(await podB.ctx.billing.sweep()).toBe(1);
    expect((await ledger('late')).wallet.held).toBe('0');
    expect((await ledger('late')).slices).toBe('0');
    const settled = await podA.ctx.billing.settle({
      project,
      hold: reserved.hold,
      cost: '0.25',
      source: 'chat',
      model: 'm',
      trigger,
      externalId: 'late',
      metadata: {},
      description: 'late',
    });
    expect(settled.charged).toBe('0.25');
    const { wallet, charges } = await ledger('late');
    expect(charges).toHaveLength(1);
    expect(wallet).toMatchObject({ balance: '0.75', held: '0' });
    // the pod takes a new slice for the next request
    expect(await chat(podA, 'late')).toBe(' hello'.repeat(5));
    await ledger('late');
  });

  it('applies a change retried after an ambiguous failure once (its sequence number)', async () => {
    await fund('retry', '1');
    const reserved = await reserveOnPodA('retry');
    const { wallet } = await ledger('retry');
    const params = (entryId: string) => [
      project.id,
      [reserved.hold.id],
      [wallet.userId],
      ['1000'],
      ['0.05'],
      ['0.05'],
      [false],
      ['0'],
      [entryId],
      ['chat'],
      ['retried'],
      ['{}'],
      [null],
      [null],
      'on',
    ];
    const first = await podA.ctx.database.run<{ balance: string | null }>(applySlices, params('act_retry_1'));
    const again = await podA.ctx.database.run<{ balance: string | null }>(applySlices, params('act_retry_1'));
    expect(first[0]!.balance).not.toBeNull();
    expect(again[0]!.balance).toBeNull();
    const after = await ledger('retry');
    expect(after.charges).toHaveLength(1);
    expect(new Money(after.wallet.balance).toFixed()).toBe('0.95');
  });
});

describe('SETTLE_COMMIT=async', () => {
  it('still charges every response before its last byte, as another pod reads it', async () => {
    const pod = await startTestServer({ ...escrow, SETTLE_COMMIT: 'async' }, shared);
    try {
      await fund('async', '1');
      for (let i = 1; i <= 3; i++) {
        expect(await chat(pod, 'async')).toBe(' hello'.repeat(5));
        const { charges, charged } = await ledger('async');
        expect(charges).toHaveLength(i);
        expect(new Money((await balanceOver(podB, 'async')).balance).toFixed()).toBe(
          new Money(1).minus(charged).toFixed(),
        );
      }
    } finally {
      await pod.close();
    }
  });
});

describe('escrow gives slices back', () => {
  it('when the wallet is idle, and all of them on shutdown', async () => {
    const pod = await startTestServer({ ...escrow, ESCROW_IDLE_MS: '200' }, shared);
    let closed = false;
    try {
      await fund('idle', '1');
      await fund('shutdown', '1');
      await chat(pod, 'idle');
      expect(new Money((await ledger('idle')).slices).gt(0)).toBe(true);
      // the idle timer gives it back (bounded wait: 200 ms idle, checked every 100 ms)
      for (let i = 0; i < 100 && new Money((await ledger('idle')).slices).gt(0); i++) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect((await ledger('idle')).slices).toBe('0');

      await chat(pod, 'shutdown');
      expect(new Money((await ledger('shutdown')).slices).gt(0)).toBe(true);
      await pod.close();
      closed = true;
      expect((await ledger('shutdown')).slices).toBe('0');
    } finally {
      if (!closed) await pod.close();
    }
  });
});
