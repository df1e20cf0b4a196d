import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { start, stop, stopAll } from './harness.ts';

/**
 * `npm run bench:profile`: where a Tollgate process spends its CPU on charged requests. Starts the
 * benchmark's provider and Tollgate (bench/upstream.ts, bench/tollgate.ts) with `--cpu-prof`, sends
 * PROFILE_REQUESTS (default 20000) per-token chat requests at concurrency PROFILE_CONCURRENCY (16) — half streamed, or all
 * (PROFILE_STREAM=1) or none (PROFILE_STREAM=0) — then
 * stops Tollgate and prints the self time by function and by module (a package of node_modules, a
 * folder of src/, or Node's own), heaviest first; then by function again without idle time and the
 * system calls that write to sockets (wall time the kernel and the scheduler take, not Tollgate's code).
 */
const REQUESTS = Number(process.env.PROFILE_REQUESTS ?? 20_000);
const CONCURRENCY = Number(process.env.PROFILE_CONCURRENCY ?? 16);

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

function moduleOf(url: string, name: string): string {
  if (!url) return name.startsWith('(') ? name : '(native)';
  const nm = url.lastIndexOf('node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + 13).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const src = url.indexOf('/src/');
  if (src >= 0) return `src/${url.slice(src + 5).split('/')[0]}`;
  if (url.startsWith('node:')) return url;
  return url.split('/').slice(-2).join('/');
}

async function main() {
  const profDir = mkdtempSync(join(tmpdir(), 'tollgate-profile-'));
  const upstream = await start('upstream.ts', {});
  // From source: the profile names src/ files and packages, which the bundle's chunks would hide.
  const tollgate = await start(
    'tollgate.ts',
    { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: '200', BENCH_FROM: 'source' },
    [
      '--cpu-prof',
      `--cpu-prof-dir=${profDir}`,
      '--max-semi-space-size=16', // as the image runs it (Dockerfile)
    ],
  );
  const pool = new Pool(tollgate.info.url!, { connections: CONCURRENCY, pipelining: 1 });
  let sent = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (sent < REQUESTS) {
        const i = sent++;
        const res = await pool.request({
          method: 'POST',
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${tollgate.info.apiKey}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'bench-model',
            user: `user-${i % 200}`,
            stream:
              process.env.PROFILE_STREAM === undefined ? i % 2 === 1 : process.env.PROFILE_STREAM === '1',
            messages: [{ role: 'user', content: 'Say hello to the benchmark' }],
          }),
        });
        await res.body.text();
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const metrics = await (await fetch(`${tollgate.info.url}/metrics`)).text();
  const sample = (name: string, statement: string) =>
    Number(metrics.match(new RegExp(`^${name}\\{statement="${statement}"\\} (\\S+)`, 'm'))?.[1] ?? 0);
  const batches = ['take', 'apply'].map((statement) => {
    const count = sample('tollgate_billing_batch_size_count', statement);
    const size = sample('tollgate_billing_batch_size_sum', statement) / count;
    const ms = (1000 * sample('tollgate_billing_batch_duration_seconds_sum', statement)) / count;
    return `${statement}: ${count} batches, ${size.toFixed(1)} requests and ${ms.toFixed(2)} ms each on average`;
  });
  await pool.close();
  await stop(tollgate);
  await stop(upstream);

  // The set-up process writes a profile too as it becomes the server (execve); the server's ends last.
  type Profile = { nodes: ProfileNode[]; startTime: number; endTime: number; samples: number[] };
  const profiles = readdirSync(profDir)
    .filter((f) => f.endsWith('.cpuprofile'))
    .map((f) => JSON.parse(readFileSync(join(profDir, f), 'utf8')) as Profile);
  if (!profiles.length) throw new Error('no profile was written');
  const profile = profiles.reduce((a, b) => (b.endTime > a.endTime ? b : a));
  const total = profile.samples.length;
  const byFunction = new Map<string, number>();
  const byModule = new Map<string, number>();
  for (const node of profile.nodes) {
    const hits = node.hitCount ?? 0;
    if (!hits) continue;
    const { functionName, url, lineNumber } = node.callFrame;
    const name = functionName || '(anonymous)';
    const where = url
      ? `${url.replace(/^file:\/\/.*?\/(node_modules|src|bench|test)\//, '$1/')}:${lineNumber + 1}`
      : '';
    const key = `${name} ${where}`.trim();
    byFunction.set(key, (byFunction.get(key) ?? 0) + hits);
    const mod = moduleOf(url, name);
    byModule.set(mod, (byModule.get(mod) ?? 0) + hits);
  }
  const idle = (byFunction.get('(idle)') ?? 0) / total;
  const pct = (n: number) => `${((100 * n) / total).toFixed(1)} %`;
  console.log(
    `${REQUESTS} requests in ${seconds.toFixed(1)} s at concurrency ${CONCURRENCY} (${process.env.PROFILE_STREAM === '1' ? 'all' : process.env.PROFILE_STREAM === '0' ? 'none' : 'half'} streamed); ${total} samples, idle ${(100 * idle).toFixed(1)} %`,
  );
  console.log(`Billing statements: ${batches.join('; ')}`);
  console.log('\nSelf time by module (share of all samples):');
  for (const [mod, hits] of [...byModule].sort((a, b) => b[1] - a[1]).slice(0, 20)) {
    console.log(`  ${pct(hits).padStart(7)}  ${mod}`);
  }
  console.log('\nSelf time by function:');
  for (const [fn, hits] of [...byFunction].sort((a, b) => b[1] - a[1]).slice(0, 30)) {
    console.log(`  ${pct(hits).padStart(7)}  ${fn}`);
  }
  // The sampler counts wall time: a write to a socket (writev, …) is mostly the kernel's loopback work
  // and time the process waited for a CPU, not the process's own computation. Without those and idle:
  const waits = new Set(['(idle)', 'writev', 'writeUtf8String', 'writeLatin1String', 'writeBuffer', 'read']);
  let waited = 0;
  for (const [fn, hits] of byFunction) if (waits.has(fn.split(' ')[0]!)) waited += hits;
  const busy = total - waited;
  console.log(
    `\nSelf time by function, as a share of the ${busy} samples left without idle and system calls (${((100 * busy) / total).toFixed(1)} % of all):`,
  );
  for (const [fn, hits] of [...byFunction]
    .filter(([fn]) => !waits.has(fn.split(' ')[0]!))
    .sort((a, b) => b[1] - a[1])
    .slice(0, 30)) {
    console.log(`  ${`${((100 * hits) / busy).toFixed(1)} %`.padStart(7)}  ${fn}`);
  }
  console.log(`\nProfiles: ${profDir}`);
}

await main().finally(stopAll);
