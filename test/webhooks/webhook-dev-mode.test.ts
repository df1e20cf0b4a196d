import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { verifyWebhook } from '../../src/webhooks/verify.ts';

/**
 * `tollgate dev` delivers webhooks in its own process, and lets them reach a plain-HTTP receiver on
 * this machine (the production defaults refuse both).
 */
describe('webhooks in tollgate dev', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'tollgate-dev-webhooks-'));
  let child: ChildProcess | undefined;
  const received: Array<{ headers: IncomingHttpHeaders; body: Buffer }> = [];
  let notify: () => void = () => {};
  const receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.end('ok');
      notify();
    });
  });

  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await new Promise<void>((resolve) => receiver.close(() => resolve()));
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('signs and delivers a deposit event to a local plain-HTTP receiver', async () => {
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const port = (receiver.address() as AddressInfo).port;
    child = spawn(process.execPath, ['cmd/tollgate.ts', 'dev'], {
      env: {
        ...process.env,
        DATABASE_URL: '',
        REDIS_URL: '',
        TOLLGATE_ENCRYPTION_KEY: '',
        WEBHOOK_ALLOW_HTTP: '',
        WEBHOOK_ALLOW_PRIVATE_NETWORKS: '',
        TOLLGATE_DATA_DIR: dataDir,
        PORT: '0',
        HOST: '127.0.0.1',
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stderr!.on('data', (c: Buffer) => {
      out += c.toString();
    });
    const { base, key } = await new Promise<{ base: string; key: string }>((resolve, reject) => {
      child!.stdout!.on('data', (c: Buffer) => {
        out += c.toString();
        const base = /running at (http:\/\/\S+)\/v1/.exec(out)?.[1];
        const key = /API key:\s+(tg_\S+)/.exec(out)?.[1];
        if (base && key && out.includes('Press Ctrl+C')) resolve({ base, key });
      });
      child!.once('exit', (code) => reject(new Error(`tollgate dev exited (${code}):\n${out}`)));
    });
    const call = async (path: string, body: unknown) => {
      const res = await fetch(`${base}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return { status: res.status, body: (await res.json()) as any };
    };
    const created = await call('/v1/webhooks/subscriptions', {
      url: `http://127.0.0.1:${port}/hook`,
      events: ['balance.*'],
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const arrived = new Promise<void>((resolve) => {
      notify = resolve;
    });
    const dep = await call('/v1/user/balance/deposit', { user: 'demo-user', amount: '1.00' });
    expect(dep.status).toBeLessThan(300);
    await arrived;
    const [first] = received;
    const verdict = verifyWebhook(created.body.subscription.secret, first!.body, first!.headers);
    expect(verdict.ok).toBe(true);
    expect(first!.headers['x-service-event']).toBe('balance.deposit.created@1.0');

    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    const [code] = await exited;
    expect(code).toBe(0);
  }, 90_000);
});
