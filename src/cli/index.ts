import { parseArgs } from 'node:util';
import { UsageError } from '../admin/operations.ts';
import { type Config, ConfigError, loadConfig } from '../config/index.ts';
import { ApiError } from '../core/errors.ts';
import {
  COMMANDS,
  type CommandSpec,
  commandHelp,
  didYouMean,
  findCommand,
  globalHelp,
  OPTIONS,
  unknownCommandMessage,
} from './commands.ts';
import { createOutput, type Output } from './output.ts';
import { optionalNumber } from './values.ts';

/**
 * The `tollgate` binary: parses the command line against the command specs (./commands.ts), then runs
 * a server or maintenance command in this process (`LOCAL_COMMANDS` below: ./serve.ts, ./worker.ts,
 * the operator, migrations, key rotation), or an admin command of ./admin-commands.ts on the admin
 * operations — on the database (../admin/local.ts, with a context of ./context.ts) or over a running
 * server's admin API (../admin/remote.ts).
 */

type Parsed = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>;

/** Entry point of the `tollgate` binary. Returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  // A lenient pass finds the command and any unknown option (reported below with a suggestion); the
  // strict pass then types the values and reports a missing option value.
  const loose = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: false });
  const given = Object.keys(loose.values);
  let parsed: Parsed;
  try {
    const known = Object.fromEntries(
      Object.entries(OPTIONS).filter(([k]) => given.includes(k) || k === 'help'),
    );
    parsed = parseArgs({
      args: argv.filter((a) => !unknownFlag(a, given)),
      options: known as typeof OPTIONS,
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    return usage(`${(err as Error).message}`);
  }
  const { values, positionals } = parsed;
  const [command] = positionals;
  if (!command || command === 'help') {
    const spec = command === 'help' ? findCommand(positionals.slice(1)) : undefined;
    process.stdout.write(`${spec ? commandHelp(spec) : globalHelp()}\n`);
    return command || values.help ? 0 : 2;
  }
  const spec = findCommand(positionals);
  const group = COMMANDS.filter((c) => c.name.startsWith(`${command} `));
  if (!spec && values.help && group.length) {
    process.stdout.write(`${group.map((c) => `tollgate ${c.usage}\n    ${c.summary}`).join('\n')}\n`);
    return 0;
  }
  if (!spec) return usage(unknownCommandMessage(positionals));
  if (values.help) {
    process.stdout.write(`${commandHelp(spec)}\n`);
    return 0;
  }
  const accepted = ['json', 'help', ...spec.options];
  for (const name of given) {
    if (accepted.includes(name)) continue;
    const hint = didYouMean(name, spec.options);
    const known = name in OPTIONS ? ` is not an option of \`tollgate ${spec.name}\`` : ' is not an option';
    return usage(
      `--${name}${known}${hint ? ` (did you mean --${hint}?)` : ''}`,
      `Run \`tollgate ${spec.name} --help\` for its options.`,
    );
  }
  const out = createOutput(values.json === true);
  try {
    return await run(spec, parsed, out);
  } catch (err) {
    return failed(err, spec, out);
  }
}

/** Runs a known command: a server or maintenance command, or an admin command on its side. */
async function run(spec: CommandSpec, { values, positionals }: Parsed, out: Output): Promise<number> {
  const config = loadConfig();
  const local = LOCAL_COMMANDS[spec.name];
  if (local) return local(config, values, out);
  // The admin commands load with their first use, so `--help` and the servers start fast.
  const command = (await import('./admin-commands.ts')).ADMIN_COMMANDS[spec.name];
  if (!command) throw new UsageError(`unknown command: ${spec.name}`);
  const rest = positionals.slice(spec.name.split(' ').length);
  if (overHttp(config, spec.name)) {
    if (command.database)
      throw new UsageError(
        `\`tollgate ${spec.name}\` works on the database only: unset TOLLGATE_URL to run it`,
      );
    const { adminClient, remoteAdmin } = await import('../admin/remote.ts');
    const api = remoteAdmin(adminClient(config.TOLLGATE_URL!, config.TOLLGATE_ADMIN_TOKEN!));
    await command.run({ api, values, rest, out });
    return 0;
  }
  const { withContext } = await import('./context.ts');
  const { localAdmin } = await import('../admin/local.ts');
  await withContext(config, (ctx) => command.run({ api: localAdmin(ctx), values, rest, out }));
  return 0;
}

/**
 * Whether an admin command goes to a running server's admin API: when TOLLGATE_URL is set (and then
 * TOLLGATE_ADMIN_TOKEN must be). `webhooks` always works on the database; `payments` only goes over
 * HTTP when both are set.
 */
function overHttp(config: Config, name: string): boolean {
  const group = name.split(' ')[0];
  if (!config.TOLLGATE_URL || group === 'webhooks') return false;
  if (config.TOLLGATE_ADMIN_TOKEN) return true;
  if (group === 'payments') return false;
  throw new UsageError(
    'TOLLGATE_URL is set but TOLLGATE_ADMIN_TOKEN is not: set both (as `tollgate dev` prints them), or unset TOLLGATE_URL to use the database directly',
  );
}

/** The commands that always run in this process: servers and maintenance. */
const LOCAL_COMMANDS: Record<
  string,
  (config: Config, values: Parsed['values'], out: Output) => Promise<number>
> = {
  // Servers load their modules on demand, so admin commands start fast.
  proxy: async (config, values) =>
    (await import('./serve.ts')).runProxy(config, { migrate: Boolean(values.migrate) }),
  dev: async (config) => (await import('./serve.ts')).runDev(config),
  operator: async (config, values) =>
    (await import('./operator.ts')).runOperator(config, { namespaces: values.namespace ?? [] }),
  worker: async (config) => (await import('./worker.ts')).runWorker(config),
  migrate: async (config, _values, out) =>
    (await import('./context.ts')).withContext(config, async (ctx) => {
      const applied = await ctx.migrate();
      out.result({ applied }, applied.length ? `Applied ${applied.join(', ')}` : 'Database is up to date');
      return 0;
    }),
  // Always on the database directly: it needs the key ring, not an admin token.
  'keys rotate': async (config, values, out) =>
    (await import('./context.ts')).withContext(config, async (ctx) => {
      const { rotateKeys } = await import('../app/key-rotation.ts');
      const batch = optionalNumber(values.batch, 'batch');
      const result = await rotateKeys(ctx.db, ctx.sealer, { log: ctx.log, ...(batch ? { batch } : {}) });
      const total = Object.values(result.resealed).reduce((a, b) => a + b, 0);
      const unopenable = Object.entries(result.unopenable).map(([column, n]) => `${n} in ${column}`);
      out.result(
        result,
        `Re-sealed ${total} secret(s) with key ${result.activeKeyId}; it is now the database's key. Keep the old key in TOLLGATE_ENCRYPTION_KEYS until the links it signed have expired, then remove it.${
          unopenable.length
            ? `\nNot re-sealed: ${unopenable.join(', ')} — no key of the ring opens them (see the log); set those secrets again.`
            : ''
        }`,
      );
      // every other secret was re-sealed; the exit status says some could not be
      return unopenable.length ? 1 : 0;
    }),
};

/** The exit code of a command that threw: 2 for a mistake in the call, 1 for a failure. */
function failed(err: unknown, spec: CommandSpec, out: Output): number {
  if (err instanceof ConfigError) {
    process.stderr.write(`${err.message}\n`);
    return 2;
  }
  if (err instanceof UsageError) {
    return usage(err.message, `Run \`tollgate ${spec.name} --help\` for usage.`);
  }
  if (err instanceof ApiError) {
    const param = err.param ? ` (${err.param})` : '';
    if (out.json) process.stdout.write(`${JSON.stringify(err.toBody(), null, 2)}\n`);
    process.stderr.write(`error${param}: ${err.message}\n`);
    return 1;
  }
  process.stderr.write(`error: ${(err as Error).message}\n`);
  return 1;
}

/** A mistake in how the binary was called: one line and where to look, exit code 2. */
function usage(message: string, pointer = 'Run `tollgate --help` for the commands.'): number {
  process.stderr.write(`error: ${message}\n${pointer}\n`);
  return 2;
}

/** An argument `--x` or `--x=…` whose option name is not one the binary knows. */
function unknownFlag(arg: string, given: string[]): boolean {
  const match = /^--([^=]+)/.exec(arg);
  return Boolean(match && given.includes(match[1]!) && !(match[1]! in OPTIONS));
}
