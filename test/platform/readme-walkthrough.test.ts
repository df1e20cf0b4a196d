import { type ChildProcess, spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { dataDirFor, devEnv, startDev } from '../helpers/dev-process.ts';

/**
 * The README's "From `make dev` to a paid chat", step by step against a real `tollgate dev` on the
 * embedded database, offline: a new user gets the connect link, connects on the hosted page, gets the
 * top-up link, pays on the test checkout with the test card, chats and pays for it; then is funded with
 * the CLI over the admin API (the printed variables).
 */
describe('the README walkthrough', () => {
  let child: ChildProcess | undefined;
  const dataDir = dataDirFor('tollgate-walkthrough-', () => [child]);
  const env = devEnv(dataDir, { HOST: '' });

  it('goes from tollgate dev to a paid chat', async () => {
    const dev = startDev({ ...env, PORT: '0' });
    child = dev.child;
    const out = await dev.ready;
    const base = /running at (http:\/\/\S+)\/v1/.exec(out)![1]!;
    const key = /API key:\s+(tg_\S+)/.exec(out)![1]!;
    const projectId = /project:\s+(pw_\S+)/.exec(out)![1]!;
    const exported = /export (TOLLGATE_URL=\S+) (TOLLGATE_ADMIN_TOKEN=\S+)/.exec(out)!;

    // 1. A new end user chats and gets the connect link.
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
    const ask = async () =>
      (
        await client.chat.completions.create({
          model: 'demo-per-request',
          user: 'alice',
          messages: [{ role: 'user', content: 'Hello' }],
        })
      ).choices[0]!.message.content!;
    const first = await ask();
    expect(first).toMatch(/^To continue, connect your account to Demo\. Open this link to connect: http/);
    const link = /(http:\/\/\S+\/connect\/\S+)/.exec(first)![1]!;

    // 2. Alice opens the link and presses Connect (the page's own form).
    const pageRes = await fetch(link);
    expect(pageRes.status).toBe(200);
    const page = await pageRes.text();
    const fields = Object.fromEntries(
      [...page.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((m) => [m[1]!, m[2]!]),
    );
    const connected = await fetch(link, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(fields).toString(),
      redirect: 'manual',
    });
    expect(connected.status).toBeLessThan(400);

    // 3. Connected with nothing to spend: the answer is the top-up link.
    const broke = await ask();
    expect(broke).toMatch(/top up/i);
    const topup = /(http:\/\/\S+\/topup\/[A-Za-z0-9_.-]+)/.exec(broke)![1]!;

    // 4. The top-up page (test payments: the demo's), 5.00, Pay → the test checkout → the test card.
    const topupPage = await (await fetch(topup)).text();
    expect(topupPage).toContain('Test payments');
    const proof = /name="confirm" value="([^"]+)"/.exec(topupPage)![1]!;
    const toCheckout = await fetch(topup, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ confirm: proof, amount: '5' }).toString(),
      redirect: 'manual',
    });
    expect(toCheckout.status).toBe(303);
    const checkout = toCheckout.headers.get('location')!;
    expect(await (await fetch(checkout)).text()).toContain('4242 4242 4242 4242');
    const paid = await fetch(checkout, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ card: '4242424242424242' }).toString(),
      redirect: 'manual',
    });
    expect(paid.status).toBe(303);
    const done = await (await fetch(paid.headers.get('location')!)).text();
    expect(done).toContain('payment received');

    // 5. She chats, and her balance goes down.
    expect(await ask()).toBe('[echo provider] Hello');
    let balance: { balance: string } = { balance: '' };
    for (let i = 0; i < 30 && balance.balance !== '4.99'; i++) {
      const res = await fetch(`${base}/v1/user/balance?user=alice`, {
        headers: { authorization: `Bearer ${key}` },
      });
      balance = (await res.json()) as { balance: string };
      if (balance.balance !== '4.99') await new Promise((r) => setTimeout(r, 100));
    }
    expect(balance).toMatchObject({ user: 'alice', connected: true, balance: '4.99', currency: 'usd' });

    // 6. Funded with the CLI over the admin API, using the variables dev printed.
    const vars = Object.fromEntries(exported.slice(1).map((kv) => kv.split('=', 2) as [string, string]));
    const deposit = spawnSync(
      'npm',
      [
        'run',
        '--silent',
        'tollgate',
        '--',
        'users',
        'deposit',
        '--project',
        projectId,
        '--user',
        'alice',
        '--amount',
        '5.00',
      ],
      { env: { ...env, ...vars }, encoding: 'utf8', timeout: 60_000 },
    );
    expect(deposit.status, deposit.stderr).toBe(0);
    expect(deposit.stdout).toContain('Deposited 5.00 usd to alice; balance 9.99 usd');

    // GET / answers the home page.
    const home = await fetch(`${base}/`);
    expect(await home.text()).toContain('href="/dashboard"');

    const exited = new Promise<number | null>((resolve) => child!.once('exit', resolve));
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    child = undefined;
  }, 180_000);
});
