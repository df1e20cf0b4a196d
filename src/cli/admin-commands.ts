import type { AdminOperations, DatabaseOperations, Json } from '../admin/operations.ts';
import { UsageError } from '../admin/operations.ts';
import { modelLine } from '../models/service.ts';
import type { Output } from './output.ts';
import {
  days,
  grantInputFrom,
  grantSummary,
  optional,
  optionalNumber,
  pricingFileFrom,
  required,
  settingsFrom,
  type Values,
} from './values.ts';

/**
 * The admin commands — projects, keys, models, users, invites, providers, payments, webhooks — as one
 * table over the admin operations (../admin/operations.ts): each command reads its options, calls one
 * operation and prints the answer. The same command runs on the database (../admin/local.ts) or over
 * the admin API (../admin/remote.ts); `database` marks the commands only the database side does.
 */

/** What a command is given: the operations, its options, the words after it, and where it prints. */
export interface CommandInput<A> {
  api: A;
  values: Values;
  /** The positionals after the command's name (`webhooks enable ID`: the id). */
  rest: string[];
  out: Output;
}

export type AdminCommand =
  | { database?: false; run(input: CommandInput<AdminOperations>): Promise<void> }
  | { database: true; run(input: CommandInput<DatabaseOperations>): Promise<void> };

/** A command either side runs. */
const both = (run: (input: CommandInput<AdminOperations>) => Promise<void>): AdminCommand => ({ run });
/** A command only the database side runs. */
const databaseOnly = (run: (input: CommandInput<DatabaseOperations>) => Promise<void>): AdminCommand => ({
  database: true,
  run,
});

const projectCommands: Record<string, AdminCommand> = {
  'project create': both(async ({ api, values, out }) => {
    const created = await api.createProject({
      name: required(values, 'name'),
      currency: optional(values, 'currency') ?? 'usd',
      upstreamUrl: optional(values, 'upstream-url'),
      upstreamKey: optional(values, 'upstream-key'),
      settings: settingsFrom(values),
    });
    out.result(
      { id: created.id, apiKey: created.apiKey, apiKeyId: created.apiKeyId, currency: created.currency },
      [
        `Created project ${created.id} (${created.name}, ${created.currency})`,
        `API key (shown once, keep it safe): ${created.apiKey}`,
      ],
    );
  }),
  'project list': both(async ({ api, out }) => {
    const projects = await api.listProjects();
    out.result(
      projects,
      projects.length
        ? projects.map(
            (p) =>
              `${p.id}  ${p.name}  ${p.currency}  ${p.upstreamUrl ?? p.provider?.baseUrl ?? '(no provider)'}`,
          )
        : ['no projects'],
    );
  }),
  'project show': both(async ({ api, values, out }) => {
    const view = await api.showProject(required(values, 'project'));
    out.result(
      view,
      Object.entries(view).map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`),
    );
  }),
  'project set': both(async ({ api, values, out }) => {
    const id = required(values, 'project');
    const updated = await api.updateProject(id, {
      name: optional(values, 'name'),
      upstreamUrl: optional(values, 'upstream-url'),
      upstreamKey: optional(values, 'upstream-key'),
      settings: settingsFrom(values),
    });
    out.result(updated, `Updated project ${id}`);
  }),
  'key create': both(async ({ api, values, out }) => {
    const created = await api.createKey(required(values, 'project'), optional(values, 'name') ?? 'default');
    out.result(created, [
      `Created key ${created.id} (${created.prefix}…)`,
      `API key (shown once, keep it safe): ${created.apiKey}`,
    ]);
  }),
  'key list': both(async ({ api, values, out }) => {
    const keys = await api.listKeys(required(values, 'project'));
    out.result(
      keys,
      keys.length
        ? keys.map((k) => `${k.id}  ${k.prefix}…  ${k.name}  ${k.revokedAt ? 'revoked' : 'active'}`)
        : ['no keys'],
    );
  }),
  'key revoke': both(async ({ api, values, out }) => {
    const keyId = required(values, 'key');
    const revoked = await api.revokeKey(keyId, optional(values, 'project'));
    out.result(
      revoked,
      revoked.propagated
        ? `Revoked key ${keyId}`
        : `Revoked key ${keyId}; Redis was unreachable, so running proxies stop accepting it within 5 minutes`,
    );
  }),
  'invite create': both(async ({ api, values, out }) => {
    const invite = await api.createInvite(required(values, 'email'), days(values));
    out.result(invite, [`Invite for ${invite.email} (until ${invite.expiresAt}):`, invite.url]);
  }),
};

const modelAndUserCommands: Record<string, AdminCommand> = {
  'models apply': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const result = await api.applyModels(projectId, pricingFileFrom(values));
    out.result(result, [
      `Applied ${values.file} to ${projectId}:`,
      `  created: ${result.created.join(', ') || '-'}`,
      `  updated: ${result.updated.join(', ') || '-'}`,
      `  deleted: ${result.deleted.join(', ') || '-'}`,
    ]);
  }),
  'models list': both(async ({ api, values, out }) => {
    const pricing = await api.listModels(required(values, 'project'));
    out.result(pricing, pricing.models.length ? pricing.models.map(modelLine) : ['no models']);
  }),
  'users connect': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const user = required(values, 'user');
    const result = await api.connectUser(projectId, user);
    out.result(result, result.changed ? `Connected ${user}` : `${user} was already connected`);
  }),
  'users show': both(async ({ api, values, out }) => {
    const u = await api.showUser(required(values, 'project'), required(values, 'user'));
    const c = u.currency.toUpperCase();
    out.result(u, [
      `${u.user} (${u.connected ? 'connected' : 'not connected'})`,
      `  balance ${u.balance} ${c} (paid ${u.paid}, credits ${u.credits})`,
      `  held ${u.held} ${c} by requests in flight; available ${u.available} ${c}`,
    ]);
  }),
  'users list': both(async ({ api, values, out }) => {
    const limit = optionalNumber(values.limit, 'limit') ?? 100;
    if (limit > 100) throw new UsageError('--limit must be a whole number from 1 to 100');
    const page = await api.listUsers(required(values, 'project'), {
      search: optional(values, 'search'),
      limit,
    });
    const lines = page.data.map(
      (u) =>
        `${u.user}  ${u.connected ? 'connected' : 'not connected'}  balance ${u.balance}  held ${u.held}  available ${u.available} ${u.currency.toUpperCase()}`,
    );
    if (page.has_more) lines.push(`(more: the first ${limit} shown; --limit N, or --search TEXT)`);
    out.result(page, lines.length ? lines : ['no users']);
  }),
  'users deposit': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const user = required(values, 'user');
    const d = await api.deposit(projectId, user, required(values, 'amount'));
    out.result(d, `Deposited ${d.amount} ${d.currency} to ${user}; balance ${d.balance} ${d.currency}`);
  }),
  'users grant': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const result = await api.grant(projectId, grantInputFrom(values));
    out.result(result, grantSummary(result));
  }),
  'users keys create': both(async ({ api, values, out }) => {
    const user = required(values, 'user');
    const created = await api.createUserKey(required(values, 'project'), {
      user,
      name: required(values, 'name'),
      expiresAt: optional(values, 'expires'),
      spendCap: optional(values, 'spend-cap'),
    });
    out.result(created, [
      `Created key ${created.id} (${created.prefix}…) of ${user}`,
      `End-user key (shown once, keep it safe): ${created.key}`,
    ]);
  }),
  'users keys list': both(async ({ api, values, out }) => {
    const keys = await api.listUserKeys(required(values, 'project'), required(values, 'user'));
    out.result(
      keys,
      keys.length
        ? keys.map(
            (k) =>
              `${k.id}  ${k.prefix}…  ${k.name}  ${k.revokedAt ? 'revoked' : 'active'}${k.expiresAt ? `  expires ${k.expiresAt}` : ''}${k.spendCap ? `  cap ${k.spendCap}` : ''}`,
          )
        : ['no keys'],
    );
  }),
  'users keys revoke': both(async ({ api, values, out }) => {
    const keyId = required(values, 'key');
    const revoked = await api.revokeUserKey(required(values, 'project'), keyId);
    out.result(
      revoked,
      revoked.propagated
        ? `Revoked key ${keyId}`
        : `Revoked key ${keyId}; Redis was unreachable, so running proxies stop accepting it within 5 minutes`,
    );
  }),
  'users spend-caps': databaseOnly(async ({ api, values, out }) => {
    const user = required(values, 'user');
    const caps = await api.setSpendCaps(required(values, 'project'), user, {
      daily: optional(values, 'daily') ?? null,
      monthly: optional(values, 'monthly') ?? null,
    });
    out.result(
      { user, ...caps },
      `Spend caps of ${user}: daily ${caps.daily ?? '-'}, monthly ${caps.monthly ?? '-'}`,
    );
  }),
};

const providerCommands: Record<string, AdminCommand> = {
  'providers add': databaseOnly(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const connectMs = optional(values, 'connect-timeout-ms');
    const responseMs = optional(values, 'response-timeout-ms');
    const key = optional(values, 'key');
    const kind = optional(values, 'kind');
    const provider = await api.addProvider(projectId, {
      name: required(values, 'name'),
      baseUrl: required(values, 'base-url'),
      ...(key !== undefined ? { key } : {}),
      ...(kind !== undefined ? { kind } : {}),
      timeouts: {
        ...(connectMs !== undefined ? { connectMs: Number(connectMs) } : {}),
        ...(responseMs !== undefined ? { responseMs: Number(responseMs) } : {}),
      },
    });
    out.result(provider, `Provider ${provider.name} of ${projectId}: ${provider.baseUrl} (${provider.kind})`);
  }),
  'providers list': databaseOnly(async ({ api, values, out }) => {
    const providers = await api.listProviders(required(values, 'project'));
    out.result(
      providers,
      providers.length
        ? providers.map((p) => `${p.name}  ${p.baseUrl}  ${p.kind}  ${p.keySet ? 'key set' : 'no key'}`)
        : ['no providers'],
    );
  }),
  'providers remove': databaseOnly(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const name = required(values, 'name');
    const removed = await api.removeProvider(projectId, name);
    out.result({ name, removed }, removed ? `Removed provider ${name}` : `No provider ${name}`);
  }),
};

/** `webhooks enable|disable ID`: the re-enable operation the REST surface does not expose. */
function webhookSwitch(active: boolean): AdminCommand {
  return databaseOnly(async ({ api, rest, out }) => {
    const id = rest[0];
    if (!id) throw new UsageError(`webhooks ${active ? 'enable' : 'disable'} needs a subscription id`);
    const view = await api.setWebhookActive(id, active);
    out.result(view, `${view.isActive ? 'Enabled' : 'Disabled'} webhook subscription ${id} (${view.url})`);
  });
}

/** The payment connection in a few lines. */
function describePayments(view: Json): string[] {
  if (!view.connected) return [`Payments: not connected (${view.projectId})`];
  if (view.provider === 'test')
    return [
      `Payments: test payments connected to ${view.projectId} (a test checkout with test cards; no money moves)`,
    ];
  return [
    `Payments: ${view.provider} connected to ${view.projectId} (${view.livemode ? 'live' : 'test'} mode)`,
    `  key: ${view.keyHint} (sealed; never shown again)`,
    `  webhook: ${view.webhook.url} (${view.webhook.managed ? `endpoint ${view.webhook.endpointId}` : 'endpoint made by hand'})`,
    `  top-ups: presets ${view.settings.presets?.join(', ')}; minimum ${view.settings.minimum}; maximum ${view.settings.maximum}`,
    view.settings.autoRecharge?.offered
      ? `  auto-recharge: offered; below ${view.settings.autoRecharge.threshold}, ${view.settings.autoRecharge.amount} at a time, at most ${view.settings.autoRecharge.monthlyCap} a month per user`
      : '  auto-recharge: not offered',
  ];
}

/** Options given only when set. */
function given(values: Values, names: Record<string, string>): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const [option, field] of Object.entries(names)) {
    const value = optional(values, option);
    if (value) picked[field] = value;
  }
  return picked;
}

const paymentCommands: Record<string, AdminCommand> = {
  'payments connect': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const presets = optional(values, 'presets');
    const settings = {
      ...(presets ? { presets: presets.split(',').map((p) => p.trim()) } : {}),
      ...given(values, { minimum: 'minimum', maximum: 'maximum' }),
    };
    const test = optional(values, 'provider') === 'test';
    const view = await api.connectPayments(projectId, {
      ...(test ? { provider: 'test' } : { stripeKey: required(values, 'stripe-key') }),
      ...given(values, { 'webhook-secret': 'webhookSecret' }),
      ...(Object.keys(settings).length ? { settings } : {}),
    });
    out.result(view, describePayments(view));
  }),
  'payments show': both(async ({ api, values, out }) => {
    const view = await api.showPayments(required(values, 'project'));
    out.result(view, describePayments(view));
  }),
  'payments auto-recharge': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const offered = required(values, 'offered');
    if (offered !== 'on' && offered !== 'off') throw new UsageError('--offered must be on or off');
    const view = await api.updatePaymentSettings(projectId, {
      autoRecharge: {
        offered: offered === 'on',
        ...given(values, { threshold: 'threshold', amount: 'amount', 'monthly-cap': 'monthlyCap' }),
      },
    });
    out.result(view, describePayments(view));
  }),
  'payments disconnect': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const result = await api.disconnectPayments(projectId);
    out.result(
      result,
      result.deleted
        ? `Disconnected payments from ${projectId}${result.webhookEndpointDeleted ? ' (webhook endpoint deleted)' : ''}`
        : `${projectId} had no payments connected`,
    );
  }),
  'payments list': both(async ({ api, values, out }) => {
    const page = await api.listPayments(required(values, 'project'), optional(values, 'user'));
    out.result(
      page.data,
      page.data.length
        ? page.data.map(
            (p: Json) =>
              `${p.id}  ${p.user}  ${p.amount} ${p.currency}  ${p.status}${p.refunded !== '0.00' && p.refunded !== '0' ? ` (refunded ${p.refunded})` : ''}`,
          )
        : ['no payments'],
    );
  }),
  'payments refund': both(async ({ api, values, out }) => {
    const projectId = required(values, 'project');
    const refund = await api.refundPayment(
      projectId,
      required(values, 'payment'),
      optional(values, 'amount'),
    );
    out.result(
      refund,
      `Refund ${refund.id} of ${refund.amount} ${refund.currency} (${refund.status}); the balance is debited when Stripe confirms it`,
    );
  }),
};

/** Every admin command, by name (the names of ./commands.ts). */
export const ADMIN_COMMANDS: Record<string, AdminCommand> = {
  ...projectCommands,
  ...modelAndUserCommands,
  ...providerCommands,
  ...paymentCommands,
  'webhooks enable': webhookSwitch(true),
  'webhooks disable': webhookSwitch(false),
};
