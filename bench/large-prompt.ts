/**
 * Large prompts through a real Tollgate: `node bench/large-prompt.ts [sizes…]`. Starts the benchmark's
 * provider (bench/upstream.ts) and Tollgate (bench/tollgate.ts, a per-token model, connected users) as
 * child processes, then sends one prompt per size — a single run of one letter (the worst case of a
 * quadratic BPE merge) — for a connected user and for a user who is not connected, while this process polls
 * Tollgate's /healthz every 10 ms. Prints per request: the time to the answer, the CPU time the Tollgate
 * process spent, and the worst /healthz latency meanwhile (Tollgate's event-loop lag as a client sees it).
 * Default sizes: 50 KB, 1 MB, 4 MB (BODY_LIMIT_BYTES allows 4 MiB). `BENCH_TIMEOUT_MS` (default
 * 120 000) bounds one request.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { start, stop, stopAll } from './harness.ts';

const sizes = process.argv.slice(2).map(Number);
if (!sizes.length) sizes.push(50_000, 1_000_000, 4_000_000);
const timeoutMs = Number(process.env.BENCH_TIMEOUT_MS ?? 120_000);
/** CPU time (user + system) of a process so far, in ms. */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

async function main() {
  console.log(
    `load average ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(', ')}; ${os.cpus().length} CPUs; Node ${process.version}`,
  );
  const upstream = await start('upstream.ts', {});
  const tollgate = await start('tollgate.ts', { UPSTREAM: upstream.info.baseUrl!, BENCH_USERS: '2' });
  const { url, apiKey } = tollgate.info as { url: string; apiKey: string };
  const pid = tollgate.child.pid!;
  // Warm-up: the first request loads the project and compiles the hot paths.
  for (const user of ['user-1', 'not-connected']) {
    await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'bench-model', user, messages: [{ role: 'user', content: 'Hello' }] }),
    }).then((res) => res.arrayBuffer());
  }
  for (const size of sizes) {
    for (const user of ['user-0', 'not-connected']) {
      const body = JSON.stringify({
        model: 'bench-model',
        user,
        // A different letter per user: gpt-tokenizer caches the pieces it merged.
        messages: [{ role: 'user', content: (user === 'user-0' ? 'a' : 'b').repeat(size) }],
      });
      let worst = 0;
      let healthFailures = 0;
      let polling = true;
      const poll = (async () => {
        while (polling) {
          const t = performance.now();
          try {
            await (await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(timeoutMs) })).arrayBuffer();
          } catch {
            healthFailures++;
          }
          worst = Math.max(worst, performance.now() - t);
          await new Promise((r) => setTimeout(r, 10));
        }
      })();
      const cpu = cpuMs(pid);
      const started = performance.now();
      let outcome: string;
      try {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
          body,
          signal: AbortSignal.timeout(timeoutMs),
        });
        const json = (await res.json()) as any;
        outcome = `${res.status} ${res.headers.get('x-tollgate-paywall') ?? (json.choices ? 'answered' : json.error?.code)}`;
      } catch (err) {
        outcome = `no answer within ${timeoutMs} ms (${(err as Error).name})`;
      }
      const elapsed = performance.now() - started;
      polling = false;
      await poll;
      console.log(
        `${(size / 1000).toLocaleString('en')} KB, ${user}: ${outcome} in ${elapsed.toFixed(0)} ms; Tollgate CPU ${(cpuMs(pid) - cpu).toFixed(0)} ms; /healthz worst ${worst.toFixed(0)} ms${healthFailures ? ` (${healthFailures} failed)` : ''}`,
      );
    }
  }
  await stop(tollgate);
  await stop(upstream);
}

main()
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(stopAll);
