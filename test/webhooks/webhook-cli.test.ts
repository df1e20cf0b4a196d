import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { getProject } from '../../src/projects/service.ts';
import { createSubscription, getSubscription } from '../../src/webhooks/subscriptions.ts';
import { createTestContext, databaseUrlOf, realPostgres, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';
import type { Receiver, TestCa } from '../helpers/https-receiver.ts';
import { depositFor, seedProject } from '../helpers/server.ts';
import { startWebhookBench, type WebhookBench } from './fixture.ts';

let ctx: AppContext;
let ca: TestCa;
let receiver: Receiver;
let env: NodeJS.ProcessEnv;
let bench: WebhookBench<AppContext>;

beforeAll(async () => {
  if (!realPostgres) return;
  bench = await startWebhookBench((e) => createTestContext(e));
  ({ ca, receiver, started: ctx } = bench);
  env = {
    ...process.env,
    DATABASE_URL: databaseUrlOf(ctx.database.schema!),
    REDIS_URL: '',
    TOLLGATE_ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    LOG_LEVEL: 'info',
    WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true',
    WEBHOOK_CA_FILE: ca.caFile,
    WEBHOOK_POLL_INTERVAL_MS: '50',
  };
});
afterAll(() => bench?.close());

const tollgate = (...args: string[]) =>
  spawnSync(process.execPath, ['cmd/tollgate.ts', ...args], { env, encoding: 'utf8', timeout: 30_000 });

describe.runIf(realPostgres)('tollgate webhooks and tollgate worker', () => {
  it('disables and re-enables a subscription from the command line', async () => {
    const p = await seedProject(ctx);
    const { subscription } = await createSubscription(
      ctx,
      p.projectId,
      { url: 'https://hooks.example.test/x', events: ['*'] },
      { createdBy: 'test' },
    );
    const off = tollgate('webhooks', 'disable', subscription.id, '--json');
    expect(off.status, off.stderr).toBe(0);
    expect(JSON.parse(off.stdout)).toMatchObject({ id: subscription.id, isActive: false });
    expect((await getSubscription(ctx, p.projectId, subscription.id)).isActive).toBe(false);
    const on = tollgate('webhooks', 'enable', subscription.id);
    expect(on.status, on.stderr).toBe(0);
    expect(on.stdout).toMatch(/^Enabled webhook subscription/);
    expect((await getSubscription(ctx, p.projectId, subscription.id)).isActive).toBe(true);

    const missing = tollgate('webhooks', 'enable', 'whsub_nope');
    expect(missing.status).toBe(1);
    expect(missing.stderr).toMatch(/No webhook subscription/);
    expect(tollgate('webhooks', 'enable').status).toBe(2);
    expect(tollgate('webhooks', 'frobnicate', 'x').status).toBe(2);
  }, 90_000);

  it('runs a standalone worker that delivers and stops on SIGTERM', async () => {
    const p = await seedProject(ctx);
    const { subscription, secret } = await createSubscription(
      ctx,
      p.projectId,
      { url: `${receiver.url}/cli-worker`, events: ['balance.*'] },
      { createdBy: 'test' },
    );
    receiver.secrets.set(subscription.id, secret);
    const child = spawn(process.execPath, ['cmd/tollgate.ts', 'worker'], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      let output = '';
      await new Promise<void>((resolve, reject) => {
        const onData = (d: Buffer) => {
          output += d.toString();
          if (output.includes('webhook worker started')) resolve();
        };
        child.stdout!.on('data', onData);
        child.stderr!.on('data', onData);
        child.once('exit', (code) => reject(new Error(`worker exited (${code}): ${output}`)));
      });
      const project = await getProject(ctx.db, p.projectId);
      await depositFor(ctx, project, 'cli', '1');
      const [req] = await receiver.waitFor((all) => all.some((r) => r.path === '/cli-worker'));
      expect(req!.verified).toBe(true);
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const [code] = await exited;
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 60_000);
});
