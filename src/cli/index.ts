import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from '../config/index.ts';
import { ApiError } from '../core/errors.ts';
import {
  COMMANDS,
  commandHelp,
  didYouMean,
  findCommand,
  globalHelp,
  OPTIONS,
  unknownCommandMessage,
} from './commands.ts';
import { createOutput, UsageError } from './output.ts';

/** Entry point of the `tollgate` binary. Returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  // A lenient pass finds the command and any unknown option (reported below with a suggestion); the
  // strict pass then types the values and reports a missing option value.
  const loose = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: false });
  const given = Object.keys(loose.values);
  let parsed: ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>;
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
  const [command, sub] = positionals;
  const out = createOutput(values.json === true);
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
  try {
    const config = loadConfig();
    switch (command) {
      case 'proxy':
        // Servers load their modules on demand, so admin commands start fast.
        return await (await import('./serve.ts')).runProxy(config, { migrate: Boolean(values.migrate) });
      case 'dev':
        return await (await import('./serve.ts')).runDev(config);
      case 'operator': {
        const { runOperator } = await import('./operator.ts');
        return await runOperator(config, { namespaces: values.namespace ?? [] });
      }
      case 'worker':
        return await (await import('../webhooks/cli.ts')).runWorker(config);
      case 'webhooks':
        await (await import('../webhooks/cli.ts')).webhooksCommand(
          config,
          sub,
          positionals[2],
          out,
          (m) => new UsageError(m),
        );
        return 0;
      case 'migrate':
        return await (await import('./admin.ts')).withContext(config, async (ctx) => {
          const applied = await ctx.migrate();
          out.result(
            { applied },
            applied.length ? `Applied ${applied.join(', ')}` : 'Database is up to date',
          );
          return 0;
        });
      case 'keys':
        // Always on the database directly: it needs the key ring, not an admin token.
        return await (await import('./admin.ts')).withContext(config, async (ctx) => {
          const { rotateKeys } = await import('../app/key-rotation.ts');
          const batch = optionalNumber(values.batch, 'batch');
          const result = await rotateKeys(ctx.db, ctx.sealer, { log: ctx.log, ...(batch ? { batch } : {}) });
          const total = Object.values(result.resealed).reduce((a, b) => a + b, 0);
          out.result(
            result,
            `Re-sealed ${total} secret(s) with key ${result.activeKeyId}; it is now the database's key. Keep the old key in TOLLGATE_ENCRYPTION_KEYS until the links it signed have expired, then remove it.`,
          );
          return 0;
        });
      case 'payments': {
        const payments = await import('../payments/cli.ts');
        if (config.TOLLGATE_URL && config.TOLLGATE_ADMIN_TOKEN) {
          const { adminClient } = await import('./remote.ts');
          const client = adminClient(config.TOLLGATE_URL, config.TOLLGATE_ADMIN_TOKEN);
          await payments.paymentsCommand(payments.remotePaymentsApi(client), sub, values, out);
          return 0;
        }
        return await (await import('./admin.ts')).withContext(config, async (ctx) => {
          await payments.paymentsCommand(payments.localPaymentsApi(ctx), sub, values, out);
          return 0;
        });
      }
      default: {
        // With TOLLGATE_URL the admin commands go to that server's admin API (./remote.ts).
        if (config.TOLLGATE_URL) {
          if (!config.TOLLGATE_ADMIN_TOKEN)
            throw new UsageError(
              'TOLLGATE_URL is set but TOLLGATE_ADMIN_TOKEN is not: set both (as `tollgate dev` prints them), or unset TOLLGATE_URL to use the database directly',
            );
          const { adminClient, remoteAdminCommand } = await import('./remote.ts');
          await remoteAdminCommand(
            adminClient(config.TOLLGATE_URL, config.TOLLGATE_ADMIN_TOKEN),
            spec.name,
            values,
            out,
          );
          return 0;
        }
        await (await import('./admin.ts')).adminCommand(config, command, sub, values, out);
        return 0;
      }
    }
  } catch (err) {
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

/** An option that must be a positive whole number when given. */
function optionalNumber(value: unknown, name: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 100_000)
    throw new UsageError(`--${name} must be a whole number from 1 to 100000`);
  return n;
}
