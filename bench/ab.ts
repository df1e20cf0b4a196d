import os from 'node:os';
import { join } from 'node:path';
import { cpuByPid, cpuSeconds, cpuSince, LoadGenerator, type Started, start, stop } from './harness.ts';

/**
 * `node bench/ab.ts <other checkout>`: this checkout's Tollgate against another's (a git worktree of
 * an earlier commit, say), side by side in the same minutes: rounds that alternate between the two, so
 * the machine's other load falls on both alike. Prints each cell's requests per second, p50 and the
 * Tollgate process's CPU per request, per side, as the median over the rounds; then, per cell, in how
 * many rounds this side served more and spent less CPU than the other in the same round, with each
 * side's range of requests per second.
 *
 * Knobs: AB_CELLS (comma-separated `stream:concurrency`, default `false:1,false:16,true:16,false:64`),
 * AB_ROUNDS (5), AB_REQUESTS per cell and round (3000; 600 at concurrency 1), BENCH_USERS (200),
 * AB_THIS_ENV / AB_OTHER_ENV (JSON objects of environment variables for one side).
 */
const other = process.argv[2];
if (!other) throw new Error('usage: node bench/ab.ts <path of the other checkout>');
const ROUNDS = Number(process.env.AB_ROUNDS ?? 5);
const REQUESTS = Number(process.env.AB_REQUESTS ?? 3000);
const USERS = Number(process.env.BENCH_USERS ?? 200);
const CELLS = (process.env.AB_CELLS ?? 'false:1,false:16,true:16,false:64').split(',').map((c) => {
  const [stream, concurrency] = c.split(':');
  return { stream: stream === 'true', concurrency: Number(concurrency) };
});

const upstream = await start('upstream.ts', {});
const env = { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: String(USERS) };
const nodeArgs = ['--max-semi-space-size=16'];
const envOf = (name: string): Record<string, string> => JSON.parse(process.env[name] || '{}');
const sides: Array<[string, Started]> = [
  ['this', await start('tollgate.ts', { ...env, ...envOf('AB_THIS_ENV') }, nodeArgs)],
  ['other', await start(join(other, 'bench/tollgate.ts'), { ...env, ...envOf('AB_OTHER_ENV') }, nodeArgs)],
];
const gen = await LoadGenerator.open();
const targetOf = (s: Started) => ({
  origin: s.info.url!,
  path: '/v1/chat/completions',
  headers: { authorization: `Bearer ${s.info.apiKey}` },
  model: 'bench-model',
});
for (const [, s] of sides)
  for (const stream of [false, true])
    await gen.run({ target: targetOf(s), concurrency: 16, stream, total: 1, warmup: 3000, users: USERS });
console.log(
  `load average at start: ${os
    .loadavg()
    .map((v) => v.toFixed(2))
    .join(', ')}`,
);
const results = new Map<string, Array<{ rps: number; p50: number; cpu: number; pgCpu: number }>>();
for (let round = 0; round < ROUNDS; round++) {
  for (const cell of CELLS) {
    const order = round % 2 ? [...sides].reverse() : sides;
    for (const [name, s] of order) {
      const total = cell.concurrency === 1 ? Math.round(REQUESTS / 5) : REQUESTS;
      const before = cpuSeconds(s.child.pid!);
      const pgBefore = cpuByPid('postgres');
      const r = await gen.run({
        target: targetOf(s),
        ...cell,
        total,
        warmup: Math.round(total / 10),
        users: USERS,
      });
      const sent = total + Math.round(total / 10);
      const cpu = ((cpuSeconds(s.child.pid!) - before) * 1000) / sent;
      const pgCpu = (cpuSince('postgres', pgBefore) * 1000) / sent;
      if (r.errors) console.log(`${name}: ${r.errors} errors (${r.firstError})`);
      const key = `${cell.stream ? 'stream ' : 'plain  '} c=${String(cell.concurrency).padStart(2)} ${name}`;
      results.set(key, [...(results.get(key) ?? []), { rps: r.rps, p50: r.p50, cpu, pgCpu }]);
    }
  }
}
const median = (v: number[]) => v.sort((a, b) => a - b)[v.length >> 1]!;
for (const [key, rs] of results)
  console.log(
    `${key.padEnd(20)} ${median(rs.map((r) => r.rps))
      .toFixed(0)
      .padStart(
        6,
      )} req/s  p50 ${median(rs.map((r) => r.p50)).toFixed(2)} ms  cpu/req ${median(rs.map((r) => r.cpu)).toFixed(3)} ms + postgres ${median(rs.map((r) => r.pgCpu)).toFixed(3)} ms`,
  );
// Round by round (each round runs both sides back to back, so the machine's drift falls on both alike):
// in how many rounds this side served more and spent less CPU per request.
for (const [key, ours] of results) {
  if (!key.endsWith(' this')) continue;
  const theirs = results.get(`${key.slice(0, -' this'.length)} other`) ?? [];
  const rounds = Math.min(ours.length, theirs.length);
  let faster = 0;
  let leaner = 0;
  for (let i = 0; i < rounds; i++) {
    if (ours[i]!.rps > theirs[i]!.rps) faster++;
    if (ours[i]!.cpu < theirs[i]!.cpu) leaner++;
  }
  const range = (v: number[], digits: number) =>
    `${Math.min(...v).toFixed(digits)}–${Math.max(...v).toFixed(digits)}`;
  console.log(
    `${key.slice(0, -' this'.length).trim()}: this side served more in ${faster} of ${rounds} rounds and spent less Node CPU per request in ${leaner} (req/s this ${range(
      ours.map((r) => r.rps),
      0,
    )}, other ${range(
      theirs.map((r) => r.rps),
      0,
    )})`,
  );
}
console.log(
  `load average at end: ${os
    .loadavg()
    .map((v) => v.toFixed(2))
    .join(', ')}`,
);
await gen.close();
await Promise.all([upstream, ...sides.map(([, s]) => s)].map((s) => stop(s)));
