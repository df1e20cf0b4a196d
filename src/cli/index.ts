import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from '../config/index.ts';
import { ApiError } from '../core/errors.ts';
import { createOutput, UsageError } from './output.ts';

const HELP = `tollgate — metered, OpenAI-compatible chat proxy with a paywall

Usage: tollgate <command> [options]      (add --json for machine-readable output)

Servers
  proxy [--migrate]                  serve /v1 on PORT (default 8080)
  operator [--namespace NS]...       Kubernetes operator: reconcile WebhookSubscriptions, deliver webhooks
  dev                                everything in one process on the embedded database, with a demo project
  migrate                            apply database migrations
  worker                             deliver webhooks (fan-out and delivery) without the operator

Projects and keys
  project create --name N [--currency usd] [--upstream-url U --upstream-key K] [--checkout-url U] [--return-url U]
  project show --project ID
  project set --project ID [--name N] [--upstream-url U] [--upstream-key K] [--checkout-url U] [--return-url U]
              [--connect-message T] [--topup-message T] [--max-completion-tokens N]
  key create --project ID [--name N]
  key list --project ID
  key revoke --key KEY_ID

Models and users
  models apply --project ID --file pricing.yaml
  users connect --project ID --user U
  users deposit --project ID --user U --amount 10.00
  users spend-caps --project ID --user U [--daily 1.00] [--monthly 20.00]   (none: the project's caps)

Providers and routes (routes and limits are in the pricing file)
  providers add --project ID --name N --base-url U [--key K] [--connect-timeout-ms N] [--response-timeout-ms N]
  providers list --project ID
  providers remove --project ID --name N

Webhooks
  webhooks enable ID                 re-enable a deactivated subscription
  webhooks disable ID                deactivate a subscription (as REST DELETE does)

Configuration comes from environment variables; see the README.`;

const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  migrate: { type: 'boolean' },
  name: { type: 'string' },
  currency: { type: 'string' },
  'upstream-url': { type: 'string' },
  'upstream-key': { type: 'string' },
  'checkout-url': { type: 'string' },
  'return-url': { type: 'string' },
  'connect-message': { type: 'string' },
  'topup-message': { type: 'string' },
  'max-completion-tokens': { type: 'string' },
  project: { type: 'string' },
  key: { type: 'string' },
  file: { type: 'string' },
  user: { type: 'string' },
  amount: { type: 'string' },
  'base-url': { type: 'string' },
  'connect-timeout-ms': { type: 'string' },
  'response-timeout-ms': { type: 'string' },
  daily: { type: 'string' },
  monthly: { type: 'string' },
  namespace: { type: 'string', multiple: true },
} as const;

/** Entry point of the `tollgate` binary. Returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>;
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    process.stderr.write(`error: ${(err as Error).message}\n\n${HELP}\n`);
    return 2;
  }
  const { values, positionals } = parsed;
  const [command, sub] = positionals;
  const out = createOutput(Boolean(values.json));
  if (!command || values.help || command === 'help') {
    process.stdout.write(`${HELP}\n`);
    return command || values.help ? 0 : 2;
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
        const { runOperator } = await import('../operator/main.ts');
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
      default:
        await (await import('./admin.ts')).adminCommand(config, command, sub, values, out);
        return 0;
    }
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      return 2;
    }
    if (err instanceof UsageError) {
      process.stderr.write(`error: ${err.message}\n\nRun \`tollgate --help\` for usage.\n`);
      return 2;
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
