import { execFileSync, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { Pool } from 'undici';

const root = '/work/main/bench';
async function start(script, env) {
  const child = spawn(process.execPath, [`${root}/${script}`], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const line = await new Promise((r) => createInterface({ input: child.stdout }).once('line', r));
  return { child, info: JSON.parse(line) };
}
const up = await start('upstream.ts', {});
const tg = await start('tollgate.ts', { UPSTREAM: up.info.baseUrl, BENCH_USERS: '50' });
const pool = new Pool(tg.info.url, { connections: 8 });
const send = async (n, stream) => {
  let i = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (i < n) {
        const k = i++;
        const res = await pool.request({
          method: 'POST',
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${tg.info.apiKey}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'bench-model',
            user: `user-${k % 50}`,
            stream,
            messages: [{ role: 'user', content: 'hi' }],
          }),
        });
        await res.body.text();
      }
    }),
  );
};
await send(500, true);
const strace = spawn(
  'strace',
  ['-c', '-f', '-e', 'trace=write,writev,sendto,sendmsg', '-p', String(tg.child.pid)],
  { stdio: ['ignore', 'ignore', 'pipe'] },
);
let out = '';
strace.stderr.on('data', (d) => (out += d));
await new Promise((r) => setTimeout(r, 1000));
await send(Number(process.env.N ?? 2000), process.env.STREAM === '1');
strace.kill('SIGINT');
await new Promise((r) => strace.once('exit', r));
console.log(
  out
    .split('\n')
    .filter((l) => /calls|write|send|total/.test(l))
    .join('\n'),
);
await pool.close();
tg.child.kill('SIGTERM');
up.child.kill('SIGTERM');
