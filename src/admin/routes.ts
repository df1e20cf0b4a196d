import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { auditCsv, auditQuerySchema, listAudit } from '../audit/index.ts';
import { safeEqual } from '../core/crypto.ts';
import { ApiError } from '../core/errors.ts';
import { amountInputSchema, amountSchema } from '../core/money.ts';
import { parseInput, storableText, textInput } from '../core/validation.ts';
import { type IdempotentResult, idempotencyKeyFrom } from '../idempotency/index.ts';
import { modelSpecSchema, pricingFileSchema } from '../models/pricing.ts';
import { paymentAdminRoutes } from '../payments/admin-routes.ts';
import { projectSettingsSchema } from '../projects/service.ts';
import { grantBody, metadataSchema, userIdSchema } from '../users/schema.ts';
import { getBalance, listActivity, listGrants } from '../users/service.ts';
import { listDeliveryLogs, logsQuerySchema, retryDelivery } from '../webhooks/logs.ts';
import {
  createSubscription,
  listSubscriptions,
  setSubscriptionActive,
  subscriptionInputSchema,
} from '../webhooks/subscriptions.ts';
import {
  admitSignUp,
  checkCredentials,
  createAdminToken,
  createInvite,
  createSession,
  credentialsSchema,
  endSession,
  getDeveloper,
  inviteSchema,
  inviteUrl,
  listAdminTokens,
  type Principal,
  resolveAdminToken,
  resolveSession,
  revokeAdminToken,
  SIGN_UP_ANSWER,
  signUp,
  signUpSchema,
} from './accounts.ts';
import {
  reconciliationCsv,
  reconciliationQuerySchema,
  reconciliationReport,
  reportQuerySchema,
  usageReport,
} from './reports.ts';
import {
  actorOf,
  applyModels,
  connectProvider,
  createApiKey,
  createOwnedProject,
  createProjectBody,
  deleteModel,
  grantCredit,
  list,
  listApiKeys,
  listModels,
  listProjects,
  moveMoney,
  ownedProject,
  projectView,
  providerBody,
  putModel,
  revokeApiKey,
  searchUsers,
  setUserConnected,
  updateOwnedProject,
} from './service.ts';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal;
  }
}

/**
 * The admin API under `/admin/v1` (apart from the project-key `/v1`): accounts, sessions and admin
 * tokens; projects, their provider, API keys, models and pricing; end users and their money; usage
 * reports; webhook subscriptions and delivery logs. Authenticated with `Authorization: Bearer` and one
 * of: TOLLGATE_ADMIN_TOKEN (full access), an admin token `tga_…`, or a session token `tgs_…` (sign-in).
 * Sign-up and sign-in need no token. Errors have OpenAI's shape; lists are cursor lists
 * (`limit`, `starting_after`, `has_more`).
 */

const limitSchema = z.coerce
  .number({ message: 'must be a whole number from 1 to 100' })
  .int({ message: 'must be a whole number from 1 to 100' })
  .min(1, { message: 'must be a whole number from 1 to 100' })
  .max(100, { message: 'must be a whole number from 1 to 100' })
  .default(20);
const pageQuery = z.strictObject({ limit: limitSchema, starting_after: textInput(255).optional() });
const projectParams = z.object({ project: textInput(255, 'a project id') });
const projectItemParams = projectParams.extend({ id: textInput(255, 'an id') });
const userParams = projectParams.extend({ user: userIdSchema });
const usersQuery = pageQuery.extend({ q: textInput(256).optional() });
const activityQuery = z.strictObject({ limit: limitSchema, after: textInput(64).optional() });
const nameBody = z.strictObject({ name: storableText(200).default('default') });
const updateProjectBody = z.strictObject({
  name: storableText(200).optional(),
  settings: projectSettingsSchema.partial().optional(),
});
const moneyBody = z.strictObject({ amount: amountInputSchema, metadata: metadataSchema.optional() });

const unauthenticated = (message: string) =>
  new ApiError(401, 'authentication_error', message, { code: 'invalid_admin_token' });

/** Resolves the bearer of an admin request: the full-access token, an admin token, or a session token. */
export async function principalOf(app: FastifyInstance, header: string | undefined): Promise<Principal> {
  if (!header) throw unauthenticated('Missing admin token. Send it as `Authorization: Bearer <token>`.');
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  if (!match)
    throw unauthenticated('Malformed Authorization header. Expected `Authorization: Bearer <token>`.');
  const token = match[1]!;
  const root = app.ctx.config.TOLLGATE_ADMIN_TOKEN;
  if (root && safeEqual(token, root)) {
    return { developerId: null, email: null, actorType: 'admin_token', actorId: 'TOLLGATE_ADMIN_TOKEN' };
  }
  const found = token.startsWith('tgs_')
    ? await resolveSession(app.ctx.db, token)
    : token.startsWith('tga_')
      ? await resolveAdminToken(app.ctx.db, token)
      : undefined;
  if (!found) throw unauthenticated('Incorrect admin token, or it was revoked or has expired.');
  return found;
}

function sendIdempotent(reply: FastifyReply, result: IdempotentResult) {
  if (result.replayed) reply.header('idempotent-replayed', 'true');
  if (result.raw !== undefined)
    return reply.status(result.status).type('application/json; charset=utf-8').send(result.raw);
  return reply.status(result.status).send(result.body);
}

export async function adminRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const ctx = app.ctx;

  // ---- no token: sign up, sign in (limits: ./rate-limit.ts, shared with the dashboard) ----

  // The same answer whether or not the address had an account (it must not tell who has one).
  app.post('/developers', { schema: { body: signUpSchema } }, async (request, reply) => {
    await app.accountLimits.signUp(request);
    // A full-access admin may create accounts whatever TOLLGATE_SIGNUP says.
    const bearer = request.headers.authorization;
    const fullAccess = bearer ? (await principalOf(plain, bearer)).developerId === null : false;
    admitSignUp(ctx.config.TOLLGATE_SIGNUP, ctx.sealer, request.body, fullAccess);
    await signUp(ctx.db, request.body);
    reply.status(202);
    return { object: 'sign_up', status: 'accepted', message: SIGN_UP_ANSWER };
  });

  app.post('/sessions', { schema: { body: credentialsSchema } }, async (request, reply) => {
    // The attempt is counted before the password is checked.
    await app.accountLimits.signIn(request, request.body.email);
    const developer = await checkCredentials(ctx.db, request.body);
    const session = await createSession(ctx.db, developer.id);
    reply.status(201);
    return { developer, session: { token: session.token, expiresAt: session.expiresAt.toISOString() } };
  });

  // ---- everything else needs a bearer ----

  await app.register(async (scoped) => {
    const api = scoped.withTypeProvider<ZodTypeProvider>();
    scoped.decorateRequest('principal', null as unknown as Principal);
    scoped.addHook('onRequest', async (request: FastifyRequest) => {
      request.principal = await principalOf(scoped, request.headers.authorization);
      // for the audit log: the address (TOLLGATE_TRUSTED_PROXIES honoured by fastify) and the way in
      request.principal.ip = request.ip;
      request.principal.via = 'admin_api';
    });

    // payments (Stripe): ../payments/admin-routes.ts
    await scoped.register(paymentAdminRoutes);

    api.get('/me', async (request) => {
      const p = request.principal;
      return {
        object: 'principal',
        access: p.developerId ? 'developer' : 'full',
        developer: p.developerId ? await getDeveloper(ctx.db, p.developerId) : null,
        actorType: p.actorType,
        actorId: p.actorId,
      };
    });

    api.delete('/sessions/current', async (request) => {
      if (!request.principal.sessionId)
        throw new ApiError(400, 'invalid_request_error', 'This bearer is not a session token.', {
          code: 'not_a_session',
        });
      await endSession(ctx.db, request.principal.sessionId);
      return { object: 'session', deleted: true };
    });

    // admin tokens
    api.post('/admin-tokens', { schema: { body: nameBody } }, async (request, reply) => {
      reply.status(201);
      return createAdminToken(ctx.db, request.principal, request.body.name);
    });
    api.get('/admin-tokens', async (request) =>
      list(await listAdminTokens(ctx.db, request.principal), false),
    );
    api.delete(
      '/admin-tokens/:id',
      { schema: { params: z.object({ id: textInput(255) }) } },
      async (request) => revokeAdminToken(ctx.db, request.principal, request.params.id),
    );

    // invites (TOLLGATE_SIGNUP=invite): made by a full-access admin, for one e-mail address
    api.post('/invites', { schema: { body: inviteSchema } }, async (request, reply) => {
      if (request.principal.developerId !== null)
        throw new ApiError(403, 'permission_error', 'Only a full-access admin token can invite.', {
          code: 'full_access_required',
        });
      const invite = createInvite(ctx.sealer, request.body.email, request.body.expiresInDays);
      reply.status(201);
      return {
        object: 'invite',
        email: invite.email,
        code: invite.code,
        url: inviteUrl(ctx.publicBaseUrl, invite.code),
        expiresAt: invite.expiresAt.toISOString(),
      };
    });

    // projects
    api.get('/projects', { schema: { querystring: pageQuery } }, async (request) =>
      listProjects(ctx, request.principal, {
        limit: request.query.limit,
        startingAfter: request.query.starting_after,
      }),
    );
    api.post('/projects', { schema: { body: createProjectBody } }, async (request, reply) => {
      reply.status(201);
      return createOwnedProject(ctx, request.principal, request.body);
    });
    api.get('/projects/:project', { schema: { params: projectParams } }, async (request) =>
      projectView(await ownedProject(ctx, request.principal, request.params.project)),
    );
    api.patch(
      '/projects/:project',
      { schema: { params: projectParams, body: updateProjectBody } },
      async (request) => updateOwnedProject(ctx, request.principal, request.params.project, request.body),
    );
    api.put(
      '/projects/:project/provider',
      { schema: { params: projectParams, body: providerBody } },
      async (request) => connectProvider(ctx, request.principal, request.params.project, request.body),
    );

    // API keys
    api.get('/projects/:project/keys', { schema: { params: projectParams } }, async (request) =>
      listApiKeys(ctx, request.principal, request.params.project),
    );
    api.post(
      '/projects/:project/keys',
      { schema: { params: projectParams, body: nameBody } },
      async (request, reply) => {
        reply.status(201);
        return createApiKey(ctx, request.principal, request.params.project, request.body.name);
      },
    );
    api.delete('/projects/:project/keys/:id', { schema: { params: projectItemParams } }, async (request) =>
      revokeApiKey(ctx, request.principal, request.params.project, request.params.id),
    );

    // models and pricing
    api.get('/projects/:project/models', { schema: { params: projectParams } }, async (request) =>
      listModels(ctx, request.principal, request.params.project),
    );
    api.put(
      '/projects/:project/models',
      { schema: { params: projectParams, body: pricingFileSchema } },
      async (request) => applyModels(ctx, request.principal, request.params.project, request.body),
    );
    api.put(
      '/projects/:project/models/:id',
      { schema: { params: projectItemParams, body: modelSpecSchema.omit({ id: true }) } },
      async (request) =>
        putModel(ctx, request.principal, request.params.project, { ...request.body, id: request.params.id }),
    );
    api.delete('/projects/:project/models/:id', { schema: { params: projectItemParams } }, async (request) =>
      deleteModel(ctx, request.principal, request.params.project, request.params.id),
    );

    // end users
    api.get(
      '/projects/:project/users',
      { schema: { params: projectParams, querystring: usersQuery } },
      async (request) =>
        searchUsers(ctx, request.principal, request.params.project, {
          q: request.query.q,
          limit: request.query.limit,
          startingAfter: request.query.starting_after,
        }),
    );
    api.get('/projects/:project/users/:user', { schema: { params: userParams } }, async (request) => {
      const project = await ownedProject(ctx, request.principal, request.params.project);
      return getBalance(ctx.db, project, request.params.user);
    });
    api.get(
      '/projects/:project/users/:user/activity',
      { schema: { params: userParams, querystring: activityQuery } },
      async (request) => {
        const project = await ownedProject(ctx, request.principal, request.params.project);
        return listActivity(ctx.db, project, request.params.user, request.query);
      },
    );
    for (const action of ['connect', 'disconnect'] as const) {
      api.post(
        `/projects/:project/users/:user/${action}`,
        { schema: { params: userParams } },
        async (request) =>
          setUserConnected(
            ctx,
            request.principal,
            request.params.project,
            request.params.user,
            action === 'connect',
          ),
      );
    }
    api.post(
      '/projects/:project/users/:user/credits',
      { schema: { params: userParams, body: grantBody.omit({ user: true }) } },
      async (request, reply) => {
        const project = await ownedProject(ctx, request.principal, request.params.project);
        const amount = parseInput(z.object({ amount: amountSchema(project.currency) }), {
          amount: request.body.amount,
        }).amount;
        const result = await grantCredit(
          ctx,
          request.principal,
          project.id,
          { ...request.body, user: request.params.user, amount },
          idempotencyKeyFrom(request.headers),
        );
        return sendIdempotent(reply, result);
      },
    );
    api.get('/projects/:project/users/:user/credits', { schema: { params: userParams } }, async (request) => {
      const project = await ownedProject(ctx, request.principal, request.params.project);
      return listGrants(ctx.db, project, request.params.user);
    });
    for (const kind of ['deposit', 'charge'] as const) {
      api.post(
        `/projects/:project/users/:user/${kind}`,
        { schema: { params: userParams, body: moneyBody } },
        async (request, reply) => {
          const key = idempotencyKeyFrom(request.headers);
          const project = await ownedProject(ctx, request.principal, request.params.project);
          const amount = parseInput(z.object({ amount: amountSchema(project.currency) }), {
            amount: request.body.amount,
          }).amount;
          const result = await moveMoney(
            ctx,
            request.principal,
            project.id,
            kind,
            { user: request.params.user, amount, metadata: request.body.metadata },
            key,
          );
          return sendIdempotent(reply, result);
        },
      );
    }

    // the audit log (src/audit): a project's entries, newest first; `format=csv` exports them
    api.get(
      '/projects/:project/audit',
      { schema: { params: projectParams, querystring: auditQuerySchema } },
      async (request, reply) => {
        await ownedProject(ctx, request.principal, request.params.project);
        const { format, ...query } = request.query;
        const { data, hasMore } = await listAudit(ctx.db, { projectId: request.params.project }, query);
        if (format === 'json') return list(data, hasMore);
        return reply
          .type('text/csv; charset=utf-8')
          .header(
            'content-disposition',
            `attachment; filename="tollgate-audit-${request.params.project}.csv"`,
          )
          .send(auditCsv(data));
      },
    );
    // every entry the principal may see: all (full access), or a developer's projects' and their own
    api.get('/audit', { schema: { querystring: auditQuerySchema } }, async (request, reply) => {
      const { format, ...query } = request.query;
      const scope =
        request.principal.developerId === null ? {} : { developerId: request.principal.developerId };
      const { data, hasMore } = await listAudit(ctx.db, scope, query);
      if (format === 'json') return list(data, hasMore);
      return reply
        .type('text/csv; charset=utf-8')
        .header('content-disposition', 'attachment; filename="tollgate-audit.csv"')
        .send(auditCsv(data));
    });

    // reports
    api.get(
      '/projects/:project/reports/usage',
      { schema: { params: projectParams, querystring: reportQuerySchema } },
      async (request) => usageReport(ctx, request.principal, request.params.project, request.query),
    );
    api.get(
      '/projects/:project/reports/reconciliation',
      { schema: { params: projectParams, querystring: reconciliationQuerySchema } },
      async (request, reply) => {
        const report = await reconciliationReport(
          ctx,
          request.principal,
          request.params.project,
          request.query,
        );
        if (request.query.format === 'json') return report;
        return reply
          .type('text/csv; charset=utf-8')
          .header(
            'content-disposition',
            `attachment; filename="tollgate-reconciliation-${request.params.project}-${report.days}d.csv"`,
          )
          .send(reconciliationCsv(report.data));
      },
    );

    // webhooks
    api.get(
      '/projects/:project/webhooks/subscriptions',
      { schema: { params: projectParams, querystring: pageQuery } },
      async (request) => {
        await ownedProject(ctx, request.principal, request.params.project);
        const { data, hasMore } = await listSubscriptions(ctx, request.params.project, {
          status: undefined,
          limit: request.query.limit,
          startingAfter: request.query.starting_after,
        });
        return list(data, hasMore);
      },
    );
    api.post(
      '/projects/:project/webhooks/subscriptions',
      { schema: { params: projectParams, body: subscriptionInputSchema } },
      async (request, reply) => {
        await ownedProject(ctx, request.principal, request.params.project);
        const { subscription, secret } = await createSubscription(ctx, request.params.project, request.body, {
          createdBy: `${request.principal.actorType}:${request.principal.actorId}`,
          actor: actorOf(request.principal),
        });
        reply.status(201);
        return { subscription: { ...subscription, secret } };
      },
    );
    api.delete(
      '/projects/:project/webhooks/subscriptions/:id',
      { schema: { params: projectItemParams } },
      async (request) => {
        await ownedProject(ctx, request.principal, request.params.project);
        return {
          subscription: await setSubscriptionActive(ctx, request.params.project, request.params.id, false, {
            actor: actorOf(request.principal),
          }),
        };
      },
    );
    api.get(
      '/projects/:project/webhooks/logs',
      { schema: { params: projectParams, querystring: logsQuerySchema } },
      async (request) => {
        await ownedProject(ctx, request.principal, request.params.project);
        const { data, hasMore } = await listDeliveryLogs(ctx, request.params.project, request.query);
        return list(data, hasMore);
      },
    );
    api.post(
      '/projects/:project/webhooks/logs/:id/resend',
      { schema: { params: projectItemParams } },
      async (request, reply) => {
        await ownedProject(ctx, request.principal, request.params.project);
        reply.status(202);
        return retryDelivery(ctx, request.params.project, request.params.id);
      },
    );
  });
}
