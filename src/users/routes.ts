import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { Transaction } from 'kysely';
import { z } from 'zod';
import type { Actor } from '../audit/index.ts';
import type { Trigger } from '../billing/ledger.ts';
import { amountInputSchema, amountSchema } from '../core/money.ts';
import { isPlainText, isStorable, NOT_STORABLE, parseInput, textInput } from '../core/validation.ts';
import type { DB } from '../db/index.ts';
import {
  type IdempotentResponse,
  type IdempotentResult,
  idempotencyKeyFrom,
  requestHash,
  withIdempotency,
} from '../idempotency/index.ts';
import { paymentsOf } from '../payments/service.ts';
import {
  balanceView,
  chargeFromApi,
  connectLink,
  depositFromApi,
  disconnectUser,
  GRANT_REASON_RE,
  getAlerts,
  getBalance,
  grantFromApi,
  type LinkSettings,
  listActivity,
  listGrants,
  setLowBalanceThreshold,
  topupLink,
} from './service.ts';

/**
 * `/v1/user/*`: balances, deposits, manual charges and sessions (connect, disconnect, top-up links,
 * activity). Deposit and charge accept an `Idempotency-Key` header (see ../idempotency).
 */

/** The developer's end-user id: 1–256 characters, no control characters. */
export const userIdSchema = z
  .string({ message: 'must be a string (your end user’s id)' })
  .min(1, { message: 'must not be empty' })
  .max(256, { message: 'must be at most 256 characters' })
  .refine(isPlainText, { message: 'must not contain control characters' });

const METADATA_MAX_KEYS = 50;
const METADATA_MAX_BYTES = 8192;

/** Caller's reference data: a JSON object of at most 50 keys and 8 KB. */
export const metadataSchema = z
  .record(z.string().min(1).max(64), z.unknown(), { message: 'must be a JSON object' })
  .refine((v) => Object.keys(v).length <= METADATA_MAX_KEYS, {
    message: `must have at most ${METADATA_MAX_KEYS} keys`,
  })
  .refine((v) => Buffer.byteLength(JSON.stringify(v)) <= METADATA_MAX_BYTES, {
    message: `must be at most ${METADATA_MAX_BYTES} bytes as JSON`,
  })
  .refine(isStorable, { message: NOT_STORABLE });

/**
 * Route schemas. An amount is checked for its shape here and for the currency's precision (and put in
 * its canonical form) by `inCurrency` once the project is known.
 */
const moneyBody = z.strictObject({
  user: userIdSchema,
  amount: amountInputSchema,
  metadata: metadataSchema.optional(),
});
const userBody = z.strictObject({ user: userIdSchema });
/** A user's own low-balance threshold; null: the project's applies again. */
const alertsBody = z.strictObject({ user: userIdSchema, lowBalanceThreshold: amountInputSchema.nullable() });
/** A credit grant: an amount, a reason, and optionally a priority and an expiry (in the future). */
export const grantBody = z.strictObject({
  user: userIdSchema,
  amount: amountInputSchema,
  reason: z.string().regex(GRANT_REASON_RE, {
    message: 'must be a short lowercase word such as "promo", "trial" or "goodwill"',
  }),
  priority: z.number().int().min(-1000).max(1000).optional(),
  expiresAt: z.iso
    .datetime({ offset: true, message: 'must be an ISO 8601 time such as 2027-01-31T00:00:00Z' })
    .refine((v) => new Date(v).getTime() > Date.now(), { message: 'must be in the future' })
    .optional(),
  metadata: metadataSchema.optional(),
});
const userQuery = z.strictObject({ user: userIdSchema });
const topupBody = z.strictObject({ user: userIdSchema, amount: amountInputSchema.optional() });
const activityQuery = z.strictObject({
  user: userIdSchema,
  limit: z.coerce
    .number({ message: 'must be a whole number from 1 to 100' })
    .int({ message: 'must be a whole number from 1 to 100' })
    .min(1, { message: 'must be a whole number from 1 to 100' })
    .max(100, { message: 'must be a whole number from 1 to 100' })
    .default(20),
  after: textInput(64).optional(),
});

/** `preHandler` of routes taking an `amount`: the currency's precision and canonical form ("10.50"). */
async function inCurrency(request: FastifyRequest): Promise<void> {
  const body = request.body as { amount?: string };
  if (body.amount === undefined) return;
  const checked = parseInput(z.object({ amount: amountSchema(request.project.currency) }), {
    amount: body.amount,
  });
  body.amount = checked.amount;
}

export async function userRoutes(plain: FastifyInstance): Promise<void> {
  const app = plain.withTypeProvider<ZodTypeProvider>();
  const ctx = app.ctx;
  const links = (): LinkSettings => ({
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
  });
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
    request: FastifyRequest,
    endpoint: string,
    key: string | undefined,
    fn: (tx: Transaction<DB>) => Promise<IdempotentResponse>,
  ): Promise<IdempotentResult> {
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

  const money = { schema: { body: moneyBody }, preHandler: inCurrency };

  app.post('/user/balance/deposit', money, async (request, reply) => {
    const project = request.project;
    const key = idempotencyKeyFrom(request.headers);
    const input = request.body;
    const result = await once(request, 'POST /v1/user/balance/deposit', key, async (tx) => ({
      status: 201,
      body: await depositFromApi(tx, ctx.billing, project, input, triggerOf(request), actorOf(request)),
    }));
    return send(reply, result);
  });

  app.post('/user/charge', money, async (request, reply) => {
    const project = request.project;
    const key = idempotencyKeyFrom(request.headers);
    const input = request.body;
    // withRoom: pods give their slices of the wallet back when they stand in the charge's way (escrow)
    const result = await ctx.billing.withRoom(() =>
      once(request, 'POST /v1/user/charge', key, async (tx) => ({
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
      const key = idempotencyKeyFrom(request.headers);
      const input = request.body;
      const result = await once(request, 'POST /v1/user/credits', key, async (tx) => ({
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

  app.post('/user/connect', { schema: { body: userBody } }, async (request) => {
    const { user } = request.body;
    const state = await getBalance(ctx.db, request.project, user);
    const link = connectLink(links(), request.project, user);
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

  app.post('/user/topup', { schema: { body: topupBody }, preHandler: inCurrency }, async (request) => {
    const project = request.project;
    const { user, amount } = request.body;
    const link = topupLink(links(), project, user, amount);
    return {
      object: 'user.topup_link',
      user,
      amount: amount ?? null,
      currency: project.currency,
      checkout: (await paymentsOf(ctx, project.id))
        ? 'hosted'
        : project.settings.checkoutUrl
          ? 'redirect'
          : 'instructions',
      ...link,
    };
  });
}
