/**
 * The commands of the `tollgate` binary: each one's usage line, summary, help text and the options it
 * takes. `tollgate <command> --help` prints the command's own help; an unknown command or option gets a
 * "did you mean" from this table.
 */
export interface CommandSpec {
  /** e.g. `project create` */
  name: string;
  usage: string;
  summary: string;
  /** Extra lines for `--help`. */
  details?: string[];
  /** Long option names the command accepts (besides --json and --help). */
  options: string[];
  group:
    | 'Servers'
    | 'Projects and keys'
    | 'Models and users'
    | 'Providers and routes'
    | 'Payments'
    | 'Webhooks';
}

export const COMMANDS: CommandSpec[] = [
  {
    name: 'proxy',
    usage: 'proxy [--migrate]',
    summary: 'serve /v1, /admin/v1, /dashboard, hosted pages and /metrics on PORT (default 8080)',
    details: ['--migrate   apply pending migrations before serving'],
    options: ['migrate'],
    group: 'Servers',
  },
  {
    name: 'operator',
    usage: 'operator [--namespace NS]...',
    summary: 'Kubernetes operator: reconcile WebhookSubscriptions, deliver webhooks',
    details: ['--namespace NS   watch only this namespace (repeatable; default: every namespace)'],
    options: ['namespace'],
    group: 'Servers',
  },
  {
    name: 'dev',
    usage: 'dev',
    summary: 'everything in one process on the embedded database, with a demo project',
    details: [
      'Listens on 127.0.0.1 unless HOST is set; prints the dashboard URL, a first admin login, a live',
      'API key, and the TOLLGATE_URL / TOLLGATE_ADMIN_TOKEN to use the CLI against it.',
    ],
    options: [],
    group: 'Servers',
  },
  {
    name: 'keys rotate',
    usage: 'keys rotate [--batch 200]',
    summary:
      're-seal every stored secret with the first key of TOLLGATE_ENCRYPTION_KEYS while the proxies serve (always on the database directly)',
    options: ['batch'],
    group: 'Servers',
  },
  {
    name: 'migrate',
    usage: 'migrate',
    summary: 'apply database migrations (always on the database directly)',
    options: [],
    group: 'Servers',
  },
  {
    name: 'worker',
    usage: 'worker',
    summary: 'deliver webhooks (fan-out and delivery) without the operator',
    options: [],
    group: 'Servers',
  },
  {
    name: 'project create',
    usage:
      'project create --name N [--currency usd] [--upstream-url U --upstream-key K] [--checkout-url U] [--return-url U]',
    summary: 'create a project (paywall) and its first API key (shown once)',
    options: ['name', 'currency', 'upstream-url', 'upstream-key', 'checkout-url', 'return-url'],
    group: 'Projects and keys',
  },
  {
    name: 'invite create',
    usage: 'invite create --email E [--days 7]',
    summary: 'an invite code for one developer e-mail (TOLLGATE_SIGNUP=invite) and its sign-up link',
    details: [
      'The code admits that address only, until it expires (1 to 90 days); send the link, which opens',
      "the dashboard's sign-up form with the code filled in. Over the admin API it needs a full-access token.",
    ],
    options: ['email', 'days'],
    group: 'Projects and keys',
  },
  {
    name: 'project list',
    usage: 'project list',
    summary: 'list projects (over the admin API: TOLLGATE_URL and TOLLGATE_ADMIN_TOKEN)',
    options: [],
    group: 'Projects and keys',
  },
  {
    name: 'project show',
    usage: 'project show --project ID',
    summary: 'show a project and its settings',
    options: ['project'],
    group: 'Projects and keys',
  },
  {
    name: 'project set',
    usage:
      'project set --project ID [--name N] [--upstream-url U] [--upstream-key K] [--checkout-url U] [--return-url U] [--connect-message T] [--topup-message T] [--max-completion-tokens N] [--debt-limit AMOUNT]',
    summary: 'change a project: name, provider, links and messages, bounds',
    options: [
      'project',
      'name',
      'upstream-url',
      'upstream-key',
      'checkout-url',
      'return-url',
      'connect-message',
      'topup-message',
      'max-completion-tokens',
      'debt-limit',
    ],
    group: 'Projects and keys',
  },
  {
    name: 'key create',
    usage: 'key create --project ID [--name N]',
    summary: 'create an API key (shown once)',
    options: ['project', 'name'],
    group: 'Projects and keys',
  },
  {
    name: 'key list',
    usage: 'key list --project ID',
    summary: "list a project's API keys",
    options: ['project'],
    group: 'Projects and keys',
  },
  {
    name: 'key revoke',
    usage: 'key revoke --key KEY_ID [--project ID]',
    summary: 'revoke an API key (every proxy stops accepting it at once)',
    details: ['--project is required over the admin API (TOLLGATE_URL), optional on the database.'],
    options: ['key', 'project'],
    group: 'Projects and keys',
  },
  {
    name: 'models apply',
    usage: 'models apply --project ID --file pricing.yaml',
    summary: "make the project's models exactly those of the pricing file (see examples/pricing.yaml)",
    options: ['project', 'file'],
    group: 'Models and users',
  },
  {
    name: 'models list',
    usage: 'models list --project ID',
    summary: "list the project's models with their prices and hold margins",
    options: ['project'],
    group: 'Models and users',
  },
  {
    name: 'users connect',
    usage: 'users connect --project ID --user U',
    summary: 'connect an end user to the paywall',
    options: ['project', 'user'],
    group: 'Models and users',
  },
  {
    name: 'users show',
    usage: 'users show --project ID --user U',
    summary: "an end user's balance, what requests in flight hold, what is available, paid and credits",
    options: ['project', 'user'],
    group: 'Models and users',
  },
  {
    name: 'users list',
    usage: 'users list --project ID [--search TEXT] [--limit 100]',
    summary: "the project's end users with their balances (ids containing --search)",
    options: ['project', 'search', 'limit'],
    group: 'Models and users',
  },
  {
    name: 'users deposit',
    usage: 'users deposit --project ID --user U --amount 10.00',
    summary: "credit an end user's balance",
    options: ['project', 'user', 'amount'],
    group: 'Models and users',
  },
  {
    name: 'users grant',
    usage:
      'users grant --project ID --user U --amount 5.00 --reason promo [--priority N] [--expires 2027-01-31T00:00:00Z]',
    summary: 'grant credit (not money: spent before paid balance, may expire) to an end user',
    options: ['project', 'user', 'amount', 'reason', 'priority', 'expires'],
    group: 'Models and users',
  },
  {
    name: 'users spend-caps',
    usage: 'users spend-caps --project ID --user U [--daily 1.00] [--monthly 20.00]',
    summary: "set an end user's own daily and monthly spend caps (none: the project's caps apply)",
    options: ['project', 'user', 'daily', 'monthly'],
    group: 'Models and users',
  },
  {
    name: 'users keys create',
    usage:
      'users keys create --project ID --user U --name N [--expires 2027-01-31T00:00:00Z] [--spend-cap 20.00]',
    summary: 'create an end-user key (tgu_…, shown once): it authenticates the model APIs as that user',
    details: [
      "--spend-cap sets the user's own monthly spend cap (as users spend-caps --monthly).",
      '--expires: after it the key is refused (401).',
    ],
    options: ['project', 'user', 'name', 'expires', 'spend-cap'],
    group: 'Models and users',
  },
  {
    name: 'users keys list',
    usage: 'users keys list --project ID --user U',
    summary: "list an end user's keys (never the secret)",
    options: ['project', 'user'],
    group: 'Models and users',
  },
  {
    name: 'users keys revoke',
    usage: 'users keys revoke --project ID --key KEY_ID',
    summary: 'revoke an end-user key (every proxy stops accepting it at once)',
    options: ['project', 'key'],
    group: 'Models and users',
  },
  {
    name: 'providers add',
    usage:
      'providers add --project ID --name N --base-url U [--kind openai-compatible|anthropic] [--key K] [--connect-timeout-ms N] [--response-timeout-ms N]',
    summary: 'add (or change) a named provider of the project; routes in the pricing file name it',
    options: ['project', 'name', 'base-url', 'kind', 'key', 'connect-timeout-ms', 'response-timeout-ms'],
    group: 'Providers and routes',
  },
  {
    name: 'providers list',
    usage: 'providers list --project ID',
    summary: "list the project's providers (keys are never shown)",
    options: ['project'],
    group: 'Providers and routes',
  },
  {
    name: 'providers remove',
    usage: 'providers remove --project ID --name N',
    summary: 'remove a provider',
    options: ['project', 'name'],
    group: 'Providers and routes',
  },
  {
    name: 'payments connect',
    usage:
      'payments connect --project ID (--stripe-key sk_… [--webhook-secret whsec_…] | --provider test) [--presets 5,10,20] [--minimum 5] [--maximum 500]',
    summary: 'connect Stripe: the key is checked live and sealed; the webhook endpoint is created for you',
    details: [
      '--webhook-secret   the signing secret of an endpoint you made by hand (then none is created)',
      '--provider test    test payments instead: a test checkout, no key (only where TOLLGATE_TEST_PAYMENTS is on)',
      'The webhook URL is PUBLIC_BASE_URL/payments/stripe/PROJECT/webhook: set PUBLIC_BASE_URL first.',
    ],
    options: ['project', 'stripe-key', 'webhook-secret', 'provider', 'presets', 'minimum', 'maximum'],
    group: 'Payments',
  },
  {
    name: 'payments show',
    usage: 'payments show --project ID',
    summary: "show the project's payment provider (the key is never shown)",
    options: ['project'],
    group: 'Payments',
  },
  {
    name: 'payments disconnect',
    usage: 'payments disconnect --project ID',
    summary: 'disconnect the payment provider (deletes the webhook endpoint Tollgate created)',
    options: ['project'],
    group: 'Payments',
  },
  {
    name: 'payments list',
    usage: 'payments list --project ID [--user U]',
    summary: 'list top-ups paid through the provider, newest first',
    options: ['project', 'user'],
    group: 'Payments',
  },
  {
    name: 'payments auto-recharge',
    usage:
      'payments auto-recharge --project ID --offered on|off [--threshold 2] [--amount 10] [--monthly-cap 50]',
    summary:
      "offer automatic recharge of users' saved cards below a threshold, within a monthly cap per user",
    options: ['project', 'offered', 'threshold', 'amount', 'monthly-cap'],
    group: 'Payments',
  },
  {
    name: 'payments refund',
    usage: 'payments refund --project ID --payment PAY_ID [--amount 5.00]',
    summary: "refund (part of) a top-up through Stripe; the webhook debits the user's balance",
    options: ['project', 'payment', 'amount'],
    group: 'Payments',
  },
  {
    name: 'webhooks enable',
    usage: 'webhooks enable ID',
    summary: 're-enable a deactivated subscription',
    options: [],
    group: 'Webhooks',
  },
  {
    name: 'webhooks disable',
    usage: 'webhooks disable ID',
    summary: 'deactivate a subscription (as REST DELETE does)',
    options: [],
    group: 'Webhooks',
  },
];

/**
 * Every option any command takes, for node's parseArgs: the flags, and (in alphabetical order) the options
 * that take a text value.
 */
export const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  migrate: { type: 'boolean' },
  namespace: { type: 'string', multiple: true },
  ...textOptions(
    'amount',
    'base-url',
    'batch',
    'checkout-url',
    'connect-message',
    'connect-timeout-ms',
    'currency',
    'daily',
    'days',
    'debt-limit',
    'email',
    'expires',
    'file',
    'key',
    'kind',
    'limit',
    'max-completion-tokens',
    'maximum',
    'minimum',
    'monthly',
    'monthly-cap',
    'name',
    'offered',
    'payment',
    'presets',
    'priority',
    'project',
    'provider',
    'reason',
    'response-timeout-ms',
    'return-url',
    'search',
    'spend-cap',
    'stripe-key',
    'threshold',
    'topup-message',
    'upstream-key',
    'upstream-url',
    'user',
    'webhook-secret',
  ),
} as const;

function textOptions<const K extends string>(...names: K[]): Record<K, { type: 'string' }> {
  return Object.fromEntries(names.map((name) => [name, { type: 'string' }])) as Record<K, { type: 'string' }>;
}

export function globalHelp(): string {
  const width = 36;
  const lines = [
    'tollgate — metered, OpenAI-compatible chat proxy with a paywall',
    '',
    'Usage: tollgate <command> [options]      (add --json for machine-readable output)',
    '       tollgate <command> --help         (the command’s own help)',
  ];
  for (const group of [
    'Servers',
    'Projects and keys',
    'Models and users',
    'Providers and routes',
    'Payments',
    'Webhooks',
  ] as const) {
    lines.push('', group);
    for (const c of COMMANDS.filter((x) => x.group === group)) {
      const head = c.name.includes(' ') ? `${c.name} …` : c.usage;
      lines.push(`  ${head.padEnd(width)}${c.summary}`);
    }
  }
  lines.push(
    '',
    'Admin commands (project, key, models, users, payments) talk to a running server over its admin API when',
    'TOLLGATE_URL and TOLLGATE_ADMIN_TOKEN are set, and to the database directly otherwise.',
    'Configuration comes from environment variables; see docs/configuration.md.',
  );
  return lines.join('\n');
}

export function commandHelp(spec: CommandSpec): string {
  const lines = [`Usage: tollgate ${spec.usage}`, '', spec.summary];
  if (spec.details?.length) lines.push('', ...spec.details);
  lines.push('', 'Options common to every command: --json (machine-readable output), --help');
  return lines.join('\n');
}

/** Edit distance (Levenshtein) between two short strings. */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const next = Math.min(row[j]! + 1, row[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = row[j]!;
      row[j] = next;
    }
  }
  return row[b.length]!;
}

/** The closest candidate when it is close enough to be what was meant. */
export function didYouMean(input: string, candidates: string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const c of candidates) {
    const d = c.startsWith(input) || input.startsWith(c) ? 1 : distance(input, c);
    if (d < bestDistance) {
      best = c;
      bestDistance = d;
    }
  }
  return best !== undefined && bestDistance <= Math.max(2, Math.floor(input.length / 3)) ? best : undefined;
}

/** Finds the command named by the positionals: two words (`project create`) or one (`dev`). */
export function findCommand(positionals: string[]): CommandSpec | undefined {
  const [first, second, third] = positionals;
  return (
    COMMANDS.find((c) => third !== undefined && c.name === `${first} ${second} ${third}`) ??
    COMMANDS.find((c) => c.name === `${first} ${second ?? ''}`.trim()) ??
    COMMANDS.find((c) => c.name === first)
  );
}

/** The message for positionals that name no command. */
export function unknownCommandMessage(positionals: string[]): string {
  const [first, second] = positionals;
  const groups = [...new Set(COMMANDS.map((c) => c.name.split(' ')[0]!))];
  const subs = COMMANDS.filter((c) => c.name.startsWith(`${first} `)).map((c) => c.name.split(' ')[1]!);
  if (subs.length) {
    const wanted = second ?? '';
    const hint = wanted ? didYouMean(wanted, subs) : undefined;
    return `unknown command: ${`${first} ${wanted}`.trim()}${hint ? ` (did you mean \`${first} ${hint}\`?)` : ''}; ${first} takes ${subs.join(', ')}`;
  }
  const hint = didYouMean(first ?? '', groups);
  return `unknown command: ${first}${hint ? ` (did you mean \`${hint}\`?)` : ''}`;
}
