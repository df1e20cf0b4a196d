/**
 * Smoke test of the container image (scripts/image.sh runs it: `node scripts/image-smoke.ts IMAGE`).
 *
 * Every container runs as the image's user (10001), with a read-only root filesystem, a tmpfs on /tmp,
 * no capabilities and no new privileges, on the host network (Postgres on 127.0.0.1:5432, a mock
 * provider on a loopback port). It checks: `--help`; `migrate` into a database of its own; admin
 * commands; `proxy` answering /healthz and /readyz and a chat completion that goes through the mock
 * provider and is charged; `/metrics`; the documentation at /docs as HTML, with its images; a clean stop on SIGTERM; `operator --help`; `dev` on the embedded
 * database answering a chat completion with its demo key. The database is dropped at the end.
 */
import { type SpawnSyncReturns, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';

const image = process.argv[2];
if (!image) {
  console.error('usage: node scripts/image-smoke.ts IMAGE');
  process.exit(2);
}
const podman = (process.env.TOLLGATE_PODMAN ?? 'podman').split(' ');
const limits = (process.env.TOLLGATE_PODMAN_LIMITS ?? '').split(' ').filter(Boolean);
const adminUrl = process.env.TOLLGATE_SMOKE_PG ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const run = randomBytes(4).toString('hex');
const database = `tollgate_image_smoke_${run}`;
const dbUrl = new URL(adminUrl);
dbUrl.pathname = `/${database}`;
const key = randomBytes(32).toString('hex');
const names: string[] = [];

/** Flags of every Tollgate container: hardened as the Helm chart runs it. */
const hardened = [
  '--network',
  'host',
  ...limits,
  '--read-only',
  '--tmpfs',
  '/tmp:rw,nosuid,nodev,size=512m',
  '--cap-drop',
  'ALL',
  '--security-opt',
  'no-new-privileges',
];

function podmanSync(args: string[], input?: string): SpawnSyncReturns<string> {
  return spawnSync(podman[0]!, [...podman.slice(1), ...args], {
    encoding: 'utf8',
    input,
    timeout: 120_000,
    maxBuffer: 16 * 1024 * 1024,
  });
}

function check(ok: unknown, what: string, detail = ''): void {
  if (!ok) throw new Error(`${what}${detail ? `\n${detail}` : ''}`);
  console.log(`  ok  ${what}`);
}

/** `podman run --rm` of one command; returns stdout, fails with its output. */
function tollgate(args: string[], env: Record<string, string> = {}, expectCode = 0): string {
  const envFlags = Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
  const res = podmanSync(['run', '--rm', ...hardened, ...envFlags, image!, ...args]);
  if (res.status !== expectCode) {
    throw new Error(
      `tollgate ${args.join(' ')} exited ${res.status ?? res.signal} (expected ${expectCode})\n` +
        `${res.stdout}\n${res.stderr}${res.error ? `\n${res.error.message}` : ''}`,
    );
  }
  return res.stdout;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** An OpenAI-compatible provider on loopback that answers every chat completion with the same words. */
interface MockProvider {
  server: Server;
  url: string;
  calls: { authorization: string | undefined; body: Record<string, unknown> }[];
}
async function mockProvider(): Promise<MockProvider> {
  const calls: MockProvider['calls'] = [];
  const server = createServer(async (req, res) => {
    const body = JSON.parse((await readBody(req)) || '{}') as Record<string, unknown>;
    if (req.method === 'POST' && req.url === '/v1/chat/completions') {
      calls.push({ authorization: req.headers.authorization, body });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id: 'chatcmpl-smoke',
          object: 'chat.completion',
          created: Math.floor(Date.now() / 1000),
          model: body.model,
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: 'hello from the mock provider' },
              finish_reason: 'stop',
            },
          ],
          usage: { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 },
        }),
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end('{"error":{"message":"not found"}}');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return { server, url: `http://127.0.0.1:${port}/v1`, calls };
}

/** Starts a detached container; returns its name. */
function start(label: string, args: string[], env: Record<string, string>): string {
  const name = `tollgate-smoke-${label}-${run}`;
  const envFlags = Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
  const res = podmanSync(['run', '-d', '--name', name, ...hardened, ...envFlags, image!, ...args]);
  if (res.status !== 0) throw new Error(`podman run ${label} failed:\n${res.stderr}`);
  names.push(name);
  return name;
}

function logs(name: string): string {
  const res = podmanSync(['logs', name]);
  return `${res.stdout}${res.stderr}`.slice(-6000);
}

/** Polls until `path` answers 200 (bounded); returns the milliseconds it took. */
async function until200(name: string, base: string, path: string, limitMs = 60_000): Promise<number> {
  const started = Date.now();
  let last = '';
  while (Date.now() - started < limitMs) {
    try {
      const res = await fetch(`${base}${path}`, { signal: AbortSignal.timeout(2000) });
      if (res.status === 200) return Date.now() - started;
      last = `${res.status} ${await res.text()}`;
    } catch (err) {
      last = (err as Error).message;
    }
    const state = podmanSync(['inspect', '--format', '{{.State.Status}}', name]).stdout.trim();
    if (state === 'exited') throw new Error(`${name} exited before ${path} answered 200:\n${logs(name)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${path} did not answer 200 within ${limitMs / 1000} s (last: ${last}):\n${logs(name)}`);
}

interface ChatReply {
  choices?: { message?: { content?: string } }[];
}

async function chat(base: string, apiKey: string, model: string, user: string) {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, user, messages: [{ role: 'user', content: 'Hello from the smoke test' }] }),
  });
  return { status: res.status, body: (await res.json()) as ChatReply };
}

/** Stops with SIGTERM and expects a clean exit (code 0) within the grace period. */
function stopCleanly(name: string): void {
  const res = podmanSync(['stop', '-t', '20', name]);
  const code = podmanSync(['inspect', '--format', '{{.State.ExitCode}}', name]).stdout.trim();
  check(
    res.status === 0 && code === '0',
    `${name} stops on SIGTERM with exit code 0`,
    `${code}\n${logs(name)}`,
  );
}

async function main(): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  const provider = await mockProvider();
  const db = { DATABASE_URL: dbUrl.toString(), TOLLGATE_ENCRYPTION_KEY: key };
  try {
    await admin.query(`CREATE DATABASE ${database}`);

    const config = JSON.parse(
      podmanSync(['image', 'inspect', '--format', '{{json .Config}}', image!]).stdout,
    ) as {
      User?: string;
    };
    check(config.User === '10001:10001', 'the image runs as user 10001:10001', String(config.User));
    const trimmed = podmanSync([
      'run',
      '--rm',
      ...hardened,
      '--entrypoint',
      'sh',
      image!,
      '-c',
      'id -u; command -v npm || true; ls /usr/local/include 2>/dev/null || true; touch /app/x 2>&1 || true',
    ]).stdout.trim();
    check(
      trimmed.startsWith('10001\n') && !trimmed.includes('npm') && trimmed.includes('Read-only file system'),
      'uid 10001, no npm or C headers, the root filesystem read-only',
      trimmed,
    );

    const help = tollgate(['--help']);
    check(help.includes('Usage: tollgate <command>') && help.includes('proxy'), 'tollgate --help');

    const migrated = JSON.parse(tollgate(['migrate', '--json'], db)) as { applied: string[] };
    check(migrated.applied.length > 0, `tollgate migrate applied ${migrated.applied.length} migrations`);
    const again = JSON.parse(tollgate(['migrate', '--json'], db)) as { applied: string[] };
    check(again.applied.length === 0, 'a second migrate has nothing to do');

    const project = JSON.parse(
      tollgate(
        [
          'project',
          'create',
          '--name',
          'Smoke',
          '--currency',
          'usd',
          '--upstream-url',
          provider.url,
          '--upstream-key',
          'sk-smoke',
          '--json',
        ],
        db,
      ),
    ) as { id: string; apiKey: string };
    check(project.id.startsWith('pw_') && project.apiKey, `tollgate project create → ${project.id}`);
    const pricing =
      'currency: usd\nmodels:\n  - id: smoke-model\n    pricing: { mode: per_request, perRequest: "0.25" }\n';
    const envFlags = Object.entries(db).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
    const applied = podmanSync(
      [
        'run',
        '--rm',
        '-i',
        ...hardened,
        ...envFlags,
        '--entrypoint',
        'sh',
        image!,
        '-c',
        'cat > /tmp/pricing.yaml && exec node /app/dist/bin/tollgate.js models apply --project "$0" --file /tmp/pricing.yaml',
        project.id,
      ],
      pricing,
    );
    check(applied.status === 0, 'tollgate models apply', `${applied.stdout}${applied.stderr}`);
    tollgate(['users', 'connect', '--project', project.id, '--user', 'smoke-user'], db);
    tollgate(['users', 'deposit', '--project', project.id, '--user', 'smoke-user', '--amount', '1.00'], db);
    check(true, 'tollgate users connect / users deposit');

    // The proxy, read-only as uid 10001, against Postgres.
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    const startedAt = Date.now();
    const proxy = start('proxy', ['proxy'], {
      ...db,
      // The mock provider listens on loopback.
      TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
      HOST: '127.0.0.1',
      PORT: String(port),
      PUBLIC_BASE_URL: base,
    });
    await until200(proxy, base, '/healthz');
    const healthy = Date.now() - startedAt;
    await until200(proxy, base, '/readyz');
    check(
      true,
      `proxy: /healthz 200 ${healthy} ms after podman run, /readyz 200 after ${Date.now() - startedAt} ms`,
    );

    const served = await chat(base, project.apiKey, 'smoke-model', 'smoke-user');
    check(
      served.status === 200 && served.body.choices?.[0]?.message?.content === 'hello from the mock provider',
      'a chat completion through the proxy reaches the mock provider and comes back',
      JSON.stringify(served),
    );
    check(
      provider.calls.length === 1 && provider.calls[0]!.authorization === 'Bearer sk-smoke',
      'the provider got the request with the project’s upstream key',
      JSON.stringify(provider.calls),
    );
    const balance = await fetch(`${base}/v1/user/balance?user=smoke-user`, {
      headers: { authorization: `Bearer ${project.apiKey}` },
    });
    const balanceBody = (await balance.json()) as { balance?: string };
    check(
      balanceBody.balance === '0.75',
      'the request was charged (balance 1.00 → 0.75)',
      JSON.stringify(balanceBody),
    );
    const refused = await chat(base, project.apiKey, 'smoke-model', 'stranger');
    check(
      refused.status === 200 && String(refused.body.choices?.[0]?.message?.content).includes('/connect/'),
      'an unconnected user gets the connect link as an assistant message',
      JSON.stringify(refused),
    );
    const metrics = await (await fetch(`${base}/metrics`)).text();
    check(
      /tollgate_requests_total\{[^}]*decision="allowed"[^}]*\} 1/.test(metrics) &&
        metrics.includes('tollgate_build_info'),
      '/metrics counts the request',
    );
    const docs = await fetch(`${base}/docs/api`);
    const docsPage = await docs.text();
    const picture = await fetch(`${base}/docs/dashboard-api-key.png`);
    check(
      docs.status === 200 &&
        docsPage.includes('<h1 id="api">') &&
        picture.status === 200 &&
        (await picture.arrayBuffer()).byteLength > 1000,
      '/docs serves the pages (docs/*.md) as HTML and their images',
      `${docs.status} ${picture.status}`,
    );
    stopCleanly(proxy);

    const operatorHelp = tollgate(['operator', '--help']);
    check(operatorHelp.includes('operator'), 'tollgate operator --help');

    // dev: the embedded database on the /tmp tmpfs, the demo project and its key.
    const devPort = await freePort();
    const devBase = `http://127.0.0.1:${devPort}`;
    const devStarted = Date.now();
    const dev = start('dev', ['dev'], { HOST: '127.0.0.1', PORT: String(devPort) });
    await until200(dev, devBase, '/healthz', 120_000);
    let devLog = logs(dev);
    for (let i = 0; i < 50 && !devLog.includes('API key:'); i++) {
      await new Promise((r) => setTimeout(r, 100));
      devLog = logs(dev);
    }
    const apiKey = /API key:\s+(\S+)/.exec(devLog)?.[1];
    check(apiKey, `dev: healthy after ${Date.now() - devStarted} ms, printed its demo key`, devLog);
    const demo = await chat(devBase, apiKey!, 'demo-echo', 'demo-user');
    check(
      demo.status === 200 && demo.body.choices?.[0]?.message,
      'dev: a chat completion with the demo key',
      JSON.stringify(demo),
    );
    stopCleanly(dev);
  } finally {
    for (const name of names) podmanSync(['rm', '-f', '-t', '0', name]);
    provider.server.close();
    await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`).catch(() => {});
    await admin.end();
  }
}

main().then(
  () => console.log('image smoke test: all checks passed'),
  (err: Error) => {
    console.error(`image smoke test FAILED: ${err.message}`);
    process.exitCode = 1;
  },
);
