import { spawn } from 'node:child_process';
import os from 'node:os';
import { children, cpuSeconds, LoadGenerator, type Started, start, stop, stopAll } from './harness.ts';
import { type LoadTarget, percentile } from './loadgen.ts';

/**
 * `node bench/c1-probe.ts`: what a sequential client sees through Tollgate — the question of issue 27's
 * "+2.86 ms against +1.66 ms". Starts the provider and a fresh Tollgate as bench/proxy.ts does (a second
 * one without Redis with PROBE_NO_REDIS=1), then sends rounds of non-streaming requests at concurrency 1.
 * Each round goes through every variant in turn — direct; Tollgate with bodies naming BENCH_USERS users
 * in turn and with 200; from a load generator in a process of its own and from one in this process;
 * Tollgate without Redis; with every core kept busy by a lowest-priority spinner (`+spin`) — so that the machine's other load falls on every variant alike. Prints each
 * round's p50 per variant (and the CPU milliseconds per request of the process answering it) with the time since Tollgate started, then the median of the rounds' p50s
 * and the p50 of all requests per variant. No warm-up unless PROBE_WARMUP: the first rounds are the
 * first requests Tollgate ever served.
 *
 * Knobs: PROBE_ROUNDS (default 12), PROBE_REQUESTS per round and variant (500), PROBE_WARMUP (0),
 * PROBE_VARIANTS (comma-separated labels, default all), BENCH_USERS (1000), PROBE_NO_REDIS=1,
 * PROBE_STREAM=1 (the rounds streamed, the warm-up not).
 */
const ROUNDS = Number(process.env.PROBE_ROUNDS ?? 12);
const PER_ROUND = Number(process.env.PROBE_REQUESTS ?? 500);
const USERS = Number(process.env.BENCH_USERS ?? 1000);
const WARMUP = Number(process.env.PROBE_WARMUP ?? 0);
/** The rounds streaming (latency to the first byte); the warm-up is never streamed. */
const STREAM = process.env.PROBE_STREAM === '1';
const ms = (v: number) => v.toFixed(2);

interface Variant {
  label: string;
  target: 'direct' | 'tollgate' | 'tollgate-no-redis';
  users: number;
  loadgen: 'process' | 'inprocess';
  /** Keep every core busy with a lowest-priority spinning process meanwhile (no core ever idle). */
  spin?: boolean;
}

/** One nice-19 busy loop per core: any other process preempts it, but no core goes idle. */
function spinners() {
  const procs = os.cpus().map(() => {
    const child = spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' });
    children.push(child);
    os.setPriority(child.pid!, 19);
    return child;
  });
  return () =>
    Promise.all(procs.map((child) => new Promise((resolve) => child.once('exit', resolve).kill('SIGKILL'))));
}

async function main() {
  const noRedis = process.env.PROBE_NO_REDIS === '1';
  const all: Variant[] = [
    { label: 'direct', target: 'direct', users: USERS, loadgen: 'process' },
    { label: `tollgate ${USERS}u process`, target: 'tollgate', users: USERS, loadgen: 'process' },
    { label: 'tollgate 200u process', target: 'tollgate', users: 200, loadgen: 'process' },
    { label: `tollgate ${USERS}u inprocess`, target: 'tollgate', users: USERS, loadgen: 'inprocess' },
    { label: 'tollgate 200u inprocess', target: 'tollgate', users: 200, loadgen: 'inprocess' },
    { label: 'direct +spin', target: 'direct', users: USERS, loadgen: 'process', spin: true },
    {
      label: `tollgate ${USERS}u process +spin`,
      target: 'tollgate',
      users: USERS,
      loadgen: 'process',
      spin: true,
    },
    ...(noRedis
      ? [
          {
            label: 'no-redis 200u process',
            target: 'tollgate-no-redis' as const,
            users: 200,
            loadgen: 'process' as const,
          },
        ]
      : []),
  ];
  const wanted = process.env.PROBE_VARIANTS?.split(',').map((s) => s.trim());
  const variants = all.filter(
    (v, i) => (!wanted || wanted.includes(v.label)) && all.findIndex((w) => w.label === v.label) === i,
  );
  console.log(
    `load ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(
        ' ',
      )}; ${PER_ROUND} requests per round and variant${STREAM ? ', streaming' : ''}; warm-up ${WARMUP}`,
  );
  const upstream = await start('upstream.ts', {});
  const tollgates: Record<string, Started> = {
    tollgate: await start('tollgate.ts', { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: String(USERS) }),
  };
  if (noRedis)
    tollgates['tollgate-no-redis'] = await start('tollgate.ts', {
      UPSTREAM: upstream.info.baseUrl!,
      BENCH_USERS: String(USERS),
      REDIS_URL: '',
    });
  const startedAt = performance.now();
  const base = new URL(upstream.info.baseUrl!);
  const targetOf = (name: Variant['target']): LoadTarget =>
    name === 'direct'
      ? { origin: base.origin, path: `${base.pathname}/chat/completions`, headers: {}, model: 'mock-model' }
      : {
          origin: tollgates[name]!.info.url!,
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${tollgates[name]!.info.apiKey}` },
          model: 'bench-model',
        };
  const generators = {
    process: await LoadGenerator.open('process'),
    inprocess: await LoadGenerator.open('inprocess'),
  };
  const job = (v: Variant, total: number, warmup = 0) => ({
    target: targetOf(v.target),
    concurrency: 1,
    stream: STREAM && !warmup,
    total,
    warmup,
    users: v.users,
    series: true,
  });
  for (const name of Object.keys(tollgates))
    if (WARMUP)
      await generators.process.run(
        job({ label: '', target: name as Variant['target'], users: USERS, loadgen: 'process' }, 1, WARMUP),
      );
  const p50s = new Map<string, number[]>(variants.map((v) => [v.label, []]));
  const latencies = new Map<string, number[]>(variants.map((v) => [v.label, []]));
  for (let round = 1; round <= ROUNDS; round++) {
    const at = (performance.now() - startedAt) / 1000;
    const parts: string[] = [];
    for (const v of variants) {
      const pid = v.target === 'direct' ? upstream.child.pid! : tollgates[v.target]!.child.pid!;
      const cpuBefore = cpuSeconds(pid);
      const stopSpinning = v.spin ? spinners() : undefined;
      const r = await generators[v.loadgen].run(job(v, PER_ROUND));
      await stopSpinning?.();
      const cpu = ((cpuSeconds(pid) - cpuBefore) * 1000) / PER_ROUND;
      p50s.get(v.label)!.push(r.p50);
      latencies.get(v.label)!.push(...r.latencies!);
      parts.push(`${v.label} ${ms(r.p50)} (cpu ${ms(cpu)})${r.errors ? ` (${r.errors} errors)` : ''}`);
    }
    console.log(
      `round ${String(round).padStart(2)} at ${at.toFixed(0).padStart(4)} s: p50 ${parts.join(', ')}`,
    );
  }
  console.log("\nover all rounds (median of the rounds' p50 / p50 of all requests / mean, ms):");
  for (const v of variants) {
    const sorted = p50s
      .get(v.label)!
      .slice()
      .sort((a, b) => a - b);
    const each = latencies
      .get(v.label)!
      .slice()
      .sort((a, b) => a - b);
    const mean = each.reduce((a, b) => a + b, 0) / each.length;
    console.log(
      `  ${v.label.padEnd(26)} ${ms(percentile(sorted, 0.5))} / ${ms(percentile(each, 0.5))} / ${ms(mean)}`,
    );
  }
  await generators.process.close();
  for (const t of Object.values(tollgates)) await stop(t);
  await stop(upstream);
}

main()
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(stopAll);
