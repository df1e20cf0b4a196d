import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { findWallet } from '../../src/billing/ledger.ts';
import { Money } from '../../src/core/money.ts';
import type { Project } from '../../src/db/schema.ts';
import { recordEverything } from '../../src/events/outbox.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { heldByOpenHolds } from '../helpers/chat-fixture.ts';
import { createTestContext } from '../helpers/context.ts';
import { depositFor, seedProject } from '../helpers/server.ts';

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

/** Connects `externalId` and deposits 1.00 for it. */
async function connectWithOneDollar(externalId: string) {
  await connectUser(ctx.db, ctx.events, project, externalId, trigger);
  await depositFor(ctx, project, externalId, '1.00', trigger);
}

const holdFor = (externalId: string, amount: string) =>
  ctx.billing.hold({ project, externalId, amount, purpose: 'chat' });

/** A hold the test needs granted. */
async function grantedHold(externalId: string, amount: string) {
  const hold = await holdFor(externalId, amount);
  if (!hold.ok) throw new Error('hold refused');
  return hold;
}

const settleChat = (
  hold: Parameters<typeof ctx.billing.settle>[0]['hold'],
  externalId: string,
  cost: string,
) =>
  ctx.billing.settle({
    project,
    hold,
    cost,
    source: 'chat',
    trigger,
    externalId,
    model: 'm',
    metadata: {},
    description: 'test',
  });

/**
 * The invariants of the ledger: the cached balance equals the sum of the user's entries, and the cached
 * held amount the sum of the user's open holds.
 */
async function expectLedgerConsistent(externalId: string) {
  const wallet = (await findWallet(ctx.db, project.id, externalId))!;
  const entries = await ctx.db
    .selectFrom('ledger_entries')
    .selectAll()
    .where('user_id', '=', wallet.userId)
    .execute();
  const sum = entries.reduce((acc, e) => acc.plus(e.amount), new Money(0));
  const held = await heldByOpenHolds(ctx, wallet.userId);
  expect(sum.toFixed()).toBe(new Money(wallet.balance).toFixed());
  expect(held.toFixed()).toBe(new Money(wallet.held).toFixed());
  return { wallet, entries };
}

describe('ledger', () => {
  it('deposits, charges and refuses what the wallet cannot cover', async () => {
    await connectUser(ctx.db, ctx.events, project, 'alice', trigger);
    const dep = await ctx.billing.deposit({
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
    const ok = await ctx.billing.charge({
      project,
      externalId: 'alice',
      amount: '1.25',
      source: 'api',
      trigger,
    });
    expect(ok.ok && ok.wallet.balance).toBe('3.75');
    const refused = await ctx.billing.charge({
      project,
      externalId: 'alice',
      amount: '3.76',
      source: 'api',
      trigger,
    });
    expect(refused).toMatchObject({ ok: false, reason: 'insufficient_balance', required: '3.76' });
    const stranger = await ctx.billing.charge({
      project,
      externalId: 'nobody',
      amount: '1',
      source: 'api',
      trigger,
    });
    expect(stranger).toMatchObject({ ok: false, reason: 'not_connected' });
    await expectLedgerConsistent('alice');
  });

  it('holds, settles the real cost (above the hold too, into debt), and releases the rest', async () => {
    await connectWithOneDollar('bob');
    const hold = await grantedHold('bob', '0.6');
    const second = await holdFor('bob', '0.5');
    expect(second).toMatchObject({ ok: false, reason: 'insufficient_balance' });
    const settled = await settleChat(hold.hold, 'bob', '0.000000150001');
    expect(settled.charged).toBe('0.000000150001');
    expect(settled.wallet).toMatchObject({ balance: '0.999999849999', held: '0' });
    // settling again changes nothing
    const again = await settleChat(hold.hold, 'bob', '0.1');
    expect(again).toEqual({ charged: '0', shortfall: '0', wallet: undefined });
    const capped = await grantedHold('bob', '0.1');
    const over = await settleChat(capped.hold, 'bob', '5');
    // the real cost is charged whole: the excess over the hold comes from the balance, and what the
    // balance cannot cover leaves it below zero
    expect(over).toMatchObject({ charged: '5', shortfall: '4.000000150001' });
    expect(over.wallet).toMatchObject({
      balance: '-4.000000150001',
      held: '0',
      available: '-4.000000150001',
    });
    const { entries } = await expectLedgerConsistent('bob');
    expect(entries.map((e) => e.kind).sort()).toEqual(['charge', 'charge', 'deposit']);
    const latest = async (type: string) =>
      (
        await ctx.db
          .selectFrom('events')
          .select('envelope')
          .where('type', '=', type)
          .orderBy('seq', 'desc')
          .executeTakeFirstOrThrow()
      ).envelope;
    expect(await latest('balance.charge.created')).toMatchObject({
      data: { amount: '5', externalUserId: 'bob', balance: '-4.000000150001' },
      subject: { externalId: 'bob' },
    });
    expect(await latest('balance.debt.created')).toMatchObject({
      data: {
        amount: '4.000000150001',
        charged: '5',
        holdAmount: '0.1',
        debt: '4.000000150001',
        balance: '-4.000000150001',
        externalUserId: 'bob',
      },
    });
    // in debt, nothing is admitted
    const refused = await holdFor('bob', '0.01');
    expect(refused).toMatchObject({ ok: false, reason: 'insufficient_balance' });
    // a deposit that covers the debt clears it
    await ctx.billing.deposit({ project, externalId: 'bob', amount: '5', source: 'test', trigger });
    expect(await latest('balance.debt.cleared')).toMatchObject({
      data: { amount: '4.000000150001', balance: '0.999999849999', externalUserId: 'bob' },
    });
    const served = await holdFor('bob', '0.01');
    expect(served.ok).toBe(true);
    if (served.ok) await ctx.billing.release(served.hold);
    await expectLedgerConsistent('bob');
  });

  it('never lets concurrent holds overspend', async () => {
    await connectWithOneDollar('carol');
    const results = await Promise.all(Array.from({ length: 25 }, () => holdFor('carol', '0.2')));
    expect(results.filter((r) => r.ok)).toHaveLength(5);
    for (const r of results) if (r.ok) await ctx.billing.release(r.hold);
    const { wallet } = await expectLedgerConsistent('carol');
    expect(wallet).toMatchObject({ balance: '1', held: '0' });
  });

  it('sweeps holds whose request died', async () => {
    await connectWithOneDollar('dave');
    const hold = await grantedHold('dave', '0.7');
    await ctx.db
      .updateTable('holds')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', hold.hold.id)
      .execute();
    expect(await ctx.billing.sweep()).toBeGreaterThanOrEqual(1);
    expect(
      await ctx.db.selectFrom('holds').select('status').where('id', '=', hold.hold.id).executeTakeFirst(),
    ).toEqual({
      status: 'expired',
    });
    const { wallet } = await expectLedgerConsistent('dave');
    expect(wallet.available).toBe('1');
  });
});
