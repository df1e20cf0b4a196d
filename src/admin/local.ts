import { CLI_ACTOR, recordAudit } from '../audit/index.ts';
import { amountSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { Database } from '../db/index.ts';
import { setUserSpendCaps } from '../limits/spend.ts';
import { applyPricing, listedModel } from '../models/service.ts';
import {
  connectPayments,
  disconnectPayments,
  listPayments,
  refundPayment,
  showPayments,
  updatePaymentSettings,
} from '../payments/service.ts';
import { listKeys } from '../projects/keys.ts';
import { createProject, getProject, updateProject } from '../projects/service.ts';
import { listProviders, removeProvider, upsertProvider } from '../routing/providers.ts';
import { issueUserKey, revokeUserKey, userKeyInput, userKeys } from '../users/keys.ts';
import { connectUser, getBalance, grantFromApi } from '../users/service.ts';
import { projectOfSubscription, setSubscriptionActive } from '../webhooks/subscriptions.ts';
import { createInvite, inviteSchema, inviteUrl } from './accounts.ts';
import { searchUsers } from './end-users.ts';
import type { DatabaseOperations } from './operations.ts';
import {
  type AdminServices,
  createAuditedKey,
  listProjectModels,
  pricingAudit,
  projectAudit,
  revokeAuditedKey,
} from './service.ts';

/**
 * The admin operations on the database, with this process's services: what the command line does
 * without TOLLGATE_URL. The actor of every audit entry is the command line (`CLI_ACTOR`), and the
 * trigger of every event and ledger entry is `cli`.
 */

/** What the operations use of the process (the app context passes as it is). */
export type LocalAdminServices = AdminServices &
  Parameters<typeof connectPayments>[0] &
  Parameters<typeof setSubscriptionActive>[0];

const cliTrigger = { source: 'cli', actorType: 'admin', actorId: 'cli' };

export function localAdmin(ctx: LocalAdminServices): DatabaseOperations {
  return {
    ...projectOperations(ctx),
    ...userOperations(ctx),
    ...paymentOperations(ctx),
    async createInvite(email, expiresInDays) {
      const input = parseInput(inviteSchema, { email, expiresInDays });
      const invite = createInvite(ctx.sealer, input.email, input.expiresInDays);
      const url = inviteUrl(ctx.publicBaseUrl, invite.code);
      return { email: invite.email, code: invite.code, url, expiresAt: invite.expiresAt.toISOString() };
    },
    async setWebhookActive(id, active) {
      const projectId = await projectOfSubscription(ctx, id);
      return setSubscriptionActive(ctx, projectId, id, active);
    },
  };
}

function projectOperations(ctx: LocalAdminServices) {
  return {
    async createProject(input) {
      const created = await createProject(
        ctx.db,
        ctx.sealer,
        { ...input, upstreamUrl: input.upstreamUrl, upstreamKey: input.upstreamKey },
        { actor: CLI_ACTOR },
      );
      return {
        id: created.project.id,
        apiKey: created.apiKey,
        apiKeyId: created.apiKeyId,
        currency: created.project.currency,
        name: created.project.name,
      };
    },
    async listProjects() {
      const rows = await ctx.db.selectFrom('projects').selectAll().orderBy('id').execute();
      return rows.map((p) => ({
        id: p.id,
        name: p.name,
        currency: p.currency,
        upstreamUrl: p.upstream_base_url,
      }));
    },
    async showProject(projectId) {
      const project = await getProject(ctx.db, projectId);
      return {
        id: project.id,
        name: project.name,
        currency: project.currency,
        ownerUserId: project.owner_user_id,
        upstreamUrl: project.upstream_base_url,
        upstreamKeySet: project.upstream_key_sealed !== null,
        settings: project.settings,
      };
    },
    async updateProject(id, change) {
      const { name, upstreamUrl, upstreamKey } = change;
      const before = await getProject(ctx.db, id);
      const project = await ctx.db.transaction().execute(async (tx) => {
        const updated = await updateProject(tx, ctx.sealer, id, {
          ...(name ? { name } : {}),
          ...(upstreamUrl !== undefined ? { upstreamUrl } : {}),
          ...(upstreamKey !== undefined ? { upstreamKey } : {}),
          settings: change.settings,
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
      return {
        id: project.id,
        name: project.name,
        settings: project.settings,
        upstreamUrl: project.upstream_base_url,
      };
    },
    async createKey(projectId, name) {
      await getProject(ctx.db, projectId);
      const created = await createAuditedKey(ctx.db, CLI_ACTOR, projectId, name);
      return { id: created.id, apiKey: created.key, prefix: created.prefix };
    },
    async listKeys(projectId) {
      const keys = await listKeys(ctx.db, projectId);
      return keys.map((k) => ({
        id: k.id,
        name: k.name,
        prefix: k.prefix,
        createdAt: k.created_at,
        revokedAt: k.revoked_at,
      }));
    },
    async revokeKey(keyId) {
      const { projectId, propagated } = await revokeAuditedKey(ctx, CLI_ACTOR, keyId);
      return { id: keyId, projectId, revoked: true as const, propagated };
    },
    async applyModels(projectId, file) {
      const project = await getProject(ctx.db, projectId);
      const result = await applyPricing(ctx.db, projectId, file, {
        audit: pricingAudit(CLI_ACTOR, project, 'pricing.apply', null),
      });
      await ctx.projects.changed(projectId);
      return result;
    },
    async listModels(projectId) {
      const project = await getProject(ctx.db, projectId);
      const rows = await listProjectModels(ctx.db, project.id);
      return { object: 'pricing', currency: project.currency, models: rows.map(listedModel) };
    },
    // the provider and its audit entry: one transaction; then every proxy reloads the project
    addProvider: (projectId, spec) =>
      changing(ctx, projectId, (tx) =>
        upsertProvider(tx, ctx.sealer, projectId, spec as Parameters<typeof upsertProvider>[3], {
          actor: CLI_ACTOR,
        }),
      ),
    listProviders: (projectId) => listProviders(ctx.db, projectId),
    removeProvider: (projectId, name) =>
      changing(ctx, projectId, (tx) => removeProvider(tx, projectId, name, { actor: CLI_ACTOR })),
  } satisfies Partial<DatabaseOperations>;
}

/** Runs a change of the project in one transaction, then tells the project directory. */
async function changing<T>(ctx: LocalAdminServices, projectId: string, change: (tx: Database) => Promise<T>) {
  const result = await ctx.db.transaction().execute(change);
  await ctx.projects.changed(projectId);
  return result;
}

function userOperations(ctx: LocalAdminServices) {
  return {
    async connectUser(projectId, user) {
      const project = await getProject(ctx.db, projectId);
      const { wallet, changed } = await connectUser(ctx.db, ctx.events, project, user, cliTrigger);
      return { user, ...wallet, changed };
    },
    async showUser(projectId, user) {
      return getBalance(ctx.db, await getProject(ctx.db, projectId), user);
    },
    async listUsers(projectId, query) {
      const project = await getProject(ctx.db, projectId);
      return searchUsers(ctx, project, { q: query.search, limit: query.limit });
    },
    async deposit(projectId, user, given) {
      const project = await getProject(ctx.db, projectId);
      const amount = parseInput(amountSchema(project.currency), given, 'amount');
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
      return {
        id: result.entry.id,
        user,
        amount,
        currency: project.currency,
        balance: result.wallet.balance,
      };
    },
    async grant(projectId, input) {
      const project = await getProject(ctx.db, projectId);
      const amount = parseInput(amountSchema(project.currency), input.amount, 'amount');
      return ctx.billing.transaction((tx) =>
        grantFromApi(tx, ctx.billing, project, { ...input, amount }, 'cli', cliTrigger, CLI_ACTOR),
      );
    },
    async createUserKey(projectId, input) {
      const project = await getProject(ctx.db, projectId);
      return issueUserKey(ctx, project.id, userKeyInput(project.currency, input), CLI_ACTOR);
    },
    async listUserKeys(projectId, user) {
      const project = await getProject(ctx.db, projectId);
      return (await userKeys(ctx.db, project.id, user)).data;
    },
    revokeUserKey: (projectId, keyId) => revokeUserKey(ctx, projectId, keyId, CLI_ACTOR),
    async setSpendCaps(projectId, user, caps) {
      const set = await setUserSpendCaps(ctx.db, projectId, user, caps, { actor: CLI_ACTOR });
      await ctx.projects.changed(projectId);
      return set;
    },
  } satisfies Partial<DatabaseOperations>;
}

function paymentOperations(ctx: LocalAdminServices) {
  return {
    async connectPayments(projectId, body) {
      await getProject(ctx.db, projectId);
      return connectPayments(ctx, projectId, body as Parameters<typeof connectPayments>[2], CLI_ACTOR);
    },
    showPayments: (projectId) => showPayments(ctx, projectId),
    updatePaymentSettings: (projectId, body) =>
      updatePaymentSettings(ctx, projectId, body as Parameters<typeof updatePaymentSettings>[2], CLI_ACTOR),
    disconnectPayments: (projectId) => disconnectPayments(ctx, projectId, CLI_ACTOR),
    listPayments: (projectId, user) => listPayments(ctx, projectId, { user, limit: 100 }),
    refundPayment: (projectId, paymentId, amount) =>
      refundPayment(ctx, projectId, paymentId, { amount }, CLI_ACTOR),
  } satisfies Partial<DatabaseOperations>;
}
