import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Money } from '../../src/core/money.ts';
import { type AgentRun, runClaude } from '../helpers/agent-cli.ts';
import { anthropicToolLoop, type ToolLoopScript, toolLoopScript } from '../helpers/agent-scripts.ts';
import {
  AGENT_TIMEOUT_MS,
  type AgentFixture,
  agentsInstalled,
  CLAUDE_MODEL,
  CLAUDE_PRICE,
  costOf,
  endUserKey,
  startAgentFixture,
  TEST_TIMEOUT_MS,
} from './fixture.ts';

/**
 * Claude Code (`@anthropic-ai/claude-code`, the npm package's native binary) with its default
 * settings — `claude -p`, its default model, its betas, its tools and permission mode — configured as
 * docs/coding-agents.md says: `ANTHROPIC_BASE_URL`, a key, and (without an end-user key) the
 * end user in `ANTHROPIC_CUSTOM_HEADERS`. Offline: Tollgate on loopback, the echo provider or a
 * scripted provider of kind `anthropic` behind it.
 */
let f: AgentFixture;

beforeAll(async () => {
  f = await startAgentFixture();
  await f.fund(f.real.project, 'alice', '10.00');
  await f.fund(f.real.project, 'broke');
});
afterAll(() => f?.close());

const SECRET = 'turnstile-9c2e';
const output = (run: AgentRun) => `${run.stdout}\n${run.stderr}`;

interface ClaudeOptions {
  project: 'dev' | 'real';
  /** Sent as `ANTHROPIC_CUSTOM_HEADERS: X-Service-User: …` (none with an end-user key). */
  user?: string;
  key?: string;
  /** `ANTHROPIC_MODEL`; unset: Claude Code's default model. */
  model?: string;
  /** The provider's script, given the run's working directory (where notes.txt is). */
  script?: (work: string) => ToolLoopScript;
}

async function claude(
  prompt: string,
  options: ClaudeOptions,
): Promise<{ run: AgentRun; script?: ToolLoopScript }> {
  const dirs = f.dirs();
  writeFileSync(join(dirs.work, 'notes.txt'), `The deploy word is ${SECRET}.\n`);
  const script = options.script?.(dirs.work);
  if (script) f.scripted.handlers.set(CLAUDE_MODEL, anthropicToolLoop(script));
  const env: Record<string, string> = {
    ANTHROPIC_BASE_URL: f.server.url,
    ANTHROPIC_API_KEY: options.key ?? (options.project === 'dev' ? f.dev.apiKey : f.real.apiKey),
  };
  if (options.user) env.ANTHROPIC_CUSTOM_HEADERS = `X-Service-User: ${options.user}`;
  if (options.model) env.ANTHROPIC_MODEL = options.model;
  const run = await runClaude(prompt, env, dirs, AGENT_TIMEOUT_MS);
  return script ? { run, script } : { run };
}

/** A tool loop: Claude Code reads notes.txt with its Read tool, the provider quotes what it read. */
const readNotes = (work: string) =>
  toolLoopScript({
    tool: 'Read',
    input: { file_path: join(work, 'notes.txt') },
    final: (said) => `Claude read: ${said.includes(SECRET) ? SECRET : 'nothing'}`,
    usage: { call: { input: 14_203, output: 58 }, final: { input: 14_377, output: 19 } },
  });

describe.skipIf(!agentsInstalled)('Claude Code through Tollgate', { timeout: TEST_TIMEOUT_MS }, () => {
  it("answers on make dev's echo provider, charged to the user", async () => {
    const before = await f.charges(f.dev.project, f.dev.user, 'messages');
    const { run } = await claude('Say hello to the gate', {
      project: 'dev',
      model: f.dev.model,
      user: f.dev.user,
    });
    expect(run.timedOut).toBe(false);
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain('[echo provider]');
    const charges = (await f.charges(f.dev.project, f.dev.user, 'messages')).slice(before.length);
    expect(charges.length).toBeGreaterThanOrEqual(1);
    for (const charge of charges) expect(charge.gt(0)).toBe(true);
  });

  it('runs a tool loop on a native Anthropic provider, each request charged exactly', async () => {
    const { run, script } = await claude('What is the deploy word in notes.txt?', {
      project: 'real',
      user: 'alice',
      script: readNotes,
    });
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain(`Claude read: ${SECRET}`);
    // Every request Claude Code sent went to the provider with its default model, and each was charged
    // what the provider reported: the tool call, then the answer with the file's content.
    const models = new Set(script!.requests.map((r) => r.model));
    expect([...models]).toEqual([CLAUDE_MODEL]);
    const expected = script!.requests.map((r) =>
      costOf(
        JSON.stringify(r.messages).includes('tool_result') ? script!.usage.final : script!.usage.call,
        CLAUDE_PRICE,
      ),
    );
    expect(expected.length).toBeGreaterThanOrEqual(2);
    const charges = await f.charges(f.real.project, 'alice', 'messages');
    expect(charges.map((c) => c.toFixed())).toEqual(expected.map((c) => c.toFixed()));
  });

  it('shows a user who cannot pay the top-up link, and asks the provider nothing', async () => {
    const { run, script } = await claude('What is the deploy word in notes.txt?', {
      project: 'real',
      user: 'broke',
      script: readNotes,
    });
    expect(output(run)).toContain(`${f.server.url}/topup/`);
    expect(script!.requests).toHaveLength(0);
    expect(await f.charges(f.real.project, 'broke', 'messages')).toEqual([]);
  });

  it('needs nothing but the base URL and an end-user key', async () => {
    await f.fund(f.real.project, 'carol', '5.00');
    const key = await endUserKey(f.server, f.real.apiKey, 'carol');
    const { run, script } = await claude('What is the deploy word in notes.txt?', {
      project: 'real',
      key,
      script: readNotes,
    });
    expect(run.code, output(run)).toBe(0);
    expect(run.stdout).toContain(`Claude read: ${SECRET}`);
    const expected = script!.requests.map((r) =>
      costOf(
        JSON.stringify(r.messages).includes('tool_result') ? script!.usage.final : script!.usage.call,
        CLAUDE_PRICE,
      ),
    );
    const charges = await f.charges(f.real.project, 'carol', 'messages');
    expect(charges.reduce((a, c) => a.plus(c), new Money(0)).toFixed()).toBe(
      expected.reduce((a, c) => a.plus(c), new Money(0)).toFixed(),
    );
  });
});
