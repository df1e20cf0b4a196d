import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

/**
 * Database and Redis servers that a fault test starts, stops and restarts itself — never the shared
 * ones other test runs use. Each lives in a temporary directory on a spare loopback port and is always
 * removed (`destroy`, and on process exit).
 */

const run = promisify(execFile);
export const PG_BIN = process.env.TOLLGATE_TEST_PG_BIN ?? '/usr/lib/postgresql/15/bin';

/** A free TCP port on loopback (free when asked; the servers bind it right after). */
export async function sparePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export function havePostgresBinaries(): boolean {
  return existsSync(join(PG_BIN, 'initdb')) && existsSync(join(PG_BIN, 'pg_ctl'));
}

export function haveRedisServer(): boolean {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

export interface PrivatePostgres {
  url: string;
  port: number;
  /** `pg_ctl stop` (fast: ends sessions and shuts down cleanly; immediate: like a crash). */
  stop(mode?: 'fast' | 'immediate'): Promise<void>;
  start(): Promise<void>;
  restart(mode?: 'fast' | 'immediate'): Promise<void>;
  /** Stops it (immediate) and removes its directory. */
  destroy(): Promise<void>;
}

/**
 * initdb + pg_ctl start with Debian's Postgres binaries. initdb and postgres refuse to run as root, so
 * as root they run as the `postgres` user (else `nobody`) through `runuser`, in a directory that user
 * owns. Every step is bounded in time (`pg_ctl -t`, exec timeouts).
 */
export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-pg-'));
  const data = join(dir, 'data');
  const port = await sparePort();
  const asRoot = process.getuid?.() === 0;
  let user: { name: string; uid: number; gid: number } | undefined;
  if (asRoot) {
    for (const name of ['postgres', 'nobody']) {
      try {
        const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8' }).trim());
        const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8' }).trim());
        user = { name, uid, gid };
        break;
      } catch {}
    }
    if (!user) throw new Error('running as root and no postgres or nobody user to run Postgres as');
    chownSync(dir, user.uid, user.gid);
  }
  chmodSync(dir, 0o755);
  const exec = (bin: string, args: string[], timeout = 60_000) => {
    const file = join(PG_BIN, bin);
    return user
      ? run('runuser', ['-u', user.name, '--', file, ...args], { timeout, cwd: dir })
      : run(file, args, { timeout, cwd: dir });
  };
  const pgCtl = (args: string[]) => exec('pg_ctl', ['-D', data, '-w', '-t', '60', ...args], 90_000);
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off`;
  let running = false;
  const server: PrivatePostgres = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    async start() {
      await pgCtl(['-l', join(dir, 'postgres.log'), '-o', options, 'start']);
      running = true;
    },
    async stop(mode = 'fast') {
      await pgCtl(['-m', mode, 'stop']);
      running = false;
    },
    async restart(mode = 'fast') {
      running = true;
      await pgCtl(['-m', mode, '-l', join(dir, 'postgres.log'), '-o', options, 'restart']);
    },
    async destroy() {
      process.off('exit', onExit);
      if (running) await pgCtl(['-m', 'immediate', 'stop']).catch(() => {});
      running = false;
      rmSync(dir, { recursive: true, force: true });
    },
  };
  // Never leave a postmaster behind, even when the test process dies.
  const onExit = () => {
    if (running) {
      try {
        execFileSync(
          user ? 'runuser' : join(PG_BIN, 'pg_ctl'),
          [
            ...(user ? ['-u', user.name, '--', join(PG_BIN, 'pg_ctl')] : []),
            '-D',
            data,
            '-m',
            'immediate',
            'stop',
          ],
          { timeout: 10_000, stdio: 'ignore' },
        );
      } catch {}
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', onExit);
  try {
    await exec('initdb', [
      '-D',
      data,
      '-A',
      'trust',
      '-U',
      'postgres',
      '-E',
      'UTF8',
      '--no-sync',
      '--no-instructions',
    ]);
    await server.start();
  } catch (err) {
    await server.destroy();
    throw err;
  }
  return server;
}

export interface PrivateRedis {
  url: string;
  port: number;
  /** Stops the server (SIGKILL: like a crashed or unreachable Redis) and waits for it to exit. */
  stop(): Promise<void>;
  start(): Promise<void>;
  destroy(): Promise<void>;
}

/** `redis-server` on a spare port, without persistence. */
export async function startPrivateRedis(): Promise<PrivateRedis> {
  const port = await sparePort();
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-redis-'));
  let child: ChildProcess | undefined;
  const onExit = () => child?.kill('SIGKILL');
  process.on('exit', onExit);
  const server: PrivateRedis = {
    url: `redis://127.0.0.1:${port}`,
    port,
    async start() {
      const started = spawn(
        'redis-server',
        ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      child = started;
      await new Promise<void>((resolve, reject) => {
        let out = '';
        const timer = setTimeout(() => reject(new Error(`redis-server did not start: ${out}`)), 20_000);
        started.stdout!.on('data', (c: Buffer) => {
          out += c.toString();
          if (out.includes('Ready to accept connections')) {
            clearTimeout(timer);
            resolve();
          }
        });
        started.once('exit', (code) => {
          clearTimeout(timer);
          reject(new Error(`redis-server exited with ${code}: ${out}`));
        });
      });
    },
    async stop() {
      const current = child;
      child = undefined;
      if (!current || current.exitCode !== null) return;
      const exited = new Promise((resolve) => current.once('exit', resolve));
      current.kill('SIGKILL');
      await exited;
    },
    async destroy() {
      await server.stop();
      process.off('exit', onExit);
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await server.start();
  return server;
}
