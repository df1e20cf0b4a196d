import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';

/**
 * A data directory for the `tollgate` processes a describe block starts (`tollgate dev`, the CLI): after
 * the block, the processes `children` names are killed and the directory is removed.
 */
export function dataDirFor(prefix: string, children: () => Array<ChildProcess | undefined>): string {
  const dataDir = mkdtempSync(join(tmpdir(), prefix));
  afterAll(() => {
    for (const child of children()) child?.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
  });
  return dataDir;
}

/**
 * The environment of `tollgate dev` as a newcomer runs it, on the embedded default: none of this
 * process's database, Redis, key, admin token or URL.
 */
export function devEnv(dataDir: string, more: Record<string, string> = {}): NodeJS.ProcessEnv {
  return {
    ...process.env,
    DATABASE_URL: '',
    REDIS_URL: '',
    TOLLGATE_ENCRYPTION_KEY: '',
    TOLLGATE_ADMIN_TOKEN: '',
    TOLLGATE_URL: '',
    ...more,
    TOLLGATE_DATA_DIR: dataDir,
    LOG_LEVEL: 'warn',
  };
}

/**
 * Starts `tollgate dev` with `env`. `ready` resolves once it printed "Press Ctrl+C", with all it printed
 * (stdout and stderr) so far; it rejects if the process exits first.
 */
export function startDev(env: NodeJS.ProcessEnv): { child: ChildProcess; ready: Promise<string> } {
  const child = spawn(process.execPath, ['cmd/tollgate.ts', 'dev'], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stderr!.on('data', (c: Buffer) => {
    out += c.toString();
  });
  const ready = new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      if (out.includes('Press Ctrl+C')) resolve(out);
    });
    child.once('exit', (code) => reject(new Error(`dev exited with ${code}: ${out}`)));
  });
  return { child, ready };
}
