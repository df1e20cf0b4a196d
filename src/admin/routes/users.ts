import { z } from 'zod';
import { amountInputSchema } from '../../core/money.ts';
import { routeModule } from '../../core/plugins.ts';
import { textInput } from '../../core/validation.ts';
import { idempotencyKeyFrom } from '../../idempotency/index.ts';
import { issueUserKey, revokeUserKey, userKeyInput, userKeys } from '../../users/keys.ts';
import { grantBody, metadataSchema, userKeyBody, userKeyParams } from '../../users/schema.ts';
import { getBalance, listActivity, listGrants } from '../../users/service.ts';
import { actorOf } from '../accounts.ts';
import { grantCredit, moveMoney, searchUsers, setUserConnected } from '../end-users.ts';
import { amountIn, limitSchema, pageQuery, projectParams, sendIdempotent, userParams } from './schemas.ts';

/**
 * A project's end users: search, balance, activity, connection, credit grants, deposits and charges,
 * and their keys (src/users/keys.ts).
 */

const usersQuery = pageQuery.extend({ q: textInput(256).optional() });
const activityQuery = z.strictObject({ limit: limitSchema, after: textInput(64).optional() });
const moneyBody = z.strictObject({ amount: amountInputSchema, metadata: metadataSchema.optional() });

export const userRoutes = routeModule((app, ctx) => {
  app.get(
    '/projects/:project/users',
    { schema: { params: projectParams, querystring: usersQuery } },
    async (request) =>
      searchUsers(ctx, request.ownedProject, {
        q: request.query.q,
        limit: request.query.limit,
        startingAfter: request.query.starting_after,
      }),
  );
  app.get('/projects/:project/users/:user', { schema: { params: userParams } }, async (request) =>
    getBalance(ctx.db, request.ownedProject, request.params.user),
  );
  app.get(
    '/projects/:project/users/:user/activity',
    { schema: { params: userParams, querystring: activityQuery } },
    async (request) => listActivity(ctx.db, request.ownedProject, request.params.user, request.query),
  );
  for (const action of ['connect', 'disconnect'] as const) {
    app.post(
      `/projects/:project/users/:user/${action}`,
      { schema: { params: userParams } },
      async (request) =>
        setUserConnected(
          ctx,
          request.principal,
          request.ownedProject,
          request.params.user,
          action === 'connect',
        ),
    );
  }
  app.post(
    '/projects/:project/users/:user/credits',
    { schema: { params: userParams, body: grantBody.omit({ user: true }) } },
    async (request, reply) => {
      const { ownedProject: project, body } = request;
      const amount = amountIn(project.currency, body.amount);
      const result = await grantCredit(
        ctx,
        request.principal,
        project,
        { ...body, user: request.params.user, amount },
        idempotencyKeyFrom(request.headers),
      );
      return sendIdempotent(reply, result);
    },
  );
  app.get('/projects/:project/users/:user/credits', { schema: { params: userParams } }, async (request) =>
    listGrants(ctx.db, request.ownedProject, request.params.user),
  );
  for (const kind of ['deposit', 'charge'] as const) {
    app.post(
      `/projects/:project/users/:user/${kind}`,
      { schema: { params: userParams, body: moneyBody } },
      async (request, reply) => {
        const key = idempotencyKeyFrom(request.headers);
        const { ownedProject: project, body } = request;
        const amount = amountIn(project.currency, body.amount);
        const input = { user: request.params.user, amount, metadata: body.metadata };
        return sendIdempotent(reply, await moveMoney(ctx, request.principal, project, kind, input, key));
      },
    );
  }
  app.post(
    '/projects/:project/users/:user/keys',
    { schema: { params: userParams, body: userKeyBody.omit({ user: true }) } },
    async (request, reply) => {
      const { ownedProject: project } = request;
      const input = userKeyInput(project.currency, { ...request.body, user: request.params.user });
      const created = await issueUserKey(ctx, project.id, input, actorOf(request.principal));
      return reply.status(201).send(created);
    },
  );
  app.get('/projects/:project/users/:user/keys', { schema: { params: userParams } }, async (request) =>
    userKeys(ctx.db, request.ownedProject.id, request.params.user),
  );
  app.delete(
    '/projects/:project/user-keys/:id',
    { schema: { params: projectParams.extend(userKeyParams.shape) } },
    async (request) =>
      revokeUserKey(ctx, request.ownedProject.id, request.params.id, actorOf(request.principal)),
  );
});
