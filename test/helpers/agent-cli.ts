import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

/**
 * The coding agents' CLIs as npm installs them (devDependencies `@anthropic-ai/claude-code` and
 * `@openai/codex`), run as a user would, offline: each run gets a fresh home and config directory in a
 * temporary directory, an environment of its own (PATH and what the test gives, nothing of this
 * process's), telemetry, error reports and update checks off, no standard input, and a time limit
 * after which its whole process group is killed.
 *
 * Both packages ship their native binary in a platform package (an optional dependency). npm 11 runs
 * no dependency's install script unless allowed, so Claude Code's postinstall — which copies that
 * binary over its `bin/claude.exe` placeholder — may not have run: the binary is taken from the
 * platform package itself, as the package's own fallback launcher (`cli-wrapper.cjs`) does. Codex's
 * `bin/codex.js` finds its platform package at run time and needs no install script.
 */
const require = createRequire(import.meta.url);

function packageDir(name: string): string | undefined {
  try {
    return dirname(require.resolve(`${name}/package.json`));
  } catch {
    return undefined;
  }
}

/** glibc or musl, as cli-wrapper.cjs tells them apart. */
function isMusl(): boolean {
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined;
  return process.platform === 'linux' && report?.header?.glibcVersionRuntime === undefined;
}

/** Claude Code's native binary (its platform package's `claude`), or undefined when not installed. */
export function claudeBinary(): string | undefined {
  const key = `${process.platform}-${process.arch}${isMusl() ? '-musl' : ''}`;
  const dir = packageDir(`@anthropic-ai/claude-code-${key}`);
  const bin = dir && join(dir, process.platform === 'win32' ? 'claude.exe' : 'claude');
  return bin && existsSync(bin) ? bin : undefined;
}

/** Codex's launcher (`bin/codex.js`, run by this Node), or undefined when not installed. */
export function codexLauncher(): string | undefined {
  const dir = packageDir('@openai/codex');
  const launcher = dir && join(dir, 'bin', 'codex.js');
  return launcher && existsSync(launcher) ? launcher : undefined;
}

export interface AgentRun {
  code: number | null;
  /** Killed at the time limit. */
  timedOut: boolean;
  stdout: string;
  stderr: string;
}

/** A temporary directory for one agent run: `home` (its HOME and config) and `work` (its cwd). */
export interface AgentDirs {
  root: string;
  home: string;
  work: string;
  remove(): void;
}

export function agentDirs(): AgentDirs {
  const root = mkdtempSync(join(tmpdir(), 'tollgate-agent-'));
  const home = join(root, 'home');
  const work = join(root, 'work');
  mkdirSync(home);
  mkdirSync(work);
  return { root, home, work, remove: () => rmSync(root, { recursive: true, force: true }) };
}

/** Runs `command args` in `cwd` with exactly `env` (plus PATH), killed after `timeoutMs`. */
export function runAgent(
  command: string,
  args: string[],
  options: { cwd: string; env: Record<string, string>; timeoutMs: number },
): Promise<AgentRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: options.cwd,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...options.env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk;
    });
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {}
    }, options.timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, timedOut, stdout, stderr });
    });
  });
}

/** What turns off every call Claude Code makes besides the model's (telemetry, error reports, updates). */
export const CLAUDE_OFFLINE = {
  DISABLE_TELEMETRY: '1',
  DISABLE_ERROR_REPORTING: '1',
  DISABLE_AUTOUPDATER: '1',
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
};

/**
 * `claude -p PROMPT` (print mode: one turn, its tool calls included, then the answer on stdout) with
 * Claude Code's default settings, configured as the README says: `ANTHROPIC_BASE_URL` (Tollgate, no
 * `/v1`), a key, and whatever else `env` sets (`ANTHROPIC_CUSTOM_HEADERS`, `ANTHROPIC_MODEL`).
 */
export async function runClaude(
  prompt: string,
  env: Record<string, string>,
  dirs: AgentDirs,
  timeoutMs = 60_000,
): Promise<AgentRun> {
  const bin = claudeBinary();
  if (!bin) throw new Error('@anthropic-ai/claude-code is not installed (npm ci)');
  return runAgent(bin, ['-p', prompt], {
    cwd: dirs.work,
    timeoutMs,
    env: {
      HOME: dirs.home,
      CLAUDE_CONFIG_DIR: join(dirs.home, '.claude'),
      ...CLAUDE_OFFLINE,
      ...env,
    },
  });
}

/**
 * A Codex `config.toml` for a Tollgate at `baseUrl` (with `/v1`): the provider `tollgate` (Responses
 * API, the key read from `env_key`, extra headers) as the default, and analytics, feedback, OpenTelemetry
 * export and the update check off.
 */
export function codexConfig(options: {
  baseUrl: string;
  model: string;
  envKey: string;
  headers?: Record<string, string>;
}): string {
  const headers = Object.entries(options.headers ?? {})
    .map(([k, v]) => `${JSON.stringify(k)} = ${JSON.stringify(v)}`)
    .join(', ');
  return [
    `model = ${JSON.stringify(options.model)}`,
    'model_provider = "tollgate"',
    'check_for_update_on_startup = false',
    '',
    '[model_providers.tollgate]',
    'name = "Tollgate"',
    `base_url = ${JSON.stringify(options.baseUrl)}`,
    `env_key = ${JSON.stringify(options.envKey)}`,
    'wire_api = "responses"',
    ...(headers ? [`http_headers = { ${headers} }`] : []),
    '',
    '[analytics]',
    'enabled = false',
    '',
    '[feedback]',
    'enabled = false',
    '',
    '[otel]',
    'exporter = "none"',
    '',
  ].join('\n');
}

/**
 * `codex exec PROMPT` (one turn, its tool calls included, non-interactive) with Codex's default
 * settings (its sandbox, its approval policy) and `config` as `$CODEX_HOME/config.toml`; `env` gives
 * the key variable the config names.
 */
export async function runCodex(
  prompt: string,
  config: string,
  env: Record<string, string>,
  dirs: AgentDirs,
  timeoutMs = 60_000,
): Promise<AgentRun> {
  const launcher = codexLauncher();
  if (!launcher) throw new Error('@openai/codex is not installed (npm ci)');
  const codexHome = join(dirs.home, '.codex');
  mkdirSync(codexHome, { recursive: true });
  writeFileSync(join(codexHome, 'config.toml'), config);
  return runAgent(process.execPath, [launcher, 'exec', '--skip-git-repo-check', prompt], {
    cwd: dirs.work,
    timeoutMs,
    env: { HOME: dirs.home, CODEX_HOME: codexHome, ...env },
  });
}
