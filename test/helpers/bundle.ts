import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { processAlive } from '../../src/db/lock.ts';

/**
 * The `tollgate` command as it ships: rolldown.config.ts's bundle, built once per test process with
 * rolldown's JavaScript API, laid out as the image lays it out — `<dir>/package.json`,
 * `<dir>/dist/bin/tollgate.js` and its chunks, and a `<dir>/node_modules` holding only rolldown.config.ts's
 * `runtimeFiles` (linked from the repository's) — in a fresh directory under the system's temporary
 * directory, never `dist/` (which `make build` owns). Whatever the bundle would read from node_modules
 * beyond that list fails here as it would in the image: nothing above `<dir>` has a node_modules.
 * src/metrics/registry.ts and src/dashboard/home.ts find `<dir>/package.json` three directories above the
 * chunks, as in dist/bin/chunks and the image's /app/dist/bin/chunks.
 *
 * Removal: on 'exit', and on SIGTERM / SIGINT, which is how vitest ends its fork workers (SIGTERM, without
 * an 'exit' event) — the signal is raised again afterwards unless someone else listens for it, so the
 * process still ends as it would have. A directory left by a process that was killed outright is removed
 * by the next build.
 */
export const repoRoot = resolve(import.meta.dirname, '..', '..');

let built: Promise<string> | undefined;

/** The path of the bundle's entry, `<dir>/dist/bin/tollgate.js` (built on the first call; later calls share it). */
export function bundledCommand(): Promise<string> {
  built ??= buildBundle();
  return built;
}

async function buildBundle(): Promise<string> {
  const [{ build }, { default: config, runtimeFiles }] = await Promise.all([
    import('rolldown'),
    import('../../rolldown.config.ts'),
  ]);
  if (Array.isArray(config.output) || !config.output)
    throw new Error('rolldown.config.ts: expected exactly one output');
  const cache = tmpdir();
  removeOrphans(cache);
  const dir = join(cache, `tollgate-bundle-${process.pid}-${randomBytes(4).toString('hex')}`);
  const remove = () => {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {}
  };
  const onSignal = (signal: NodeJS.Signals) => {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
    remove();
    if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
  };
  process.once('exit', remove);
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  try {
    mkdirSync(dir);
    copyFileSync(join(repoRoot, 'package.json'), join(dir, 'package.json'));
    for (const file of runtimeFiles) {
      mkdirSync(dirname(join(dir, file)), { recursive: true });
      symlinkSync(join(repoRoot, file), join(dir, file));
    }
    await build({
      ...config,
      cwd: repoRoot,
      logLevel: 'warn',
      output: { ...config.output, dir: join(dir, 'dist', 'bin') },
    });
  } catch (err) {
    remove();
    throw err;
  }
  const entry = join(dir, 'dist', 'bin', 'tollgate.js');
  if (!existsSync(entry)) throw new Error(`the bundle has no ${entry}`);
  return entry;
}

/** Bundles of test processes that no longer run (killed before they could remove theirs). */
function removeOrphans(cache: string): void {
  for (const name of readdirSync(cache)) {
    const pid = Number(/^tollgate-bundle-(\d+)-[0-9a-f]+$/.exec(name)?.[1]);
    if (!pid || pid === process.pid || processAlive(pid)) continue;
    rmSync(join(cache, name), { recursive: true, force: true });
  }
}
