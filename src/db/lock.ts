import { closeSync, openSync, readFileSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { join, resolve } from 'node:path';

/**
 * The embedded database (PGlite) belongs to one process at a time: two processes writing one data
 * directory corrupt it. Opening it takes `<TOLLGATE_DATA_DIR>/tollgate.lock` (created exclusively, holding
 * the owner's pid, command and — once it listens — its URL). A second process is refused with one line
 * naming the owner and pointing at TOLLGATE_URL; a lock whose process is gone (a crash, SIGKILL) is taken
 * over.
 */
export interface LockInfo {
  pid: number;
  command: string;
  startedAt: string;
  url?: string;
}

/** The embedded database is held by another live process. */
export class EmbeddedDatabaseLocked extends Error {
  readonly owner: LockInfo;
  constructor(dir: string, owner: LockInfo) {
    const url = owner.url ?? 'http://127.0.0.1:8080';
    super(
      `the embedded database in ${dir} is in use by process ${owner.pid} (\`tollgate ${owner.command || '?'}\`, since ${owner.startedAt}); ` +
        `use that server instead: set TOLLGATE_URL=${url} and TOLLGATE_ADMIN_TOKEN (as \`tollgate dev\` printed them), or stop it first`,
    );
    this.owner = owner;
  }
}

export function lockFileOf(dataDir: string): string {
  return join(resolve(dataDir), 'tollgate.lock');
}

/** Whether a process with that pid exists (on this machine), whoever owns it. */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: the process exists but belongs to someone else.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function readLock(file: string): LockInfo | undefined {
  try {
    const info = JSON.parse(readFileSync(file, 'utf8')) as LockInfo;
    return Number.isInteger(info.pid) ? info : undefined;
  } catch {
    return undefined;
  }
}

function youngerThan(file: string, ms: number): boolean {
  try {
    return Date.now() - statSync(file).mtimeMs < ms;
  } catch {
    return false;
  }
}

export interface HeldLock {
  file: string;
  /** Records the URL the owner serves on, for the message a second process gets. */
  setUrl(url: string): void;
  release(): void;
}

/** Takes the lock of the embedded database in `dataDir`, or throws EmbeddedDatabaseLocked. */
export function acquireEmbeddedLock(dataDir: string): HeldLock {
  const file = lockFileOf(dataDir);
  const info: LockInfo = {
    pid: process.pid,
    command: process.argv.slice(2).join(' '),
    startedAt: new Date().toISOString(),
  };
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fd = openSync(file, 'wx', 0o600);
      writeSync(fd, JSON.stringify(info));
      closeSync(fd);
      return {
        file,
        setUrl(url) {
          info.url = url;
          if (readLock(file)?.pid === process.pid) writeFileSync(file, JSON.stringify(info), { mode: 0o600 });
        },
        release() {
          if (readLock(file)?.pid === process.pid) rmSync(file, { force: true });
        },
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const owner = readLock(file);
    if (owner && owner.pid !== process.pid && processAlive(owner.pid)) {
      throw new EmbeddedDatabaseLocked(resolve(dataDir), owner);
    }
    if (owner && owner.pid === process.pid) {
      throw new Error(`the embedded database in ${resolve(dataDir)} is already open in this process`);
    }
    if (!owner && youngerThan(file, 5000)) {
      // Being written by a process that is starting right now.
      throw new EmbeddedDatabaseLocked(resolve(dataDir), { pid: 0, command: 'starting', startedAt: 'now' });
    }
    // Stale (its process is gone) or unreadable for a while (a crash mid-write): take it over.
    rmSync(file, { force: true });
  }
  throw new Error(`could not take the lock ${file}`);
}
