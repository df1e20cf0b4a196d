import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { COMMANDS } from '../../src/cli/commands.ts';
import { acquireEmbeddedLock, EmbeddedDatabaseLocked, lockFileOf } from '../../src/db/lock.ts';
import { dataDirFor } from '../helpers/dev-process.ts';
import { startTestServer } from '../helpers/server.ts';

const env = { ...process.env, DATABASE_URL: '', REDIS_URL: '', TOLLGATE_URL: '', TOLLGATE_ADMIN_TOKEN: '' };

function tollgate(args: string[], extra: Record<string, string> = {}) {
  const run = spawnSync(process.execPath, ['cmd/tollgate.ts', ...args], {
    env: { ...env, ...extra },
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { status: run.status, stdout: run.stdout, stderr: run.stderr };
}

describe('the tollgate binary', () => {
  it('works as the README runs it: npm run tollgate -- --help', () => {
    const run = spawnSync('npm', ['run', '--silent', 'tollgate', '--', '--help'], {
      env,
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(run.status, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^tollgate — metered/);
  }, 60_000);

  it('gives every command its own --help', () => {
    const seen = new Set<string>();
    for (const spec of COMMANDS) {
      const run = tollgate([...spec.name.split(' '), '--help']);
      expect(run.status, spec.name).toBe(0);
      expect(run.stdout).toContain(`Usage: tollgate ${spec.usage}`);
      seen.add(run.stdout);
    }
    expect(seen.size).toBe(COMMANDS.length);
  }, 120_000);

  it('suggests what was meant for unknown commands and options', () => {
    const command = tollgate(['projct', 'create']);
    expect(command.status).toBe(2);
    expect(command.stderr).toMatch(/unknown command: projct \(did you mean `project`\?\)/);
    const sub = tollgate(['key', 'revok']);
    expect(sub.stderr).toMatch(/did you mean `key revoke`\?/);
    const option = tollgate(['project', 'create', '--nmae', 'x']);
    expect(option.status).toBe(2);
    expect(option.stderr).toMatch(/--nmae is not an option \(did you mean --name\?\)/);
    expect(option.stderr).toMatch(/tollgate project create --help/);
    const elsewhere = tollgate(['dev', '--migrate']);
    expect(elsewhere.stderr).toMatch(/--migrate is not an option of `tollgate dev`/);
  }, 60_000);

  it('ships examples/pricing.yaml, valid for `models apply`', async () => {
    const { parsePricingFile } = await import('../../src/models/service.ts');
    const file = parsePricingFile(readFileSync('examples/pricing.yaml', 'utf8'));
    expect(file.models.length).toBeGreaterThan(2);
  });
});

describe('the embedded database lock', () => {
  let holder: ChildProcess | undefined;
  const dataDir = dataDirFor('tollgate-lock-', () => [holder]);

  it('refuses a second process with one line naming the first, and takes over a stale lock', async () => {
    // A process holding the lock, as `tollgate dev` does while it runs.
    holder = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const { acquireEmbeddedLock } = await import(${JSON.stringify(join(process.cwd(), 'src/db/lock.ts'))});
         const lock = acquireEmbeddedLock(${JSON.stringify(dataDir)});
         lock.setUrl('http://127.0.0.1:18080');
         console.log('locked');
         setInterval(() => {}, 1000);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve) => holder!.stdout!.once('data', () => resolve()));

    const second = tollgate(['migrate'], { TOLLGATE_DATA_DIR: dataDir, LOG_LEVEL: 'silent' });
    expect(second.status).toBe(1);
    const lines = second.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`in use by process ${holder.pid}`);
    expect(lines[0]).toContain('TOLLGATE_URL=http://127.0.0.1:18080');
    expect(() => acquireEmbeddedLock(dataDir)).toThrow(EmbeddedDatabaseLocked);

    // The holder dies without cleaning up: its lock is stale and is taken over.
    const exited = new Promise((resolve) => holder!.once('exit', resolve));
    holder.kill('SIGKILL');
    await exited;
    holder = undefined;
    expect(existsSync(lockFileOf(dataDir))).toBe(true);
    const lock = acquireEmbeddedLock(dataDir);
    expect(JSON.parse(readFileSync(lockFileOf(dataDir), 'utf8')).pid).toBe(process.pid);
    lock.release();
    expect(existsSync(lockFileOf(dataDir))).toBe(false);
  }, 60_000);
});

describe('GET /', () => {
  it('answers a small page linking to the dashboard and the docs', async () => {
    const server = await startTestServer();
    try {
      const res = await fetch(`${server.url}/`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/text\/html/);
      const text = await res.text();
      expect(text).toContain('href="/dashboard"');
      expect(text).toContain('href="/docs"');
      const docs = await fetch(`${server.url}/docs`);
      expect(docs.status).toBe(200);
      expect(docs.headers.get('content-type')).toMatch(/text\/html/);
      expect(await docs.text()).toContain('<h1 id="tollgate-documentation">Tollgate documentation');
    } finally {
      await server.close();
    }
  });
});
