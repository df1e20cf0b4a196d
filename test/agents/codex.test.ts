import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { type AgentRun, codexConfig, runCodex } from '../helpers/agent-cli.ts';
import { responsesToolLoop, toolLoopScript } from '../helpers/agent-scripts.ts';
import {
  AGENT_TIMEOUT_MS,
  type AgentFixture,
  agentsInstalled,
  CODEX_MODEL,
  costOf,
  endUserKey,
  GPT_PRICE,
  startAgentFixture,
  TEST_TIMEOUT_MS,
} from './fixture.ts';

/**
 * Codex (`@openai/codex`, the npm package) with its default settings — `codex exec`, its sandbox and
 * approval policy — configured as docs/coding-agents.md says: a `config.toml` provider with
 * Tollgate's base URL, the key's environment variable and the Responses API. Offline: Tollgate on
 * loopback, the echo provider or a scripted OpenAI-compatible provider behind it.
 */
let f: AgentFixture;

beforeAll(async () => {
  f = await startAgentFixture();
  await f.fund(f.real.project, 'alice', '10.00');
  await f.fund(f.real.project, 'broke');
});
afterAll(() => f?.close());

const output = (run: AgentRun) => `${run.stdout}\n${run.stderr}`;

function codex(
  prompt: string,
  options: { project: 'dev' | 'real'; model: string; user?: string; key?: string },
) {
  const apiKey = options.key ?? (options.project === 'dev' ? f.dev.apiKey : f.real.apiKey);
  const config = codexConfig({
    baseUrl: `${f.server.url}/v1`,
    model: options.model,
    envKey: 'TOLLGATE_API_KEY',
    ...(options.user ? { headers: { 'X-Service-User': options.user } } : {}),
  });
  const dirs = f.dirs();
  writeFileSync(join(dirs.work, 'notes.txt'), `The deploy word is ${SECRET}.\n`);
  return runCodex(prompt, config, { TOLLGATE_API_KEY: apiKey }, dirs, AGENT_TIMEOUT_MS);
}

const SECRET = 'turnstile-7f3a';

/** A tool loop: Codex runs `cat notes.txt` in its sandbox, the provider quotes what it read. */
function catNotes(finalText = (said: string) => `Codex read: ${said.includes(SECRET) ? SECRET : 'nothing'}`) {
  return toolLoopScript({
    tool: 'exec_command',
    input: { cmd: 'cat notes.txt' },
    final: finalText,
    usage: { call: { input: 9_412, output: 37 }, final: { input: 9_538, output: 21 } },
  });
}

describe.skipIf(!agentsInstalled)('Codex through Tollgate', { timeout: TEST_TIMEOUT_MS }, () => {
  it("answers on make dev's echo provider, charged to the user", async () => {
    const before = await f.charges(f.dev.project, f.dev.user, 'responses');
    const run = await codex('Say hello to the gate', {
      project: 'dev',
      model: f.dev.model,
      user: f.dev.user,
    });
    expect(run.timedOut).toBe(false);
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain('[echo provider] Say hello to the gate');
    const charges = (await f.charges(f.dev.project, f.dev.user, 'responses')).slice(before.length);
    expect(charges).toHaveLength(1);
    expect(charges[0]!.gt(0)).toBe(true);
  });

  it('runs a tool loop on an OpenAI-compatible provider, each request charged exactly', async () => {
    const script = catNotes();
    f.scripted.handlers.set(CODEX_MODEL, responsesToolLoop(script));
    const run = await codex('What is the deploy word in notes.txt?', {
      project: 'real',
      model: CODEX_MODEL,
      user: 'alice',
    });
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain(`Codex read: ${SECRET}`);
    // The provider was asked twice: the tool call, then the answer with the command's output.
    expect(script.requests).toHaveLength(2);
    expect(JSON.stringify(script.requests[1].input)).toContain('function_call_output');
    const charges = await f.charges(f.real.project, 'alice', 'responses');
    expect(charges.map((c) => c.toFixed())).toEqual([
      costOf(script.usage.call, GPT_PRICE).toFixed(),
      costOf(script.usage.final, GPT_PRICE).toFixed(),
    ]);
  });

  it('sends a gpt-5 model its output limit when Codex sets no bound: an answer past 4 096 tokens arrives whole', async () => {
    const filler = Array.from({ length: 5_000 }, (_, i) => `w${i % 10}`).join(' ');
    const script = catNotes(
      (said) => `${filler} END-OF-LONG-ANSWER ${said.includes(SECRET) ? SECRET : 'nothing'}`,
    );
    script.usage.final.output = 10_012;
    f.scripted.handlers.set(CODEX_MODEL, responsesToolLoop(script));
    const run = await codex('Read notes.txt and write at length.', {
      project: 'real',
      model: CODEX_MODEL,
      user: 'alice',
    });
    expect(run.code, output(run)).toBe(0);
    expect(output(run)).not.toContain('Incomplete response');
    expect(run.stdout).toContain(`END-OF-LONG-ANSWER ${SECRET}`);
    // Codex sends no max_output_tokens: Tollgate sends (and held) the model's, gpt-5's 128 000.
    expect(script.requests.every((r) => r.max_output_tokens === 128_000)).toBe(true);
  });

  it('shows a user who cannot pay the top-up link, and asks the provider nothing', async () => {
    const script = catNotes();
    f.scripted.handlers.set(CODEX_MODEL, responsesToolLoop(script));
    const run = await codex('What is the deploy word in notes.txt?', {
      project: 'real',
      model: CODEX_MODEL,
      user: 'broke',
    });
    expect(output(run)).toContain(`${f.server.url}/topup/`);
    expect(script.requests).toHaveLength(0);
    expect(await f.charges(f.real.project, 'broke', 'responses')).toEqual([]);
  });

  it('needs nothing but the base URL and an end-user key', async () => {
    await f.fund(f.real.project, 'carol', '5.00');
    const key = await endUserKey(f.server, f.real.apiKey, 'carol');
    const script = catNotes();
    f.scripted.handlers.set(CODEX_MODEL, responsesToolLoop(script));
    const run = await codex('What is the deploy word in notes.txt?', {
      project: 'real',
      model: CODEX_MODEL,
      key,
    });
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain(`Codex read: ${SECRET}`);
    const charges = await f.charges(f.real.project, 'carol', 'responses');
    expect(charges.reduce((a, c) => a.plus(c), new Money(0)).toFixed()).toBe(
      costOf(script.usage.call, GPT_PRICE).plus(costOf(script.usage.final, GPT_PRICE)).toFixed(),
    );
  });
});
