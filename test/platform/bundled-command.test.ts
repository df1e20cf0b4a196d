import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { findWallet } from '../../src/billing/ledger.ts';
import { Money } from '../../src/core/money.ts';
import { tokenCost } from '../../src/metering/cost.ts';
import { getProject } from '../../src/projects/service.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';
import { countPromptTokens } from '../../src/tokens/inputs.ts';
import { connectUser } from '../../src/users/service.ts';
import { bundledCommand, repoRoot } from '../helpers/bundle.ts';
import { chargedTotal, ledgerEntriesOf } from '../helpers/chat-fixture.ts';
import { childEnv, createTestContext, newTestId, pgQuery, realPostgres } from '../helpers/context.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { seedProject } from '../helpers/server.ts';

/**
 * The `tollgate` command as the image ships it — rolldown's bundle (rolldown.config.ts), run as
 * `node --max-semi-space-size=16 tollgate.js` — as a real process on loopback: what bundling can break only
 * shows at run time (CommonJS dependencies, files read beside import.meta.url, dynamic imports of the
 * commands' chunks), so it serves a paid chat completion end to end and stops on SIGTERM.
 */

const run = promisify(execFile);
const { version } = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
/** As the image runs it (Dockerfile). */
const NODE_FLAGS = ['--max-semi-space-size=16'];

let command: string;

beforeAll(async () => {
  command = await bundledCommand();
});

describe('the bundled command', () => {
  it('--help exits 0 and lists the commands', async () => {
    const { stdout } = await run(process.execPath, [...NODE_FLAGS, command, '--help'], {
      env: { PATH: process.env.PATH ?? '' },
      timeout: 20_000,
    });
    expect(stdout).toMatch(/^\s+proxy \[--migrate\]/m);
    expect(stdout).toMatch(/^\s+operator\b/m);
  });
});

const IN = '1000';
const OUT = '2000';
/** The mock upstream reports 12 prompt and 5 completion tokens (` hello` × 5). */
const PER_REQUEST = new Money(12).times(IN).plus(new Money(5).times(OUT)).div(1e6).toFixed();
const messages = [{ role: 'user' as const, content: 'Say hello' }];
const MARGIN = '1.1';
/**
 * What each request holds: the prompt as o200k counts it (gpt-tokenizer's data file, which the bundle
 * finds through createRequire), with the margin, plus the project's completion bound of 100 — computed
 * here from source, so the bundle's count must be the same.
 */
const HOLD = tokenCost(
  { inputPerMillion: new Money(IN), outputPerMillion: new Money(OUT) },
  promptTokensUpperBound(countPromptTokens({ model: 'x', messages }), MARGIN),
  100,
);

describe.skipIf(!realPostgres)('the bundled `tollgate proxy --migrate` on a fresh schema', () => {
  const id = newTestId();
  const schema = `tgt_${id}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'tollgate-bundled-'));
  let mock: MockUpstream;
  let proxy: ChildProcess;
  let exited: Promise<number | null>;
  const output: string[] = [];
  let base: string;
  let proxyEnv: Record<string, string>;
  /** The test's own context on the proxy's schema: it seeds the project and reads the ledger. */
  let ctx: AppContext;

  beforeAll(async () => {
    mock = await startMockUpstream();
    await pgQuery(`CREATE SCHEMA ${schema}`);
    proxyEnv = {
      ...childEnv(schema, dataDir),
      HOME: dataDir,
      HOST: '127.0.0.1',
      PORT: '0',
      LOG_LEVEL: 'info',
      // The mock provider listens on loopback.
      TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
      // A hold per request, given back as it settles (as test/helpers/context.ts).
      ESCROW_IDLE_MS: '0',
      ESCROW_SLICE_REQUESTS: '1',
    };
    proxy = spawn(process.execPath, [...NODE_FLAGS, command, 'proxy', '--migrate'], {
      env: proxyEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    exited = new Promise((resolve) => proxy.once('exit', (code) => resolve(code)));
    createInterface({ input: proxy.stderr! }).on('line', (l) => output.push(l));
    base = await new Promise<string>((resolve, reject) => {
      const fail = (why: string) => reject(new Error(`${why}; output:\n${output.join('\n')}`));
      const timer = setTimeout(() => fail('the proxy did not announce its address within 20 s'), 20_000);
      proxy.once('exit', (code, signal) => {
        clearTimeout(timer);
        fail(`the proxy exited (${code ?? signal}) before listening`);
      });
      createInterface({ input: proxy.stdout! }).on('line', (line) => {
        output.push(line);
        const match = /listening on (http:\/\/127\.0\.0\.1:\d+) /.exec(line);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]!);
        }
      });
    });
  });

  afterAll(async () => {
    if (proxy && proxy.exitCode === null && proxy.signalCode === null) {
      proxy.kill('SIGKILL');
      await exited;
    }
    await ctx?.close();
    await mock?.close();
    await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('migrates the schema itself and serves /healthz, /readyz and /metrics with its version', async () => {
    expect(output.join('\n')).toMatch(/applied migrations: 0001_foundation/);
    expect(await (await fetch(`${base}/healthz`)).json()).toEqual({ status: 'ok' });
    const readyz = await fetch(`${base}/readyz`);
    expect(await readyz.json()).toEqual({ status: 'ready', checks: { database: 'ok', migrations: 'ok' } });
    expect(readyz.status).toBe(200);
    const metrics = await fetch(`${base}/metrics`);
    expect(metrics.status).toBe(200);
    const text = await metrics.text();
    expect(text).toContain(
      `tollgate_build_info{version="${version}",node_version="${process.versions.node}"} 1`,
    );
    expect(text).toMatch(/^tollgate_http_requests_total\{[^}]*route="\/readyz"[^}]*\} 1$/m);
  });

  let projectId: string;
  let apiKey: string;

  it('applies a YAML pricing file with the bundled CLI (yaml loads through createRequire)', async () => {
    // Seeded on the schema the proxy migrated (this context's own migration finds nothing to do).
    ctx = await createTestContext({}, { id });
    ({ projectId, apiKey } = await seedProject(ctx, {
      upstreamUrl: mock.baseUrl,
      upstreamKey: 'sk-mock-provider-key',
      settings: { maxCompletionTokens: 100 },
    }));
    const file = join(dataDir, 'pricing.yaml');
    writeFileSync(
      file,
      [
        'currency: usd',
        'models:',
        '  - id: metered',
        '    upstreamModel: mock-model',
        `    pricing: { mode: per_token, inputPerMillion: "${IN}", outputPerMillion: "${OUT}", holdMargin: "${MARGIN}" }`,
        '',
      ].join('\n'),
    );
    const { stdout } = await run(
      process.execPath,
      [...NODE_FLAGS, command, 'models', 'apply', '--project', projectId, '--file', file, '--json'],
      { env: { ...proxyEnv, LOG_LEVEL: 'warn' }, timeout: 20_000 },
    );
    expect(JSON.parse(stdout)).toEqual({ created: ['metered'], updated: [], deleted: [] });
  });

  it('charges the end user exactly for a paid chat completion, non-streaming and streaming', async () => {
    const project = await getProject(ctx.db, projectId);
    const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
    await connectUser(ctx.db, ctx.events, project, 'alice', trigger);
    await ctx.billing.deposit({ project, externalId: 'alice', amount: '1.00', source: 'test', trigger });

    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });
    const reply = await client.chat.completions.create({ model: 'metered', user: 'alice', messages });
    expect(reply.choices[0]!.message.content).toBe(' hello'.repeat(5));
    expect(reply.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 5 });

    const stream = await client.chat.completions.create({
      model: 'metered',
      user: 'alice',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(' hello'.repeat(5));
    expect(usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 5 });
    expect(mock.requests.map((r) => [r.body.model, Boolean(r.body.stream)])).toEqual([
      ['mock-model', false],
      ['mock-model', true],
    ]);

    // The proxy settles in its own process: wait (bounded) until both holds are settled.
    const wallet = (await findWallet(ctx.db, project.id, 'alice'))!;
    const holds = () =>
      ctx.db
        .selectFrom('holds')
        .select(['amount', 'status'])
        .where('user_id', '=', wallet.userId)
        .orderBy('created_at')
        .orderBy('id')
        .execute();
    const deadline = Date.now() + 10_000;
    while ((await holds()).some((h) => h.status === 'open')) {
      if (Date.now() > deadline) throw new Error(`holds still open: ${JSON.stringify(await holds())}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect((await holds()).map((h) => [new Money(h.amount).toFixed(), h.status])).toEqual([
      [HOLD, 'settled'],
      [HOLD, 'settled'],
    ]);

    const entries = await ledgerEntriesOf(ctx, wallet.userId, ['kind', 'amount', 'source', 'held_delta']);
    expect(PER_REQUEST).toBe('0.022');
    expect(entries.map((e) => e.kind)).toEqual(['deposit', 'charge', 'charge']);
    expect(entries.filter((e) => e.kind === 'charge').map((e) => new Money(e.amount).toFixed())).toEqual([
      `-${PER_REQUEST}`,
      `-${PER_REQUEST}`,
    ]);
    expect(chargedTotal(entries)).toBe('0.044');
    expect(await findWallet(ctx.db, project.id, 'alice')).toMatchObject({ balance: '0.956', held: '0' });
    // And as the proxy itself reports it.
    const balance = await fetch(`${base}/v1/user/balance?user=alice`, {
      headers: { authorization: `Bearer ${apiKey}` },
    });
    expect(await balance.json()).toMatchObject({ balance: '0.956', held: '0.00', available: '0.956' });
  });

  it('ends with exit code 0 on SIGTERM', async () => {
    proxy.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(output.join('\n')).toMatch(/SIGTERM received: draining in-flight requests/);
    // Nothing went wrong on the way (pino: 50 error, 60 fatal).
    expect(output.filter((line) => /"level":(50|60)\b/.test(line))).toEqual([]);
  });
});
