import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../src/app/context.ts';
import {
  charge,
  deposit,
  findWallet,
  placeHold,
  releaseHold,
  settleHold,
  sweepExpiredHolds,
} from '../src/billing/ledger.ts';
import { Money } from '../src/core/money.ts';
import type { Project } from '../src/db/schema.ts';
import { recordEverything } from '../src/events/outbox.ts';
import { getProject } from '../src/projects/service.ts';
import { connectUser } from '../src/users/service.ts';
import { createTestContext } from './helpers/context.ts';
import { seedProject } from './helpers/server.ts';

const trigger = { source: 'test', actorType: 'test', actorId: 'test' };

let ctx: AppContext;
let project: Project;

beforeAll(async () => {
  ctx = await createTestContext();
  // This file checks the ledger's own events; which events a project wants is the webhooks' concern.
  ctx.events.filter = recordEverything;
  project = await getProject(ctx.db, (await seedProject(ctx)).projectId);
});
afterAll(() => ctx.close());

/** The invariant of the ledger: cached balance and held equal the sums of the user's entries. */
async function expectLedgerConsistent(externalId: string) {
  const wallet = (await findWallet(ctx.db, project.id, externalId))!;
  const entries = await ctx.db
    .selectFrom('ledger_entries')
    .selectAll()
    .where('user_id', '=', wallet.userId)
    .execute();
  const sum = entries.reduce((acc, e) => acc.plus(e.amount), new Money(0));
  const held = entries.reduce((acc, e) => acc.plus(e.held_delta), new Money(0));
  expect(sum.toFixed()).toBe(new Money(wallet.balance).toFixed());
  expect(held.toFixed()).toBe(new Money(wallet.held).toFixed());
  return { wallet, entries };
}

describe('ledger', () => {
  it('deposits, charges and refuses what the wallet cannot cover', async () => {
    await connectUser(ctx.db, ctx.events, project, 'alice', trigger);
    const dep = await deposit(ctx.db, ctx.events, {
      project,
      externalId: 'alice',
      amount: '5.00',
      source: 'test',
      trigger,
    });
    expect(dep.wallet.balance).toBe('5');
    expect(dep.event?.data).toMatchObject({
      amount: '5.00',
      currency: 'usd',
      activityId: dep.entry.id,
      externalUserId: 'alice',
    });
    const ok = await charge(ctx.db, ctx.events, {
      project,
      externalId: 'alice',
      amount: '1.25',
      source: 'api',
      trigger,
    });
    expect(ok.ok && ok.wallet.balance).toBe('3.75');
    const refused = await charge(ctx.db, ctx.events, {
      project,
      externalId: 'alice',
      amount: '3.76',
      source: 'api',
      trigger,
    });
    expect(refused).toMatchObject({ ok: false, reason: 'insufficient_balance', required: '3.76' });
    const stranger = await charge(ctx.db, ctx.events, {
      project,
      externalId: 'nobody',
      amount: '1',
      source: 'api',
      trigger,
    });
    expect(stranger).toMatchObject({ ok: false, reason: 'not_connected' });
    await expectLedgerConsistent('alice');
  });

  it('holds, settles the real cost capped at the hold, and releases the rest', async () => {
    await connectUser(ctx.db, ctx.events, project, 'bob', trigger);
    await deposit(ctx.db, ctx.events, {
      project,
      externalId: 'bob',
      amount: '1.00',
      source: 'test',
      trigger,
    });
    const hold = await placeHold(ctx.db, {
      projectId: project.id,
      externalId: 'bob',
      amount: '0.6',
      purpose: 'chat',
      ttlSeconds: 60,
    });
    if (!hold.ok) throw new Error('hold refused');
    expect(hold.wallet.available).toBe('0.4');
    const second = await placeHold(ctx.db, {
      projectId: project.id,
      externalId: 'bob',
      amount: '0.5',
      purpose: 'chat',
      ttlSeconds: 60,
    });
    expect(second).toMatchObject({ ok: false, reason: 'insufficient_balance' });
    const settled = await settleHold(ctx.db, ctx.events, {
      project,
      hold: hold.hold,
      cost: '0.000000150001',
      source: 'chat',
      trigger,
      subjectExternalId: 'bob',
    });
    expect(settled.charged).toBe('0.000000150001');
    expect(settled.wallet).toMatchObject({ balance: '0.999999849999', held: '0' });
    // settling again changes nothing
    const again = await settleHold(ctx.db, ctx.events, {
      project,
      hold: hold.hold,
      cost: '0.1',
      source: 'chat',
      trigger,
      subjectExternalId: 'bob',
    });
    expect(again.entry).toBeUndefined();
    const capped = await placeHold(ctx.db, {
      projectId: project.id,
      externalId: 'bob',
      amount: '0.1',
      purpose: 'chat',
      ttlSeconds: 60,
    });
    if (!capped.ok) throw new Error('hold refused');
    const over = await settleHold(ctx.db, ctx.events, {
      project,
      hold: capped.hold,
      cost: '5',
      source: 'chat',
      trigger,
      subjectExternalId: 'bob',
    });
    expect(over.charged).toBe('0.1');
    const { entries } = await expectLedgerConsistent('bob');
    expect(entries.map((e) => e.kind).sort()).toEqual(['charge', 'charge', 'deposit', 'hold', 'hold']);
    const event = await ctx.db
      .selectFrom('events')
      .select('envelope')
      .where('type', '=', 'balance.charge.created')
      .orderBy('seq', 'desc')
      .executeTakeFirstOrThrow();
    expect(event.envelope).toMatchObject({
      data: { amount: '0.1', externalUserId: 'bob', balance: '0.899999849999' },
      subject: { externalId: 'bob' },
    });
  });

  it('never lets concurrent holds overspend', async () => {
    await connectUser(ctx.db, ctx.events, project, 'carol', trigger);
    await deposit(ctx.db, ctx.events, {
      project,
      externalId: 'carol',
      amount: '1.00',
      source: 'test',
      trigger,
    });
    const results = await Promise.all(
      Array.from({ length: 25 }, () =>
        placeHold(ctx.db, {
          projectId: project.id,
          externalId: 'carol',
          amount: '0.2',
          purpose: 'chat',
          ttlSeconds: 60,
        }),
      ),
    );
    expect(results.filter((r) => r.ok)).toHaveLength(5);
    for (const r of results) if (r.ok) await releaseHold(ctx.db, r.hold.id, 'released');
    const { wallet } = await expectLedgerConsistent('carol');
    expect(wallet).toMatchObject({ balance: '1', held: '0' });
  });

  it('sweeps holds whose request died', async () => {
    await connectUser(ctx.db, ctx.events, project, 'dave', trigger);
    await deposit(ctx.db, ctx.events, {
      project,
      externalId: 'dave',
      amount: '1.00',
      source: 'test',
      trigger,
    });
    const hold = await placeHold(ctx.db, {
      projectId: project.id,
      externalId: 'dave',
      amount: '0.7',
      purpose: 'chat',
      ttlSeconds: 60,
    });
    if (!hold.ok) throw new Error('hold refused');
    await ctx.db
      .updateTable('holds')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', hold.hold.id)
      .execute();
    expect(await sweepExpiredHolds(ctx.db)).toBeGreaterThanOrEqual(1);
    const { wallet } = await expectLedgerConsistent('dave');
    expect(wallet.available).toBe('1');
  });
});
