import { type ChildProcess, spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { createProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext, newTestId, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Rate limits shared by two real `tollgate proxy` processes through Redis: the N+1st request of a
 * window is refused whichever process receives it, concurrent requests included.
 */
const pgUrl = process.env.TOLLGATE_TEST_PG;
const redisUrl = process.env.TOLLGATE_TEST_REDIS;
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const MODELS: ModelSpec[] = [
  { id: 'm', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.01' } },
];

describe.skipIf(!pgUrl || !redisUrl)('rate limits across two proxy processes', () => {
  const id = newTestId();
  let ctx: AppContext;
  let mock: MockUpstream;
  let apiKey: string;
  const procs: ChildProcess[] = [];
  const bases: string[] = [];

  function startProxy(): Promise<string> {
    const url = new URL(pgUrl!);
    url.searchParams.set('options', `-c search_path=tgt_${id}`);
    const child = spawn(process.execPath, ['cmd/tollgate.ts', 'proxy'], {
      env: {
        ...process.env,
        DATABASE_URL: url.toString(),
        REDIS_URL: redisUrl,
        TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
        LOG_LEVEL: 'info',
        PORT: '0',
        HOST: '127.0.0.1',
        TOLLGATE_ALLOW_PRIVATE_PROVIDERS: 'true',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    procs.push(child);
    return new Promise<string>((resolve, reject) => {
      let out = '';
      child.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        const match = /listening on (http:\/\/\S+?) /.exec(out);
        if (match) resolve(match[1]!);
      });
      child.once('exit', (code) => reject(new Error(`proxy exited with ${code}: ${out}`)));
    });
  }

  beforeAll(async () => {
    ctx = await createTestContext({}, { id });
    mock = await startMockUpstream();
    const created = await createProject(ctx.db, ctx.sealer, {
      name: 'Two processes',
      upstreamUrl: mock.baseUrl,
    });
    apiKey = created.apiKey;
    await applyPricing(ctx.db, created.project.id, {
      currency: 'usd',
      models: MODELS,
      limits: { user: { rpm: 3 }, key: { rpm: 1000 } },
    });
    for (const user of ['p1', 'p2']) {
      await connectUser(ctx.db, ctx.events, created.project, user, trigger);
      await ctx.billing.deposit({
        project: created.project,
        externalId: user,
        amount: '5',
        source: 'test',
        trigger,
      });
    }
    bases.push(...(await Promise.all([startProxy(), startProxy()])));
  }, 120_000);

  afterAll(async () => {
    for (const child of procs) child.kill('SIGTERM');
    await mock?.close();
    await ctx?.close();
  });

  const chat = (base: string, user: string) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', user, messages: [{ role: 'user', content: 'hi' }] }),
    });

  it('the 4th request of the window gets 429 with the headers, sequential or concurrent', async () => {
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 8000) await new Promise((resolve) => setTimeout(resolve, left + 50));
    const statuses: number[] = [];
    const remaining: Array<string | null> = [];
    for (let i = 0; i < 4; i++) {
      const res = await chat(bases[i % 2]!, 'p1');
      statuses.push(res.status);
      remaining.push(res.headers.get('x-ratelimit-remaining-requests'));
      if (i === 3) {
        expect(res.headers.get('retry-after')).toMatch(/^\d+$/);
        expect(((await res.json()) as any).error.code).toBe('rate_limit_exceeded');
      } else await res.text();
    }
    expect(statuses).toEqual([200, 200, 200, 429]);
    expect(remaining).toEqual(['2', '1', '0', '0']);
    const all = await Promise.all(Array.from({ length: 10 }, (_, i) => chat(bases[i % 2]!, 'p2')));
    expect(all.filter((r) => r.status === 200)).toHaveLength(3);
    await Promise.all(all.map((r) => r.text()));
  }, 60_000);
});
