import { request } from 'node:http';

/**
 * Loaded (`--import`) into the Tollgate server bench/tollgate.ts starts. Once the server answers
 * /healthz it prints BENCH_READY (the bench's first stdout line); on SIGUSR2 it runs a full GC (the server
 * runs with --expose-gc) and prints `{"memory": {rss, heapUsed}}`. Nothing else: the server is the
 * command as shipped. Plain JavaScript: a .ts file here would load Node's type stripper into the server
 * (several MB resident: 132 MB idle in a first try with one, 117–121 MB without) — the bundle has no
 * TypeScript.
 */
const ready = JSON.parse(process.env.BENCH_READY ?? '{}');
delete process.env.BENCH_READY;
if (!ready.url) throw new Error('bench/serving-probe.mjs: BENCH_READY is not set');
const health = new URL('/healthz', ready.url);

process.on('SIGUSR2', () => {
  globalThis.gc?.();
  const { rss, heapUsed } = process.memoryUsage();
  process.stdout.write(`${JSON.stringify({ memory: { rss, heapUsed } })}\n`);
});

/** @returns {Promise<boolean>} */
function answers() {
  return new Promise((resolve) => {
    const req = request(health, { agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.once('error', () => resolve(false));
    req.end();
  });
}

// Unreferenced: a server that fails to start still exits.
let announced = false;
const poll = setInterval(async () => {
  if (announced || !(await answers()) || announced) return;
  announced = true;
  clearInterval(poll);
  process.stdout.write(`${JSON.stringify(ready)}\n`);
}, 20).unref();
