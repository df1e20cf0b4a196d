import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEmptySchema, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';

const pgUrl = process.env.TOLLGATE_TEST_PG;

/** The admin flow of the README against the real Postgres: migrate → project create → models apply → proxy. */
describe.skipIf(!pgUrl)('tollgate CLI against Postgres', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-cli-'));
  let env: NodeJS.ProcessEnv;
  let proxy: ChildProcess | undefined;

  function tollgate(...args: string[]) {
    const run = spawnSync(process.execPath, ['cmd/tollgate.ts', ...args], {
      env,
      encoding: 'utf8',
      timeout: 60_000,
    });
    return { status: run.status, stdout: run.stdout, stderr: run.stderr, json: () => JSON.parse(run.stdout) };
  }

  beforeAll(async () => {
    const { databaseUrl } = await createEmptySchema('cli');
    env = {
      ...process.env,
      DATABASE_URL: databaseUrl,
      TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
      TOLLGATE_DATA_DIR: dir,
      REDIS_URL: '',
      LOG_LEVEL: 'info',
      PORT: '0',
      HOST: '127.0.0.1',
    };
  });

  afterAll(() => {
    proxy?.kill('SIGKILL');
  });

  it('runs the admin flow and serves the result', async () => {
    const migrate = tollgate('migrate', '--json');
    expect(migrate.status, migrate.stderr).toBe(0);
    expect(migrate.json().applied).toContain('0001_foundation');
    expect(tollgate('migrate').stdout).toMatch(/up to date/);

    const created = tollgate('project', 'create', '--name', 'CLI app', '--currency', 'eur', '--json');
    expect(created.status, created.stderr).toBe(0);
    const { id, apiKey } = created.json();
    expect(id).toMatch(/^pw_/);
    expect(apiKey).toMatch(/^tg_/);

    const bad = tollgate('project', 'create', '--name', 'x', '--currency', 'EURO');
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/currency/);

    const file = join(dir, 'pricing.yaml');
    writeFileSync(
      file,
      'currency: eur\nmodels:\n  - id: quick\n    pricing: { mode: per_request, perRequest: "0.05" }\n',
    );
    const applied = tollgate('models', 'apply', '--project', id, '--file', file, '--json');
    expect(applied.status, applied.stderr).toBe(0);
    expect(applied.json()).toEqual({ created: ['quick'], updated: [], deleted: [] });

    expect(tollgate('users', 'connect', '--project', id, '--user', 'u1', '--json').json()).toMatchObject({
      connected: true,
    });
    const deposited = tollgate(
      'users',
      'deposit',
      '--project',
      id,
      '--user',
      'u1',
      '--amount',
      '12.50',
      '--json',
    );
    expect(deposited.json()).toMatchObject({ amount: '12.50', currency: 'eur', balance: '12.5' });
    const tooPrecise = tollgate('users', 'deposit', '--project', id, '--user', 'u1', '--amount', '1.005');
    expect(tooPrecise.status).toBe(1);
    expect(tooPrecise.stderr).toMatch(/at most 2 decimal places/);
    // a user's money, and the project's users
    const shown = tollgate('users', 'show', '--project', id, '--user', 'u1');
    expect(shown.status, shown.stderr).toBe(0);
    expect(shown.stdout).toContain('u1 (connected)');
    expect(shown.stdout).toContain('balance 12.50 EUR (paid 12.50, credits 0.00)');
    expect(shown.stdout).toContain('held 0.00 EUR by requests in flight; available 12.50 EUR');
    expect(tollgate('users', 'show', '--project', id, '--user', 'u1', '--json').json()).toMatchObject({
      user: 'u1',
      connected: true,
      balance: '12.50',
      held: '0.00',
      available: '12.50',
    });
    const listed = tollgate('users', 'list', '--project', id, '--json').json();
    expect(listed.data.map((u: { user: string }) => u.user)).toEqual(['u1']);
    expect(tollgate('users', 'list', '--project', id, '--search', 'nobody').stdout).toContain('no users');
    expect(tollgate('users', 'list', '--project', id, '--limit', '500').stderr).toMatch(/--limit/);

    const debt = tollgate('project', 'set', '--project', id, '--debt-limit', '2.50', '--json');
    expect(debt.status, debt.stderr).toBe(0);
    expect(tollgate('project', 'show', '--project', id, '--json').json().settings).toMatchObject({
      debtLimit: '2.5',
    });
    expect(tollgate('project', 'set', '--project', id, '--debt-limit', 'abc').stderr).toMatch(/debtLimit/);

    const key2 = tollgate('key', 'create', '--project', id, '--name', 'second', '--json').json();
    expect(tollgate('key', 'list', '--project', id, '--json').json()).toHaveLength(2);

    proxy = spawn(process.execPath, ['cmd/tollgate.ts', 'proxy'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const base = await new Promise<string>((resolve, reject) => {
      let out = '';
      proxy!.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        const match = /listening on (http:\/\/\S+?) /.exec(out);
        if (match) resolve(match[1]!);
      });
      proxy!.once('exit', (code) => reject(new Error(`proxy exited with ${code}: ${out}`)));
    });
    const models = await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${apiKey}` } });
    expect(models.status).toBe(200);
    expect(((await models.json()) as any).data.map((m: { id: string }) => m.id)).toEqual(['quick']);

    expect(tollgate('key', 'revoke', '--key', key2.id).status).toBe(0);
    const revoked = await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${key2.apiKey}` } });
    expect(revoked.status).toBe(401);

    const exited = new Promise<number | null>((resolve) => proxy!.once('exit', resolve));
    proxy.kill('SIGTERM');
    expect(await exited).toBe(0);
    proxy = undefined;
  }, 180_000);

  it('prints usage errors clearly', () => {
    const missing = tollgate('project', 'create');
    expect(missing.status).toBe(2);
    expect(missing.stderr).toMatch(/--name is required/);
    const unknown = tollgate('frobnicate');
    expect(unknown.status).toBe(2);
    expect(unknown.stderr).toMatch(/unknown command: frobnicate/);
  }, 60_000);
});
