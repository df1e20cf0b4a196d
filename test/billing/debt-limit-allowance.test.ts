import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { Money } from '../../src/core/money.ts';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * The debt limit in the escrow (issue 35): `BillingService.hold` takes the project's `debtLimit` (default
 * 0) through `Escrow.reserve` to the take, which admits a request when balance + debtLimit − held covers
 * it and takes at most that much into its slice. With 0, nothing changes.
 */
const trigger = { source: 'test', actorType: 'test', actorId: 'debt-limit' };

describe.each([
  ['a hold per request', { ESCROW_IDLE_MS: '0', ESCROW_SLICE_REQUESTS: '1' }],
  ['escrow slices of 16', { ESCROW_IDLE_MS: '30000', ESCROW_SLICE_REQUESTS: '16' }],
])('the debt limit allowance, %s', (_name, env) => {
  let ctx: AppContext;
  let project: Project;

  beforeAll(async () => {
    ctx = await createTestContext(env);
    project = await getProject(ctx.db, (await seedProject(ctx)).projectId);
  });
  afterAll(async () => {
    await ctx?.close();
  });

  async function wallet(user: string, amount: string) {
    await connectUser(ctx.db, ctx.events, project, user, trigger);
    await ctx.billing.deposit({ project, externalId: user, amount, source: 'test', trigger });
  }

  const hold = (user: string, amount: string, debtLimit?: string) =>
    ctx.billing.hold({
      project,
      externalId: user,
      amount,
      purpose: 'chat',
      ...(debtLimit ? { debtLimit } : {}),
    });

  async function slices(user: string) {
    const row = await ctx.db
      .selectFrom('end_users')
      .select(['balance', 'held', 'reserved'])
      .where('project_id', '=', project.id)
      .where('external_id', '=', user)
      .executeTakeFirstOrThrow();
    return {
      balance: new Money(row.balance).toFixed(),
      held: new Money(row.held).toFixed(),
      reserved: new Money(row.reserved).toFixed(),
    };
  }

  it('refuses beyond the balance without one (as before)', async () => {
    await wallet('none', '0.50');
    const refused = await hold('none', '0.60');
    expect(refused).toMatchObject({ ok: false, reason: 'insufficient_balance' });
    expect(await slices('none')).toEqual({ balance: '0.5', held: '0', reserved: '0' });
  });

  it('admits up to balance + debtLimit − held, and takes no more than that', async () => {
    await wallet('debt', '0.50');
    const first = await hold('debt', '1.20', '1');
    expect(first.ok).toBe(true);
    // the slice took at most 0.50 + 1 = 1.50 (16 × 1.20 would be far more); the request reserved 1.20
    const after = await slices('debt');
    expect(after.reserved).toBe('1.2');
    expect(new Money(after.held).lte('1.5')).toBe(true);
    expect(new Money(after.held).gte('1.2')).toBe(true);
    // 0.30 of the allowance is left: a second request of 0.40 is refused, one of 0.30 admitted
    expect(await hold('debt', '0.40', '1')).toMatchObject({ ok: false, reason: 'insufficient_balance' });
    const third = await hold('debt', '0.30', '1');
    expect(third.ok).toBe(true);
    // (with escrow the third is admitted from the slice's memory: the reservations shown are written at
    // the slice's next change)
    expect(await slices('debt')).toMatchObject({ held: '1.5' });
    expect(['1.2', '1.5']).toContain((await slices('debt')).reserved);
    // settled at their holds: the wallet ends at −1.00, exactly the limit
    for (const h of [first, third]) {
      if (!h.ok) throw new Error('refused');
      await ctx.billing.settle({
        project,
        hold: h.hold,
        cost: h.hold.amount,
        source: 'chat',
        model: 'm',
        trigger,
        externalId: 'debt',
        metadata: {},
        description: 'debt limit',
      });
    }
    await ctx.billing.escrow.reclaim(project.id, [first.ok ? first.hold.userId : '']);
    expect(await slices('debt')).toEqual({ balance: '-1', held: '0', reserved: '0' });
    expect(await hold('debt', '0.01', '1')).toMatchObject({ ok: false, reason: 'insufficient_balance' });
  });
});
