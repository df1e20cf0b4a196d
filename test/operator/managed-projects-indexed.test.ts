import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { createTestContext, realPostgres } from '../helpers/context.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * A PriceList's or a LimitPolicy's release looks up the projects its marker manages on every resync,
 * once per resource (src/operator/stores.ts `managedProjects`). On a deployment of thousands of
 * projects that lookup goes through a partial index (migration 0030), not through every project.
 */
describe.skipIf(!realPostgres)('the projects a resource manages', () => {
  let ctx: AppContext;

  beforeAll(async () => {
    ctx = await createTestContext();
    const { projectId } = await seedProject(ctx);
    // 3 000 projects, one in a hundred with its pricing and limits managed by a resource.
    await sql`
      INSERT INTO projects
      SELECT (jsonb_populate_record(p, jsonb_build_object(
        'id', 'prj_many_' || g,
        'pricing_managed_by', CASE WHEN g % 100 = 0 THEN 'pricelist/ns/p' || g END,
        'limits_managed_by', CASE WHEN g % 100 = 0 THEN 'limitpolicy/ns/l' || g END))).*
      FROM projects p, generate_series(1, 3000) g WHERE p.id = ${projectId}
    `.execute(ctx.db);
    await sql`ANALYZE projects`.execute(ctx.db);
  });

  afterAll(async () => {
    await ctx?.close();
  });

  it.each(['pricing_managed_by', 'limits_managed_by'])('by %s, through its index', async (column) => {
    const plan = await sql<{ 'QUERY PLAN': string }>`
      EXPLAIN SELECT id FROM projects WHERE ${sql.ref(column)} = ${'pricelist/ns/p100'} AND id <> ${'prj_x'} ORDER BY id
    `.execute(ctx.db);
    const text = plan.rows.map((r) => r['QUERY PLAN']).join('\n');
    expect(text).toContain(`projects_${column}`);
    expect(text).not.toContain('Seq Scan');
  });
});
