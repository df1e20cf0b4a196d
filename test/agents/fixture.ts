import type { AppContext } from '../../src/app/context.ts';
import { findWallet } from '../../src/billing/ledger.ts';
import { DEV_MODEL, DEV_USER, seedDev } from '../../src/cli/serve.ts';
import { Money } from '../../src/core/money.ts';
import type { Project } from '../../src/db/schema.ts';
import { getProject } from '../../src/projects/service.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { connectUser } from '../../src/users/service.ts';
import { type AgentDirs, agentDirs, claudeBinary, codexLauncher } from '../helpers/agent-cli.ts';
import type { ScriptedUsage } from '../helpers/agent-scripts.ts';
import { ledgerEntriesOf } from '../helpers/chat-fixture.ts';
import { type ScriptedProvider, startScripted } from '../helpers/scripted-provider.ts';
import { api, seedProject, startTestServer, type TestServer, testTrigger } from '../helpers/server.ts';

/** Per-token prices (per million tokens) of the real-provider-shaped routes. */
export const CLAUDE_PRICE = { input: '3', output: '15' };
export const GPT_PRICE = { input: '1.25', output: '10' };

/** Claude Code's and Codex's default model names, served by the scripted providers under the same names. */
export const CLAUDE_MODEL = 'claude-opus-5-5';
export const CODEX_MODEL = 'gpt-5.5';

/** One agent run's bound: a turn with a tool call takes a few seconds; a minute means something hangs. */
export const AGENT_TIMEOUT_MS = 60_000;
/** A test's bound: its agent run, and the set-up and checks around it. */
export const TEST_TIMEOUT_MS = AGENT_TIMEOUT_MS + 30_000;

/**
 * The coding agents' world: a Tollgate server with
 * - the `make dev` demo project (`tollgate dev`'s seed: `demo-echo` on the built-in echo provider, the
 *   demo user funded), and
 * - a project shaped like a real deployment: `claude-opus-5-5` routed to a provider of kind `anthropic`,
 *   `gpt-5.5` on the OpenAI-compatible default provider — both the scripted loopback provider, which
 *   answers each model name with the script a test sets;
 * and a temporary home and working directory per agent run.
 */
export interface AgentFixture {
  server: TestServer;
  ctx: AppContext;
  scripted: ScriptedProvider;
  dev: { project: Project; apiKey: string; model: string; user: string };
  real: { project: Project; apiKey: string };
  /** Connects `user` to `project` and deposits `amount` when given. */
  fund(project: Project, user: string, amount?: string): Promise<void>;
  /** Once settled: the user's charges (a positive amount each) of ledger source `source`. */
  charges(project: Project, user: string, source: string): Promise<Money[]>;
  /** A fresh home and working directory, removed when the fixture closes. */
  dirs(): AgentDirs;
  close(): Promise<void>;
}

/** Whether both CLIs are installed (they are devDependencies: `npm ci` installs them). */
export const agentsInstalled = Boolean(claudeBinary() && codexLauncher());

export async function startAgentFixture(): Promise<AgentFixture> {
  const scripted = await startScripted();
  const server = await startTestServer();
  const ctx = server.ctx;
  const state = await seedDev(ctx);
  const seeded = await seedProject(ctx, {
    upstreamUrl: `${scripted.url}/v1`,
    upstreamKey: 'sk-scripted-openai',
    models: [
      {
        id: CLAUDE_MODEL,
        pricing: {
          mode: 'per_token',
          inputPerMillion: CLAUDE_PRICE.input,
          outputPerMillion: CLAUDE_PRICE.output,
        },
        routes: [{ provider: 'anthropic', model: CLAUDE_MODEL }],
      },
      {
        id: CODEX_MODEL,
        upstreamModel: CODEX_MODEL,
        pricing: { mode: 'per_token', inputPerMillion: GPT_PRICE.input, outputPerMillion: GPT_PRICE.output },
      },
    ],
  });
  await upsertProvider(ctx.db, ctx.sealer, seeded.projectId, {
    name: 'anthropic',
    baseUrl: scripted.url,
    kind: 'anthropic',
    key: 'sk-ant-scripted',
  });
  await ctx.projects.changed(seeded.projectId);
  const made: AgentDirs[] = [];
  return {
    server,
    ctx,
    scripted,
    dev: {
      project: await getProject(ctx.db, state.projectId),
      apiKey: state.apiKey,
      model: DEV_MODEL,
      user: DEV_USER,
    },
    real: { project: await getProject(ctx.db, seeded.projectId), apiKey: seeded.apiKey },
    async fund(project, user, amount) {
      await connectUser(ctx.db, ctx.events, project, user, testTrigger);
      if (amount)
        await ctx.billing.deposit({
          project,
          externalId: user,
          amount,
          source: 'test',
          trigger: testTrigger,
        });
    },
    async charges(project, user, source) {
      await server.app.metering.idle();
      await ctx.billing.idle();
      const wallet = await findWallet(ctx.db, project.id, user);
      if (!wallet) return [];
      const entries = await ledgerEntriesOf(ctx, wallet.userId, ['kind', 'amount', 'source']);
      return entries
        .filter((e) => e.kind === 'charge' && e.source === source)
        .map((e) => new Money(0).minus(e.amount));
    },
    dirs() {
      const dirs = agentDirs();
      made.push(dirs);
      return dirs;
    },
    async close() {
      for (const dirs of made) dirs.remove();
      await server.close();
      await scripted.close();
    },
  };
}

/** What `usage` costs at a price per million tokens. */
export function costOf(usage: ScriptedUsage, price: { input: string; output: string }): Money {
  return new Money(usage.input)
    .times(price.input)
    .plus(new Money(usage.output).times(price.output))
    .div(1_000_000);
}

/** An end-user key for `user` (`POST /v1/user/keys` with the project key): the key, shown once. */
export async function endUserKey(server: TestServer, projectKey: string, user: string): Promise<string> {
  const res = await api(server, projectKey, 'POST', '/v1/user/keys', { user, name: 'agent test' });
  if (res.status !== 201)
    throw new Error(`POST /v1/user/keys answered ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body.key as string;
}
