import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import * as migration from '../../src/db/migrations/0009_routing_limits.ts';
import { createTestContext } from '../helpers/context.ts';

/** Migration 0009 turns each project's single upstream into its provider `default`, in place. */
let ctx: AppContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(() => ctx?.close());

describe('migration 0009', () => {
  it('moves an existing upstream (URL and sealed key) into the provider `default`', async () => {
    await migration.down(ctx.db as never);
    const sealed = ctx.sealer.seal('sk-legacy');
    await sql`
      INSERT INTO projects (id, name, currency, owner_user_id, settings, upstream_base_url, upstream_key_sealed)
      VALUES ('pw_legacy', 'Legacy', 'usd', 'acct_1', '{}', 'https://legacy.example/v1', ${sealed}),
             ('pw_none', 'No upstream', 'usd', 'acct_2', '{}', NULL, NULL)
    `.execute(ctx.db);
    await migration.up(ctx.db as never);
    const rows = await ctx.db.selectFrom('providers').selectAll().orderBy('project_id').execute();
    expect(rows.map((r) => [r.project_id, r.name, r.base_url, r.key_sealed])).toEqual([
      ['pw_legacy', 'default', 'https://legacy.example/v1', sealed],
    ]);
    const project = await ctx.projects.get('pw_legacy');
    expect(project?.providers.get('default')?.apiKey).toBe('sk-legacy');
    expect(project?.upstream).toEqual({ baseUrl: 'https://legacy.example/v1', apiKey: 'sk-legacy' });
    expect((await ctx.projects.get('pw_none'))?.providers.size).toBe(0);
  });
});
