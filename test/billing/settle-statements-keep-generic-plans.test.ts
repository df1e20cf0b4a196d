import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import {
  APPLY_COLUMNS,
  applySlices,
  expireSlices,
  renewSlices,
  takeSlices,
} from '../../src/billing/statements.ts';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext, databaseUrlOf, realPostgres } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * The metered hot path's statements (src/billing/statements.ts: a statement of many CTEs, ~0.6 ms to
 * plan) run on connections of their own that always use the generic plan. Left to Postgres's plan cache,
 * a project with more than a few hundred wallets gets a custom plan, planned again at every execution:
 * a settle's Postgres CPU tripled with 1 000 wallets. Read from `pg_prepared_statements` of the hot
 * connection (DATABASE_POOL_SIZE 3: one hot connection). And those generic plans reach wallets, slices
 * and ledger entries through their keys, never by reading a table from end to end.
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
    // Each with a deposit and a settled slice of its own: the ledger and the slices a paywall keeps.
    await sql`
      INSERT INTO ledger_entries (id, project_id, user_id, kind, amount, balance_after, held_after, source, seq)
      SELECT 'act_many_' || g, ${project.id}, 'usr_many_' || g, 'deposit', 1, 1, 0, 'test', 1
      FROM generate_series(1, 2000) g
    `.execute(ctx.db);
    await sql`
      INSERT INTO holds (id, project_id, user_id, amount, status, purpose, expires_at, closed_at, seq)
      SELECT 'hold_many_' || g, ${project.id}, 'usr_many_' || g, 0.01, 'settled', 'chat', now(), now(), 1
      FROM generate_series(1, 2000) g
    `.execute(ctx.db);
    await sql`ANALYZE end_users, ledger_entries, holds`.execute(ctx.db);
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
               WHERE name = ANY($1::text[]) ORDER BY name`,
      },
      [[takeSlices.name, applySlices.name]],
    );
    expect(plans).toEqual([
      { name: applySlices.name, generic_plans: '12', custom_plans: '0' },
      { name: takeSlices.name, generic_plans: '12', custom_plans: '0' },
    ]);
    const wallet = await sql<{ balance: string; held: string }>`
      SELECT trim_scale(balance)::text AS balance, trim_scale(held)::text AS held FROM end_users WHERE project_id = ${project.id} AND external_id = 'planner'
    `.execute(ctx.db);
    expect(wallet.rows[0]).toEqual({ balance: '99.952', held: '0' });
  });

  // A generic plan is made without the parameters' values: given a CTE of "about ten" changes and a
  // project's 2 000 wallets, Postgres chose to read every wallet of the project (twice per settle)
  // rather than look ten up by key. Each statement names the keys it needs, so its plan finds wallets
  // and slices through their indexes whatever the statistics say.
  it.each(HOT_STATEMENTS)(
    '$statement.name reads no table it changes from end to end',
    async ({ statement, types }) => {
      const client = new pg.Client({ connectionString: databaseUrlOf(ctx.database.schema!) });
      await client.connect();
      try {
        await client.query('SET plan_cache_mode = force_generic_plan');
        await client.query(`PREPARE hot(${types.join(', ')}) AS ${statement.text}`);
        const nulls = types.map(() => 'NULL').join(', ');
        const { rows } = await client.query(`EXPLAIN (FORMAT JSON) EXECUTE hot(${nulls})`);
        const scans = seqScans(rows[0]['QUERY PLAN'][0].Plan);
        expect(scans.filter((table) => ['end_users', 'holds', 'ledger_entries'].includes(table))).toEqual([]);
      } finally {
        await client.end();
      }
    },
  );
});

/** Each hot-path statement with its parameters' types (as `PREPARE` declares them). */
const HOT_STATEMENTS = [
  {
    statement: takeSlices,
    types: [
      'text',
      'text[]',
      'numeric[]',
      'numeric[]',
      'text[]',
      'text',
      'int',
      'text[]',
      'numeric[]',
      'bigint[]',
      'numeric[]',
    ],
  },
  { statement: applySlices, types: ['text', ...APPLY_COLUMNS.map((c) => `${c.type}[]`), 'text'] },
  { statement: renewSlices, types: ['text', 'text[]', 'int'] },
  { statement: expireSlices, types: ['text', 'text[]'] },
];

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  Plans?: PlanNode[];
}

/** The tables a plan reads from end to end. */
function seqScans(node: PlanNode): string[] {
  const own = node['Node Type'] === 'Seq Scan' && node['Relation Name'] ? [node['Relation Name']] : [];
  return [...own, ...(node.Plans ?? []).flatMap(seqScans)];
}
