import { type ChildProcess, spawn } from 'node:child_process';
import { createOpenAI } from '@ai-sdk/openai';
import { embed, generateText } from 'ai';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { anthropicFor } from '../helpers/clients.ts';
import { dataDirFor } from '../helpers/dev-process.ts';

/** `tollgate dev` on the embedded default, as a newcomer runs it (`make dev`): no DATABASE_URL, no REDIS_URL. */
describe('tollgate dev', () => {
  let child: ChildProcess | undefined;
  const dataDir = dataDirFor('tollgate-dev-', () => [child]);

  async function start(): Promise<{ base: string; key: string; output: () => string }> {
    const env = {
      ...process.env,
      DATABASE_URL: '',
      REDIS_URL: '',
      TOLLGATE_ENCRYPTION_KEY: '',
      TOLLGATE_DATA_DIR: dataDir,
      PORT: '0',
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
    };
    child = spawn(process.execPath, ['cmd/tollgate.ts', 'dev'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stderr!.on('data', (c: Buffer) => {
      out += c.toString();
    });
    return new Promise((resolve, reject) => {
      child!.stdout!.on('data', (c: Buffer) => {
        out += c.toString();
        const base = /running at (http:\/\/\S+)\/v1/.exec(out)?.[1];
        const key = /API key:\s+(tg_\S+)/.exec(out)?.[1];
        if (base && key && out.includes('Press Ctrl+C')) resolve({ base, key, output: () => out });
      });
      child!.once('exit', (code) => reject(new Error(`dev exited with ${code}: ${out}`)));
    });
  }

  async function stop(): Promise<number | null> {
    const exited = new Promise<number | null>((resolve) => child!.once('exit', resolve));
    child!.kill('SIGINT');
    const code = await exited;
    child = undefined;
    return code;
  }

  it('starts on the embedded database with a demo project, and keeps it across restarts', async () => {
    const first = await start();
    expect(first.output()).toMatch(/embedded Postgres/);
    expect(first.output()).toContain('demo user:  demo-user (connected, 10.00 usd to start)');
    expect(first.output()).toMatch(/payments: +test payments/);
    const home = await (await fetch(`${first.base}/`)).text();
    expect(/<title>([^<]*)<\/title>/.exec(home)?.[1]).toBe('Tollgate');
    const client = new OpenAI({ baseURL: `${first.base}/v1`, apiKey: first.key, maxRetries: 0 });
    const models = await client.models.list();
    expect(models.data.map((m) => m.id).sort()).toEqual(['demo-echo', 'demo-embed', 'demo-per-request']);
    const reply = await client.chat.completions.create({
      model: 'demo-echo',
      user: 'demo-user',
      messages: [{ role: 'user', content: 'Hello from the quick start' }],
    });
    expect(reply.choices[0]!.message.content).toBe('[echo provider] Hello from the quick start');
    expect(reply.usage?.completion_tokens).toBeGreaterThan(0);
    // Every API the README shows works offline: the AI SDK's default openai() (the Responses API),
    // embeddings, and Anthropic's Messages API.
    const openai = createOpenAI({
      baseURL: `${first.base}/v1`,
      apiKey: first.key,
      headers: { 'X-Service-User': 'demo-user' },
    });
    const generated = await generateText({ model: openai('demo-echo'), prompt: 'Hello from the AI SDK' });
    expect(generated.text).toBe('[echo provider] Hello from the AI SDK');
    const embedded = await embed({ model: openai.embedding('demo-embed'), value: 'Hello' });
    expect(embedded.embedding.length).toBeGreaterThan(0);
    const claude = anthropicFor(first.base, first.key, 'demo-user');
    const message = await claude.messages.create({
      model: 'demo-echo',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Hello from Claude' }],
    });
    expect(message.content).toEqual([{ type: 'text', text: '[echo provider] Hello from Claude' }]);
    expect(await stop()).toBe(0);

    // A restart says what exists (the demo user's balance now), not the first start's deposit again.
    const second = await start();
    expect(second.key).toBe(first.key);
    expect(second.output()).not.toContain('10.00 usd to start');
    expect(second.output()).toMatch(
      /demo user: {2}demo-user \(balance \d+\.\d{2} usd, \d+\.\d{2} available\)/,
    );
    expect(second.output()).toMatch(/payments: +test payments/);
    expect(await stop()).toBe(0);
  }, 180_000);
});
