import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEmptySchema, pgQuery, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';

const pgUrl = process.env.TOLLGATE_TEST_PG;

/** `tollgate providers add|list|remove` and `users spend-caps` against the real Postgres. */
describe.skipIf(!pgUrl)('tollgate providers CLI', () => {
  let schema = '';
  let env: NodeJS.ProcessEnv;

  function tollgate(...args: string[]) {
    const run = spawnSync(process.execPath, ['cmd/tollgate.ts', ...args, '--json'], {
      env,
      encoding: 'utf8',
      timeout: 60_000,
    });
    return { status: run.status, stderr: run.stderr, json: () => JSON.parse(run.stdout) };
  }

  beforeAll(async () => {
    const created = await createEmptySchema('prv');
    schema = created.schema;
    env = {
      ...process.env,
      DATABASE_URL: created.databaseUrl,
      TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
      TOLLGATE_DATA_DIR: mkdtempSync(join(tmpdir(), 'tollgate-prv-')),
      REDIS_URL: '',
      LOG_LEVEL: 'silent',
    };
  });
  afterAll(async () => {
    if (schema) await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  });

  it('adds, lists and removes providers; the project upstream is `default`', () => {
    expect(tollgate('migrate').status).toBe(0);
    const created = tollgate(
      'project',
      'create',
      '--name',
      'P',
      '--upstream-url',
      'https://a.example/v1',
      '--upstream-key',
      'sk-a',
    );
    expect(created.status, created.stderr).toBe(0);
    const { id } = created.json();
    const added = tollgate(
      'providers',
      'add',
      '--project',
      id,
      '--name',
      'backup',
      '--base-url',
      'https://b.example/v1/',
      '--key',
      'sk-b',
      '--response-timeout-ms',
      '5000',
    );
    expect(added.status, added.stderr).toBe(0);
    expect(added.json()).toMatchObject({
      name: 'backup',
      baseUrl: 'https://b.example/v1',
      keySet: true,
      timeouts: { responseMs: 5000 },
    });
    const listed = tollgate('providers', 'list', '--project', id).json();
    expect(listed.map((p: { name: string; keySet: boolean }) => [p.name, p.keySet])).toEqual([
      ['backup', true],
      ['default', true],
    ]);
    expect(JSON.stringify(listed)).not.toContain('sk-');
    const bad = tollgate(
      'providers',
      'add',
      '--project',
      id,
      '--name',
      'bad name',
      '--base-url',
      'https://c.example',
    );
    expect(bad.status).toBe(1);
    expect(tollgate('providers', 'remove', '--project', id, '--name', 'backup').json()).toEqual({
      name: 'backup',
      removed: true,
    });
    expect(tollgate('providers', 'list', '--project', id).json()).toHaveLength(1);
    const caps = tollgate('users', 'spend-caps', '--project', id, '--user', 'u1', '--daily', '2.50');
    expect(caps.json()).toEqual({ user: 'u1', daily: '2.5' });
  }, 120_000);
});
