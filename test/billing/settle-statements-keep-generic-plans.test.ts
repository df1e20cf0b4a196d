import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext, realPostgres } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * The metered hot path's statements (src/billing/statements.ts: a statement of many CTEs, ~0.6 ms to
 * plan) run on connections of their own that always use the generic plan. Left to Postgres's plan cache,
 * a project with more than a few hundred wallets gets a custom plan, planned again at every execution:
 * a settle's Postgres CPU tripled with 1 000 wallets. Read from `pg_prepared_statements` of the hot
 * connection (DATABASE_POOL_SIZE 3: one hot connection).
 */
const trigger = { source: 'test', actorType: 'test', actorId: 'plans' };

describe.skipIf(!realPostgres)('the settle statements on a project with many wallets', () => {
  let ctx: AppContext;
  let project: Project;

  beforeAll(async () => {
    ctx = await createTestContext({ DATABASE_POOL_SIZE: '3' });
    project = await getProject(ctx.db, (await seedProject(ctx)).projectId);
    // 2 000 other wallets of the project, as a busy paywall has: the statistics the planner sees.
    await sql`
      INSERT INTO end_users (id, project_id, external_id, connected, balance, held)
      SELECT 'usr_many_' || g, ${project.id}, 'many-' || g, true, 1, 0 FROM generate_series(1, 2000) g
    `.execute(ctx.db);
    await sql`ANALYZE end_users`.execute(ctx.db);
    await connectUser(ctx.db, ctx.events, project, 'planner', trigger);
    await ctx.billing.deposit({ project, externalId: 'planner', amount: '100', source: 'test', trigger });
  });

  afterAll(async () => {
    await ctx?.close();
  });

  it('take and settle on generic plans only, however many times they run', async () => {
    for (let i = 0; i < 12; i++) {
      const held = await ctx.billing.hold({
        project,
        externalId: 'planner',
        amount: '0.01',
        purpose: 'chat',
      });
      if (!held.ok) throw new Error('refused');
      await ctx.billing.settle({
        project,
        hold: held.hold,
        cost: '0.004',
        source: 'chat',
        model: 'm',
        trigger,
        externalId: 'planner',
        metadata: {},
        description: 'plans',
      });
    }
    const plans = await ctx.database.run<{ name: string; generic_plans: string; custom_plans: string }>(
      {
        name: 'tollgate_test_plans',
        text: `SELECT name, generic_plans, custom_plans FROM pg_prepared_statements
               WHERE name IN ('tollgate_take_slices_v2', 'tollgate_apply_slices_v4') ORDER BY name`,
      },
      [],
    );
    expect(plans).toEqual([
      { name: 'tollgate_apply_slices_v4', generic_plans: '12', custom_plans: '0' },
      { name: 'tollgate_take_slices_v2', generic_plans: '12', custom_plans: '0' },
    ]);
    const wallet = await sql<{ balance: string; held: string }>`
      SELECT trim_scale(balance)::text AS balance, trim_scale(held)::text AS held FROM end_users WHERE project_id = ${project.id} AND external_id = 'planner'
    `.execute(ctx.db);
    expect(wallet.rows[0]).toEqual({ balance: '99.952', held: '0' });
  });
});
