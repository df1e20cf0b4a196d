import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { type LoadJob, type LoadResult, type LoadTarget, runJob } from './loadgen.ts';

/**
 * What bench/proxy.ts (and bench/c1-probe.ts) share: starting and stopping the bench's processes
 * (provider, passthrough, Tollgate, Portkey, the load generator), and reading their CPU time and memory
 * from /proc.
 */
export const here = dirname(fileURLToPath(import.meta.url));
export const root = join(here, '..');
export const children: ChildProcess[] = [];
const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/test';

export interface Started {
  child: ChildProcess;
  info: Record<string, string>;
  /** stdout lines after the first. */
  lines: string[];
}

/**
 * The first line from `input` that is the script's ready line (JSON, not a log record: no `level`), or
 * an error when `child` exits first. Log lines before it go to stderr.
 */
function firstLine(reader: Interface, child: ChildProcess, what: string, lines: string[]): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    let ready = false;
    reader.on('line', (line) => {
      if (ready) lines.push(line);
      else if (isReadyLine(line)) {
        ready = true;
        resolve(line);
      } else process.stderr.write(`${what}: ${line}\n`);
    });
    child.once('exit', (code) => {
      if (!ready) reject(new Error(`${what} exited with ${code} before it was ready`));
    });
  });
}

function isReadyLine(line: string): boolean {
  try {
    const value = JSON.parse(line) as unknown;
    return typeof value === 'object' && value !== null && !('level' in value);
  } catch {
    return false;
  }
}

/** Starts a bench server script and waits for its first stdout line (JSON). */
export async function start(
  script: string,
  env: Record<string, string>,
  nodeArgs: string[] = [],
): Promise<Started> {
  const child = spawn(process.execPath, [...nodeArgs, resolve(here, script)], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  const lines: string[] = [];
  const first = await firstLine(createInterface({ input: child.stdout! }), child, script, lines);
  return { child, info: JSON.parse(first), lines };
}

/**
 * Ends a bench server with SIGTERM and resolves with its stdout lines after the ready line. For a
 * Tollgate from bench/tollgate.ts (its ready line names the schema it `served` from), it then checks the
 * ledger — every balance the sum of its entries, nothing held once the pod gave its slices back — adds
 * `{"ledger": …}` to those lines and drops the schema.
 */
export async function stop(started: {
  child: ChildProcess;
  lines?: string[];
  info?: Record<string, string>;
}) {
  if (started.child.exitCode === null && started.child.signalCode === null) {
    await new Promise<void>((resolve) => {
      started.child.once('exit', () => setImmediate(resolve));
      started.child.kill('SIGTERM');
    });
  }
  const lines = started.lines ?? [];
  const schema = started.info?.served ? started.info.schema : undefined;
  if (schema) lines.push(JSON.stringify({ ledger: await ledgerOf(schema) }));
  return lines;
}

/** The ledger check of a bench schema (see stop), which it then drops. */
async function ledgerOf(schema: string) {
  const client = new pg.Client({ connectionString: process.env.DATABASE_URL ?? DEFAULT_DATABASE_URL });
  await client.connect();
  try {
    await client.query(`SET search_path = ${pg.escapeIdentifier(schema)}`);
    const { rows } = await client.query<Record<string, string>>(`
      SELECT count(*) AS users,
             count(*) FILTER (WHERE e.balance <> coalesce(l.sum, 0) OR e.held <> coalesce(h.held, 0)) AS bad,
             sum(e.held) AS held,
             (SELECT count(*) FROM ledger_entries WHERE kind = 'charge') AS charges,
             (SELECT coalesce(-sum(amount), 0) FROM ledger_entries WHERE kind = 'charge') AS charged
      FROM end_users e
      LEFT JOIN (SELECT user_id, sum(amount) AS sum FROM ledger_entries GROUP BY user_id) l ON l.user_id = e.id
      LEFT JOIN (SELECT user_id, sum(amount) AS held FROM holds WHERE status = 'open' GROUP BY user_id) h
        ON h.user_id = e.id`);
    return rows[0];
  } finally {
    await client.query(`DROP SCHEMA IF EXISTS ${pg.escapeIdentifier(schema)} CASCADE`).catch(() => {});
    await client.end();
  }
}

/** Ends every child still running (by its own pid), on the way out. */
export function stopAll(): void {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
}

const USER_HZ = 100;

function readStat(pid: string): { name: string; cpu: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const close = stat.lastIndexOf(')');
    const fields = stat.slice(close + 2).split(' ');
    return {
      name: stat.slice(stat.indexOf('(') + 1, close),
      cpu: (Number(fields[11]) + Number(fields[12])) / USER_HZ,
    };
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) used so far by a process. */
export function cpuSeconds(pid: number): number {
  return pid ? (readStat(String(pid))?.cpu ?? 0) : 0;
}

/** CPU seconds so far of every process with that command name, by pid. */
export function cpuByPid(name: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const stat = readStat(pid);
    if (stat?.name === name) out.set(pid, stat.cpu);
  }
  return out;
}

/** CPU seconds spent since `before` by processes of that name (new ones in full; ended ones are missed). */
export function cpuSince(name: string, before: Map<string, number>): number {
  let total = 0;
  for (const [pid, cpu] of cpuByPid(name)) total += cpu - (before.get(pid) ?? 0);
  return total;
}

/** Resident set of a process now, in MB (0 when it is gone). */
export function rssOf(pid: number): number {
  try {
    const statm = readFileSync(`/proc/${pid}/statm`, 'utf8').split(' ');
    return (Number(statm[1]) * 4096) / 2 ** 20;
  } catch {
    return 0;
  }
}

/** Samples the resident set of some processes every `everyMs`, keeping each one's peak (MB). */
export function sampleRss(pids: Record<string, number>, everyMs = 100) {
  const peak: Record<string, number> = Object.fromEntries(Object.keys(pids).map((k) => [k, 0]));
  const tick = () => {
    for (const [name, pid] of Object.entries(pids)) peak[name] = Math.max(peak[name]!, rssOf(pid));
  };
  tick();
  const timer = setInterval(tick, everyMs);
  timer.unref();
  return {
    peak,
    stop() {
      clearInterval(timer);
      tick();
      return peak;
    },
  };
}

/** Asks a bench Tollgate process for a full GC and its memory afterwards (MB): resident set and V8 heap. */
export async function memoryOf(started: Started): Promise<{ rss: number; heap: number }> {
  const seen = started.lines.length;
  started.child.kill('SIGUSR2');
  for (let i = 0; i < 600; i++) {
    const line = started.lines.slice(seen).find((l) => l.includes('"memory"'));
    if (line) {
      const { memory } = JSON.parse(line) as { memory: { rss: number; heapUsed: number } };
      return { rss: Math.round(memory.rss / 2 ** 20), heap: Math.round(memory.heapUsed / 2 ** 20) };
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const { exitCode, signalCode } = started.child;
  throw new Error(
    `the Tollgate process did not report its memory${exitCode !== null || signalCode ? ` (it exited: ${exitCode ?? signalCode})` : ''}`,
  );
}

/**
 * The load generator. By default a process of its own (bench/loadgen.ts), as a real client is:
 * its event loop, GC and JIT are not the driver's. BENCH_LOADGEN=inprocess runs the same loop in this
 * process instead.
 */
export class LoadGenerator {
  private readonly child?: ChildProcess;
  private readonly lines?: AsyncIterator<string>;

  private constructor(child?: ChildProcess, lines?: AsyncIterator<string>) {
    this.child = child;
    this.lines = lines;
  }

  static async open(mode = process.env.BENCH_LOADGEN ?? 'process'): Promise<LoadGenerator> {
    if (mode === 'inprocess') return new LoadGenerator();
    if (mode !== 'process') throw new Error(`BENCH_LOADGEN must be process or inprocess, not ${mode}`);
    const child = spawn(process.execPath, [join(here, 'loadgen.ts')], {
      cwd: root,
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    children.push(child);
    const lines = createInterface({ input: child.stdout as Readable })[Symbol.asyncIterator]();
    const generator = new LoadGenerator(child, lines);
    await generator.read();
    return generator;
  }

  get pid(): number {
    return this.child?.pid ?? process.pid;
  }

  private async read(): Promise<Record<string, unknown>> {
    const { value, done } = await this.lines!.next();
    if (done) throw new Error('the load generator exited');
    return JSON.parse(value);
  }

  private write(line: string) {
    (this.child!.stdin as Writable).write(`${line}\n`);
  }

  /** Runs a job; `beforeMeasured` runs between the warm-up and the measured requests. */
  async run(job: LoadJob, beforeMeasured: () => Promise<void> | void = () => {}): Promise<LoadResult> {
    if (!this.child) return runJob(job, async () => beforeMeasured());
    this.write(JSON.stringify(job));
    await this.read();
    await beforeMeasured();
    this.write('go');
    return (await this.read()) as unknown as LoadResult;
  }

  async close(): Promise<void> {
    if (!this.child) return;
    (this.child.stdin as Writable).end();
    await stop({ child: this.child });
  }
}

const PORTKEY_VERSION = '1.15.2';
const PORTKEY_NODE_SERVER = '1.13.5';
const portkeyDir = join(here, 'portkey');
const portkeyServer = join(portkeyDir, 'node_modules/@portkey-ai/gateway/build/start-server.js');

function installedVersion(pkg: string): string | undefined {
  try {
    const file = join(portkeyDir, 'node_modules', pkg, 'package.json');
    return (JSON.parse(readFileSync(file, 'utf8')) as { version: string }).version;
  } catch {
    return undefined;
  }
}

/**
 * Installs the Portkey gateway into bench/portkey/node_modules from its own package-lock.json when it
 * is missing or not the pinned versions. No install scripts run (the gateway's own postinstall is
 * patch-package with no patches shipped).
 */
export function ensurePortkey(): void {
  if (
    existsSync(portkeyServer) &&
    installedVersion('@portkey-ai/gateway') === PORTKEY_VERSION &&
    installedVersion('@hono/node-server') === PORTKEY_NODE_SERVER
  )
    return;
  process.stdout.write(
    `Installing Portkey ${PORTKEY_VERSION} for the bench (npm ci --prefix bench/portkey, @hono/node-server ${PORTKEY_NODE_SERVER}) … `,
  );
  const began = performance.now();
  const npm = existsSync(join(dirname(process.execPath), 'npm'))
    ? join(dirname(process.execPath), 'npm')
    : 'npm';
  try {
    execFileSync(
      npm,
      ['ci', '--prefix', portkeyDir, '--ignore-scripts', '--no-audit', '--no-fund', '--loglevel=error'],
      { cwd: root, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' },
    );
  } catch (err) {
    process.stdout.write('failed\n');
    throw new Error(`npm ci --prefix bench/portkey failed: ${(err as { stderr?: string }).stderr ?? err}`);
  }
  process.stdout.write(`done in ${((performance.now() - began) / 1000).toFixed(1)} s\n`);
  if (installedVersion('@portkey-ai/gateway') !== PORTKEY_VERSION)
    throw new Error(`bench/portkey installed @portkey-ai/gateway ${installedVersion('@portkey-ai/gateway')}`);
}

/**
 * Starts the Portkey gateway (`start-server.js --headless`) on a free loopback port. It routes by
 * headers (see `portkeyHeaders`); its stdout (a start-up animation) is dropped, its stderr passed on
 * less a known warning of @hono/node-server 1.13.5 on this Node.
 */
export async function startPortkey(): Promise<Started> {
  ensurePortkey();
  const child = spawn(
    process.execPath,
    ['--import', join(portkeyDir, 'loopback.ts'), portkeyServer, '--port=0', '--headless'],
    { cwd: portkeyDir, stdio: ['ignore', 'ignore', 'pipe', 'pipe'] },
  );
  children.push(child);
  createInterface({ input: child.stderr! }).on('line', (line) => {
    if (!line.includes('Failed to find Response internal state key')) console.error(`portkey: ${line}`);
  });
  const lines: string[] = [];
  const first = await firstLine(
    createInterface({ input: child.stdio[3] as Readable }),
    child,
    'the Portkey gateway',
    lines,
  );
  return { child, info: JSON.parse(first), lines };
}

/**
 * Portkey's own way to reach an OpenAI-compatible host: `x-portkey-provider: openai` and
 * `x-portkey-custom-host` (the base URL, to which the gateway appends `/chat/completions`); the
 * Authorization header is passed on as the provider key.
 */
export function portkeyHeaders(upstreamBaseUrl: string): Record<string, string> {
  return {
    'x-portkey-provider': 'openai',
    'x-portkey-custom-host': upstreamBaseUrl,
    authorization: 'Bearer sk-bench',
  };
}

/**
 * One non-streaming and one streaming request through a target, checked: 200, the mock provider's text
 * (five ` hello` pieces) whole in the JSON answer and in the streamed deltas, and `[DONE]` at the end.
 */
export async function checkTarget(name: string, target: LoadTarget): Promise<void> {
  const expected = ' hello'.repeat(5);
  for (const stream of [false, true]) {
    const res = await fetch(`${target.origin}${target.path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...target.headers },
      body: JSON.stringify({
        model: target.model,
        user: 'user-0',
        stream,
        max_tokens: 16,
        messages: [{ role: 'user', content: 'Hello!' }],
      }),
    });
    const text = await res.text();
    let content = '';
    let done = false;
    if (res.status === 200 && !stream) {
      content = (JSON.parse(text) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message
        .content;
    } else if (res.status === 200) {
      for (const line of text.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        if (line === 'data: [DONE]') done = true;
        else content += (JSON.parse(line.slice(6)) as any).choices?.[0]?.delta?.content ?? '';
      }
    }
    if (res.status !== 200 || content !== expected || (stream && !done))
      throw new Error(
        `${name} answered a ${stream ? 'streaming' : 'non-streaming'} request with ${res.status}: ${text.slice(0, 500)}`,
      );
  }
}
