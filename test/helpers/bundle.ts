import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

/**
 * The `tollgate` command as it ships: rolldown.config.ts's bundle, built once per test process with
 * rolldown's JavaScript API into a fresh directory (never `dist/`, which `make build` owns), removed when
 * the process exits.
 *
 * The directory lives inside the repository, under node_modules/.cache, so the bundle resolves what it
 * leaves outside itself as it does from dist/ or the image's /app/dist: bare imports
 * (`@electric-sql/pglite`) and `createRequire(import.meta.url)` lookups (`gpt-tokenizer`'s data file,
 * `yaml`) from the repository's node_modules, and src/metrics/registry.ts's walk up from
 * `import.meta.dirname` the repository's package.json. That walk (and src/dashboard/home.ts's) looks in
 * 5 directories, the chunk's own and 4 above it. Metrics live in a chunk: from
 * `<repo>/node_modules/.cache/tollgate-bundle-<random>/bin/chunks` the repository is 5 above, out of
 * reach (the build info then says version="unknown"), so the output has no `bin/` level:
 * `<repo>/node_modules/.cache/tollgate-bundle-<pid>-<random>/tollgate.js`, chunks 4 below the repository
 * (dist/bin/chunks is 3 below it, as /app/dist/bin/chunks is below /app in the image).
 *
 * Removal: on 'exit', and on SIGTERM / SIGINT, which is how vitest ends its fork workers (SIGTERM, without
 * an 'exit' event) — the signal is raised again afterwards unless someone else listens for it, so the
 * process still ends as it would have. A directory left by a process that was killed outright is removed
 * by the next build.
 */
export const repoRoot = resolve(import.meta.dirname, '..', '..');

let built: Promise<string> | undefined;

/** The path of the bundle's entry, `tollgate.js` (built on the first call; later calls share it). */
export function bundledCommand(): Promise<string> {
  built ??= buildBundle();
  return built;
}

async function buildBundle(): Promise<string> {
  const [{ build }, { default: config }] = await Promise.all([
    import('rolldown'),
    import('../../rolldown.config.ts'),
  ]);
  if (Array.isArray(config.output) || !config.output)
    throw new Error('rolldown.config.ts: expected exactly one output');
  const cache = join(repoRoot, 'node_modules', '.cache');
  mkdirSync(cache, { recursive: true });
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
    await build({ ...config, cwd: repoRoot, logLevel: 'warn', output: { ...config.output, dir } });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const entry = join(dir, 'tollgate.js');
  if (!existsSync(entry)) throw new Error(`the bundle has no ${entry}`);
  return entry;
}

/** Bundles of test processes that no longer run (killed before they could remove theirs). */
function removeOrphans(cache: string): void {
  for (const name of readdirSync(cache)) {
    const pid = Number(/^tollgate-bundle-(\d+)-[0-9a-f]+$/.exec(name)?.[1]);
    if (!pid || pid === process.pid || alive(pid)) continue;
    rmSync(join(cache, name), { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
