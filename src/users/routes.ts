import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Transaction } from 'kysely';
import type { Actor } from '../audit/index.ts';
import type { Trigger } from '../billing/ledger.ts';
import type { BillingService } from '../billing/service.ts';
import { amountSchema } from '../core/money.ts';
import { type RouteApp, routeModule } from '../core/plugins.ts';
import { parseInput } from '../core/validation.ts';
import type { DB } from '../db/index.ts';
import {
  type IdempotentResponse,
  type IdempotentResult,
  idempotencyKeyFrom,
  requestHash,
  withIdempotency,
} from '../idempotency/index.ts';
import { issueUserKey, revokeUserKey, userKeyInput, userKeys } from './keys.ts';
import { linkSettingsOf } from './links.ts';
import {
  activityQuery,
  alertsBody,
  connectBody,
  grantBody,
  inCurrency,
  moneyBody,
  userBody,
  userKeyBody,
  userKeyParams,
  userQuery,
} from './schema.ts';
import {
  balanceView,
  chargeFromApi,
  depositFromApi,
  disconnectUser,
  getAlerts,
  getBalance,
  grantFromApi,
  listActivity,
  listGrants,
  setLowBalanceThreshold,
} from './service.ts';
import { connectLink } from './sessions.ts';

/**
 * `/v1/user/*`: balances, deposits, manual charges, credit grants, alerts, sessions (connect,
 * disconnect, activity) and end-user keys (./keys.ts). Deposit, charge and credits accept an `Idempotency-Key` header (see
 * ../idempotency). The portal and top-up links are ../payments/routes.ts's: they depend on payments.
 */

const triggerOf = (request: FastifyRequest): Trigger => ({
  source: 'api',
  actorType: 'api_key',
  actorId: request.apiKeyId,
});

const actorOf = (request: FastifyRequest): Actor => ({
  type: 'api_key',
  id: request.apiKeyId,
  ip: request.ip,
  via: 'v1',
});

/** Runs a money move once per Idempotency-Key (when given), in one transaction with its response. */
async function once(
  ctx: { billing: BillingService },
  request: FastifyRequest,
  endpoint: string,
  fn: (tx: Transaction<DB>) => Promise<IdempotentResponse>,
): Promise<IdempotentResult> {
  const key = idempotencyKeyFrom(request.headers);
  if (key === undefined) {
    const response = await ctx.billing.transaction(fn);
    return { ...response, replayed: false };
  }
  return withIdempotency(
    ctx,
    { projectId: request.project.id, endpoint, key, requestHash: requestHash(request.body) },
    fn,
  );
}

function send(reply: FastifyReply, result: IdempotentResult) {
  if (result.replayed) reply.header('idempotent-replayed', 'true');
  // With a key: the stored bytes, so that a replay is byte-identical to the first response.
  if (result.raw !== undefined)
    return reply.status(result.status).type('application/json; charset=utf-8').send(result.raw);
  return reply.status(result.status).send(result.body);
}

export const userRoutes = routeModule((app, ctx) => {
  const links = () => linkSettingsOf(ctx);
  const money = { schema: { body: moneyBody }, preHandler: inCurrency };

  app.post('/user/balance/deposit', money, async (request, reply) => {
    const project = request.project;
    const input = request.body;
    const result = await once(ctx, request, 'POST /v1/user/balance/deposit', async (tx) => ({
      status: 201,
      body: await depositFromApi(tx, ctx.billing, project, input, triggerOf(request), actorOf(request)),
    }));
    return send(reply, result);
  });

  app.post('/user/charge', money, async (request, reply) => {
    const project = request.project;
    const input = request.body;
    // withRoom: pods give their slices of the wallet back when they stand in the charge's way (escrow)
    const result = await ctx.billing.withRoom(() =>
      once(ctx, request, 'POST /v1/user/charge', async (tx) => ({
        status: 200,
        body: await chargeFromApi(
          tx,
          ctx.billing,
          ctx.events,
          project,
          input,
          triggerOf(request),
          links(),
          actorOf(request),
        ),
      })),
    );
    return send(reply, result);
  });

  app.post(
    '/user/credits',
    { schema: { body: grantBody }, preHandler: inCurrency },
    async (request, reply) => {
      const project = request.project;
      const input = request.body;
      const result = await once(ctx, request, 'POST /v1/user/credits', async (tx) => ({
        status: 201,
        body: await grantFromApi(
          tx,
          ctx.billing,
          project,
          input,
          'api',
          triggerOf(request),
          actorOf(request),
        ),
      }));
      return send(reply, result);
    },
  );

  app.get('/user/alerts', { schema: { querystring: userQuery } }, async (request) =>
    getAlerts(ctx.db, request.project, request.query.user),
  );

  app.post('/user/alerts', { schema: { body: alertsBody } }, async (request) => {
    const { user, lowBalanceThreshold } = request.body;
    const threshold =
      lowBalanceThreshold === null
        ? null
        : parseInput(amountSchema(request.project.currency), lowBalanceThreshold, 'lowBalanceThreshold');
    return setLowBalanceThreshold(ctx.db, request.project, user, threshold);
  });

  app.get('/user/credits', { schema: { querystring: userQuery } }, async (request) =>
    listGrants(ctx.db, request.project, request.query.user),
  );

  app.get('/user/balance', { schema: { querystring: userQuery } }, async (request) => {
    const { user } = request.query;
    return getBalance(ctx.db, request.project, user);
  });

  app.get('/user/activity', { schema: { querystring: activityQuery } }, async (request) => {
    const query = request.query;
    return listActivity(ctx.db, request.project, query.user, query);
  });

  keyRoutes(app, ctx);

  app.post('/user/connect', { schema: { body: connectBody } }, async (request) => {
    const { user, keyName } = request.body;
    const state = await getBalance(ctx.db, request.project, user);
    const link = connectLink(links(), request.project, user);
    // `keyName`: connecting also hands the user an end-user key (../pages/connect.ts)
    if (keyName !== undefined) {
      const url = `${link.url}?key=${encodeURIComponent(keyName)}`;
      Object.assign(link, { url, message: link.message.replace(link.url, url) });
    }
    return { object: 'user.connect_link', user, connected: state.connected, ...link };
  });

  app.post('/user/disconnect', { schema: { body: userBody } }, async (request) => {
    const { user } = request.body;
    const { wallet, changed } = await disconnectUser(
      ctx.db,
      ctx.events,
      request.project,
      user,
      triggerOf(request),
    );
    return { ...balanceView(request.project, user, wallet), changed };
  });
});

/** `/v1/user/keys`: an end user's keys (./keys.ts), with the project key. */
function keyRoutes(app: RouteApp, ctx: FastifyInstance['ctx']): void {
  app.post('/user/keys', { schema: { body: userKeyBody } }, async (request, reply) => {
    const input = userKeyInput(request.project.currency, request.body);
    const created = await issueUserKey(ctx, request.project.id, input, actorOf(request));
    return reply.status(201).send(created);
  });

  app.get('/user/keys', { schema: { querystring: userQuery } }, async (request) =>
    userKeys(ctx.db, request.project.id, request.query.user),
  );

  app.delete('/user/keys/:id', { schema: { params: userKeyParams } }, async (request) =>
    revokeUserKey(ctx, request.project.id, request.params.id, actorOf(request)),
  );
}
