import { createInvite, inviteSchema, inviteUrl } from '../admin/accounts.ts';
import { pricingAudit, projectAudit } from '../admin/service.ts';
import { type AppContext, createContext } from '../app/context.ts';
import { CLI_ACTOR, recordAudit } from '../audit/index.ts';
import type { Config } from '../config/index.ts';
import { amountSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import { setUserSpendCaps } from '../limits/spend.ts';
import { applyPricing, listedModel, modelLine } from '../models/service.ts';
import { createKey, listKeys } from '../projects/keys.ts';
import { createProject, getProject, updateProject } from '../projects/service.ts';
import { listProviders, removeProvider, upsertProvider } from '../routing/providers.ts';
import { connectUser, grantFromApi } from '../users/service.ts';
import { type Output, UsageError } from './output.ts';
import {
  days,
  grantInputFrom,
  grantSummary,
  optional,
  pricingFileFrom,
  required,
  settingsFrom,
  type Values,
} from './values.ts';

/** The admin commands: projects, keys, models and users (the dashboard's part, on the command line). */

/** Runs a command with a context; the context is closed afterwards. */
export async function withContext<T>(config: Config, fn: (ctx: AppContext) => Promise<T>): Promise<T> {
  const ctx = await createContext(config, { log: undefined });
  try {
    return await fn(ctx);
  } finally {
    await ctx.close();
  }
}

const cliTrigger = { source: 'cli', actorType: 'admin', actorId: 'cli' };

export async function adminCommand(
  config: Config,
  command: string,
  sub: string | undefined,
  values: Values,
  out: Output,
) {
  const key = `${command} ${sub ?? ''}`.trim();
  switch (key) {
    case 'project create':
      return withContext(config, async (ctx) => {
        const created = await createProject(
          ctx.db,
          ctx.sealer,
          {
            name: required(values, 'name'),
            currency: optional(values, 'currency') ?? 'usd',
            upstreamUrl: optional(values, 'upstream-url'),
            upstreamKey: optional(values, 'upstream-key'),
            settings: settingsFrom(values),
          },
          { actor: CLI_ACTOR },
        );
        out.result(
          {
            id: created.project.id,
            apiKey: created.apiKey,
            apiKeyId: created.apiKeyId,
            currency: created.project.currency,
          },
          [
            `Created project ${created.project.id} (${created.project.name}, ${created.project.currency})`,
            `API key (shown once, keep it safe): ${created.apiKey}`,
          ],
        );
      });
    case 'project list':
      return withContext(config, async (ctx) => {
        const rows = await ctx.db.selectFrom('projects').selectAll().orderBy('id').execute();
        out.result(
          rows.map((p) => ({
            id: p.id,
            name: p.name,
            currency: p.currency,
            upstreamUrl: p.upstream_base_url,
          })),
          rows.length
            ? rows.map((p) => `${p.id}  ${p.name}  ${p.currency}  ${p.upstream_base_url ?? '(no provider)'}`)
            : ['no projects'],
        );
      });
    case 'project show':
      return withContext(config, async (ctx) => {
        const project = await getProject(ctx.db, required(values, 'project'));
        const view = {
          id: project.id,
          name: project.name,
          currency: project.currency,
          ownerUserId: project.owner_user_id,
          upstreamUrl: project.upstream_base_url,
          upstreamKeySet: project.upstream_key_sealed !== null,
          settings: project.settings,
        };
        out.result(
          view,
          Object.entries(view).map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`),
        );
      });
    case 'project set':
      return withContext(config, async (ctx) => {
        const id = required(values, 'project');
        const upstreamUrl = optional(values, 'upstream-url');
        const upstreamKey = optional(values, 'upstream-key');
        const name = optional(values, 'name');
        const before = await getProject(ctx.db, id);
        const project = await ctx.db.transaction().execute(async (tx) => {
          const updated = await updateProject(tx, ctx.sealer, id, {
            ...(name ? { name } : {}),
            ...(upstreamUrl !== undefined ? { upstreamUrl } : {}),
            ...(upstreamKey !== undefined ? { upstreamKey } : {}),
            settings: settingsFrom(values),
          });
          await recordAudit(tx, {
            actor: CLI_ACTOR,
            projectId: id,
            action: 'project.update',
            targetType: 'project',
            targetId: id,
            before: projectAudit(before),
            after: { ...projectAudit(updated), upstreamKeyChanged: upstreamKey !== undefined },
          });
          return updated;
        });
        await ctx.projects.changed(id);
        out.result(
          {
            id: project.id,
            name: project.name,
            settings: project.settings,
            upstreamUrl: project.upstream_base_url,
          },
          `Updated project ${id}`,
        );
      });
    case 'key create':
      return withContext(config, async (ctx) => {
        const projectId = required(values, 'project');
        await getProject(ctx.db, projectId);
        const name = optional(values, 'name') ?? 'default';
        const created = await ctx.db.transaction().execute(async (tx) => {
          const key = await createKey(tx, projectId, name);
          await recordAudit(tx, {
            actor: CLI_ACTOR,
            projectId,
            action: 'api_key.create',
            targetType: 'api_key',
            targetId: key.id,
            after: { name, prefix: key.prefix },
          });
          return key;
        });
        out.result({ id: created.id, apiKey: created.key, prefix: created.prefix }, [
          `Created key ${created.id} (${created.prefix}…)`,
          `API key (shown once, keep it safe): ${created.key}`,
        ]);
      });
    case 'key list':
      return withContext(config, async (ctx) => {
        const keys = await listKeys(ctx.db, required(values, 'project'));
        out.result(
          keys.map((k) => ({
            id: k.id,
            name: k.name,
            prefix: k.prefix,
            createdAt: k.created_at,
            revokedAt: k.revoked_at,
          })),
          keys.length
            ? keys.map((k) => `${k.id}  ${k.prefix}…  ${k.name}  ${k.revoked_at ? 'revoked' : 'active'}`)
            : ['no keys'],
        );
      });
    case 'key revoke':
      return withContext(config, async (ctx) => {
        const keyId = required(values, 'key');
        const was = await ctx.db
          .selectFrom('api_keys')
          .select(['name', 'prefix', 'revoked_at'])
          .where('id', '=', keyId)
          .executeTakeFirst();
        const { projectId, propagated } = await ctx.keys.revoke(keyId);
        if (was && !was.revoked_at)
          await recordAudit(ctx.db, {
            actor: CLI_ACTOR,
            projectId,
            action: 'api_key.revoke',
            targetType: 'api_key',
            targetId: keyId,
            before: { name: was.name, prefix: was.prefix, revoked: false },
            after: { name: was.name, prefix: was.prefix, revoked: true },
          });
        out.result(
          { id: keyId, projectId, revoked: true, propagated },
          propagated
            ? `Revoked key ${keyId}`
            : `Revoked key ${keyId}; Redis was unreachable, so running proxies stop accepting it within 5 minutes`,
        );
      });
    case 'models apply':
      return withContext(config, async (ctx) => {
        const projectId = required(values, 'project');
        const file = pricingFileFrom(values);
        const project = await getProject(ctx.db, projectId);
        const result = await applyPricing(ctx.db, projectId, file, {
          audit: pricingAudit(CLI_ACTOR, project, 'pricing.apply', null),
        });
        await ctx.projects.changed(projectId);
        out.result(result, [
          `Applied ${values.file} to ${projectId}:`,
          `  created: ${result.created.join(', ') || '-'}`,
          `  updated: ${result.updated.join(', ') || '-'}`,
          `  deleted: ${result.deleted.join(', ') || '-'}`,
        ]);
      });
    case 'models list':
      return withContext(config, async (ctx) => {
        const project = await getProject(ctx.db, required(values, 'project'));
        const rows = await ctx.db
          .selectFrom('models')
          .selectAll()
          .where('project_id', '=', project.id)
          .orderBy('id')
          .execute();
        const models = rows.map(listedModel);
        out.result(
          { object: 'pricing', currency: project.currency, models },
          models.length ? models.map(modelLine) : ['no models'],
        );
      });
    case 'users connect':
      return withContext(config, async (ctx) => {
        const project = await getProject(ctx.db, required(values, 'project'));
        const user = required(values, 'user');
        const { wallet, changed } = await connectUser(ctx.db, ctx.events, project, user, cliTrigger);
        out.result(
          { user, ...wallet, changed },
          changed ? `Connected ${user}` : `${user} was already connected`,
        );
      });
    case 'users deposit':
      return withContext(config, async (ctx) => {
        const project = await getProject(ctx.db, required(values, 'project'));
        const user = required(values, 'user');
        const amount = parseInput(amountSchema(project.currency), required(values, 'amount'), 'amount');
        const result = await ctx.billing.transaction(async (tx) => {
          const deposited = await ctx.billing.deposit(
            { project, externalId: user, amount, source: 'cli', trigger: cliTrigger },
            tx,
          );
          await recordAudit(tx, {
            actor: CLI_ACTOR,
            projectId: project.id,
            action: 'money.deposit',
            targetType: 'user',
            targetId: user,
            after: { entry: deposited.entry.id, amount, metadata: {} },
          });
          return deposited;
        });
        out.result(
          { id: result.entry.id, user, amount, currency: project.currency, balance: result.wallet.balance },
          `Deposited ${amount} ${project.currency} to ${user}; balance ${result.wallet.balance} ${project.currency}`,
        );
      });
    case 'users grant':
      return withContext(config, async (ctx) => {
        const project = await getProject(ctx.db, required(values, 'project'));
        const input = grantInputFrom(values, project.currency);
        const result = await ctx.billing.transaction((tx) =>
          grantFromApi(tx, ctx.billing, project, input, 'cli', cliTrigger, CLI_ACTOR),
        );
        out.result(result, grantSummary(result));
      });
    case 'providers add':
      return withContext(config, async (ctx) => {
        const projectId = required(values, 'project');
        const connectMs = optional(values, 'connect-timeout-ms');
        const responseMs = optional(values, 'response-timeout-ms');
        const key = optional(values, 'key');
        const kind = optional(values, 'kind');
        // the provider and its audit entry: one transaction
        const provider = await ctx.db.transaction().execute((tx) =>
          upsertProvider(
            tx,
            ctx.sealer,
            projectId,
            {
              name: required(values, 'name'),
              baseUrl: required(values, 'base-url'),
              ...(key !== undefined ? { key } : {}),
              ...(kind !== undefined ? { kind: kind as 'anthropic' } : {}),
              timeouts: {
                ...(connectMs !== undefined ? { connectMs: Number(connectMs) } : {}),
                ...(responseMs !== undefined ? { responseMs: Number(responseMs) } : {}),
              },
            },
            { actor: CLI_ACTOR },
          ),
        );
        await ctx.projects.changed(projectId);
        out.result(
          provider,
          `Provider ${provider.name} of ${projectId}: ${provider.baseUrl} (${provider.kind})`,
        );
      });
    case 'providers list':
      return withContext(config, async (ctx) => {
        const providers = await listProviders(ctx.db, required(values, 'project'));
        out.result(
          providers,
          providers.length
            ? providers.map((p) => `${p.name}  ${p.baseUrl}  ${p.kind}  ${p.keySet ? 'key set' : 'no key'}`)
            : ['no providers'],
        );
      });
    case 'providers remove':
      return withContext(config, async (ctx) => {
        const projectId = required(values, 'project');
        const name = required(values, 'name');
        const removed = await ctx.db
          .transaction()
          .execute((tx) => removeProvider(tx, projectId, name, { actor: CLI_ACTOR }));
        await ctx.projects.changed(projectId);
        out.result({ name, removed }, removed ? `Removed provider ${name}` : `No provider ${name}`);
      });
    case 'users spend-caps':
      return withContext(config, async (ctx) => {
        const projectId = required(values, 'project');
        const user = required(values, 'user');
        const caps = await setUserSpendCaps(
          ctx.db,
          projectId,
          user,
          {
            daily: optional(values, 'daily') ?? null,
            monthly: optional(values, 'monthly') ?? null,
          },
          { actor: CLI_ACTOR },
        );
        await ctx.projects.changed(projectId);
        out.result(
          { user, ...caps },
          `Spend caps of ${user}: daily ${caps.daily ?? '-'}, monthly ${caps.monthly ?? '-'}`,
        );
      });
    case 'invite create':
      return withContext(config, async (ctx) => {
        const input = parseInput(inviteSchema, {
          email: required(values, 'email'),
          expiresInDays: days(values),
        });
        const invite = createInvite(ctx.sealer, input.email, input.expiresInDays);
        const url = inviteUrl(ctx.publicBaseUrl, invite.code);
        out.result(
          { email: invite.email, code: invite.code, url, expiresAt: invite.expiresAt.toISOString() },
          [`Invite for ${invite.email} (until ${invite.expiresAt.toISOString()}):`, url],
        );
      });
    default:
      throw new UsageError(`unknown command: ${key}`);
  }
}
