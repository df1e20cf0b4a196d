import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createContext } from '../../src/app/context.ts';
import { seedDev } from '../../src/cli/serve.ts';
import { type Config, ConfigError, loadConfig } from '../../src/config/index.ts';
import { Sealer } from '../../src/core/crypto.ts';
import { createProject } from '../../src/projects/service.ts';
import { createTestContext, newTestId, realPostgres, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';

const OTHER_KEY = 'b'.repeat(64);
const dirs: string[] = [];
const tempDir = (prefix: string) => {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** A configuration on the suite's database (one schema, or one embedded directory) with `key`. */
function configWith(dataDir: string, key: string): Config {
  return loadConfig({
    LOG_LEVEL: 'silent',
    TOLLGATE_ENCRYPTION_KEY: key,
    TOLLGATE_DATA_DIR: dataDir,
    DATABASE_URL: process.env.TOLLGATE_TEST_PG || undefined,
  });
}

/** Runs `tollgate <args>` and resolves with its exit code and output once it exits (or is killed). */
function tollgate(args: string[], env: Record<string, string>, timeoutMs: number) {
  const child = spawn(process.execPath, ['cmd/tollgate.ts', ...args], {
    env: { ...process.env, REDIS_URL: '', LOG_LEVEL: 'warn', HOST: '0.0.0.0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (c: Buffer) => {
    stderr += c.toString();
  });
  child.stdout.on('data', (c: Buffer) => {
    stdout += c.toString();
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  return new Promise<{ code: number | null; stderr: string; stdout: string }>((resolve) => {
    child.once('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stderr, stdout });
    });
  });
}

describe('TOLLGATE_ENCRYPTION_KEY must be the key the database was set up with', () => {
  it('records the key check on the first start and refuses another key at start-up', async () => {
    const dataDir = tempDir('tollgate-key-');
    const schema = `tgt_${newTestId()}`;
    const first = await createContext(configWith(dataDir, TEST_ENCRYPTION_KEY), { schema });
    await first.migrate();
    const check = await first.db.selectFrom('system_settings').selectAll().execute();
    expect(check.map((r) => r.name)).toEqual(['encryption_key_check']);
    expect(check[0]!.value).toBe(new Sealer(Buffer.from(TEST_ENCRYPTION_KEY, 'hex')).keyCheck());
    expect(check[0]!.value).not.toContain(TEST_ENCRYPTION_KEY);
    await first.close();

    const refused = await createContext(configWith(dataDir, OTHER_KEY), { schema }).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as ConfigError).variable).toBe('TOLLGATE_ENCRYPTION_KEY');
    expect((refused as Error).message).toMatch(/^configuration error: TOLLGATE_ENCRYPTION_KEY .*not the key/);
    expect((refused as Error).message).not.toContain('\n');

    // The right key still starts.
    const again = await createContext(configWith(dataDir, TEST_ENCRYPTION_KEY), { schema });
    await again.close();
  });

  it('on a database set up before the key check, refuses a key that cannot open its sealed secrets', async () => {
    const dataDir = tempDir('tollgate-key-');
    const schema = `tgt_${newTestId()}`;
    const ctx = await createContext(configWith(dataDir, TEST_ENCRYPTION_KEY), { schema });
    await ctx.migrate();
    await createProject(ctx.db, ctx.sealer, {
      name: 'Sealed',
      currency: 'usd',
      upstreamUrl: 'https://api.example.com/v1',
      upstreamKey: 'sk-provider',
    });
    // As a database migrated before 0005 recorded a check.
    await ctx.db.deleteFrom('system_settings').execute();
    await ctx.close();
    await expect(createContext(configWith(dataDir, OTHER_KEY), { schema })).rejects.toThrow(
      /TOLLGATE_ENCRYPTION_KEY .*not the key/,
    );
    const right = await createContext(configWith(dataDir, TEST_ENCRYPTION_KEY), { schema });
    const rows = await right.db.selectFrom('system_settings').select('name').execute();
    expect(rows).toHaveLength(1);
    await right.close();
  });
});

describe('start-up errors say what to change', () => {
  let holder: Server | undefined;
  afterAll(() => holder?.close());

  it('a busy port exits 1 with one line naming PORT, and releases the embedded database', async () => {
    holder = createServer();
    await new Promise<void>((resolve) => holder!.listen(0, '0.0.0.0', resolve));
    const port = (holder.address() as { port: number }).port;
    const dataDir = tempDir('tollgate-port-');
    const run = await tollgate(
      ['proxy'],
      { PORT: String(port), DATABASE_URL: '', TOLLGATE_ENCRYPTION_KEY: '', TOLLGATE_DATA_DIR: dataDir },
      240_000,
    );
    expect(run.stderr).toMatch(new RegExp(`port ${port} is already in use.*set PORT`));
    expect(run.code).toBe(1);
  }, 270_000);

  it.each([
    ['refused', 'postgres://tollgate:secret@127.0.0.1:1/tollgate', /ECONNREFUSED/],
    [
      'an unknown host',
      'postgres://tollgate:secret@no-such-host.invalid:5432/tollgate',
      /ENOTFOUND|EAI_AGAIN/,
    ],
  ])(
    'a database connection %s names DATABASE_URL',
    async (_what, url, code) => {
      const run = await tollgate(
        ['proxy'],
        { PORT: '0', DATABASE_URL: url, TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY },
        60_000,
      );
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(code);
      expect(run.stderr).toMatch(/DATABASE_URL/);
      expect(run.stderr).not.toContain('secret');
    },
    90_000,
  );
});

describe.skipIf(!realPostgres)('tollgate dev on DATABASE_URL', () => {
  it('makes the data directory it keeps dev.json in', async () => {
    const dataDir = join(tempDir('tollgate-devdir-'), 'fresh', '.tollgate');
    const ctx = await createTestContext({ TOLLGATE_DATA_DIR: dataDir });
    try {
      expect(existsSync(dataDir)).toBe(false);
      const state = await seedDev(ctx);
      const saved = JSON.parse(readFileSync(join(dataDir, 'dev.json'), 'utf8'));
      expect(saved).toEqual(state);
      expect(await seedDev(ctx)).toEqual(state);
    } finally {
      await ctx.close();
    }
  });
});
