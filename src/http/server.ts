import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyServerOptions,
  LogController,
} from 'fastify';
import { serializerCompiler } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { accountLimits } from '../admin/rate-limit.ts';
import { adminRoutes } from '../admin/routes/index.ts';
import type { AppContext } from '../app/context.ts';
import { installAuth } from '../auth/plugin.ts';
import { chatRoutes } from '../chat/routes.ts';
import { ApiError } from '../core/errors.ts';
import { registerAll } from '../core/plugins.ts';
import { toApiError } from '../core/request-errors.ts';
import { validatorCompiler } from '../core/validation.ts';
import { docsRoutes } from '../dashboard/docs.ts';
import { homeRoutes } from '../dashboard/home.ts';
import { dashboardRoutes } from '../dashboard/plugin.ts';
import { embeddingsRoutes } from '../embeddings/routes.ts';
import { spendCapRoutes } from '../limits/routes.ts';
import { messagesRoutes } from '../messages/routes.ts';
import { metering } from '../metering/plugin.ts';
import { metricsRoutes } from '../metrics/routes.ts';
import { modelRoutes } from '../models/routes.ts';
import { HOP_HEADER, ownHopIds } from '../net/hop.ts';
import { pageRoutes } from '../pages/plugin.ts';
import { paymentUserRoutes, paymentWebhookRoutes } from '../payments/routes.ts';
import { responsesRoutes } from '../responses/routes.ts';
import { userRoutes } from '../users/routes.ts';
import { webhookRoutes } from '../webhooks/routes.ts';
import { clientErrorHandler } from './client-errors.ts';
import { healthRoutes } from './health.ts';
import { installJsonParser } from './json.ts';
import { logRequests, requestLogger } from './request-logger.ts';
import { familyOf } from './route-families.ts';

type CompilersFactory = NonNullable<
  NonNullable<FastifyServerOptions['schemaController']>['compilersFactory']
>;

/** 256 characters (the longest end user id) × 9 (a percent-encoded 3-byte UTF-8 character), rounded up. */
export const MAX_PARAM_LENGTH = 2400;

declare module 'fastify' {
  interface FastifyInstance {
    ctx: AppContext;
  }
}

/**
 * The HTTP surface of `tollgate proxy`. Where a request goes:
 * - `/healthz`, `/readyz` — ./health.ts
 * - `/metrics` (and the HTTP metrics of every route) — ../metrics/routes.ts
 * - `/connect/*`, `/topup/*`, `/portal/*` — the hosted pages of links, ../pages (no key)
 * - `/payments/{provider}/{project}/webhook` — payment provider webhooks, ../payments/routes.ts (signed)
 * - `/` and `/docs` — a small home page (../dashboard/home.ts) and the documentation as HTML (../dashboard/docs.ts)
 * - `/admin/v1/*` — the admin API (admin tokens, developer sessions), ../admin/routes/
 * - `/dashboard/*` — the developer dashboard (server-rendered pages, cookie sessions), ../dashboard/plugin.ts
 * - `/v1/*` — authenticated by ../auth/plugin.ts, then the domain's routes (models, chat, responses,
 *   embeddings, messages — Anthropic's API —, user, webhooks)
 */
export async function buildServer(ctx: AppContext): Promise<FastifyInstance> {
  const app = Fastify({
    loggerInstance: ctx.log as FastifyBaseLogger,
    // One line per request (logRequests below) instead of fastify's two info lines.
    logController: new LogController({ disableRequestLogging: true }),
    // `request.log` is made when a line is first written at an enabled level, not for every request.
    childLoggerFactory: (logger, bindings, options) => requestLogger(logger, bindings, options),
    bodyLimit: ctx.config.BODY_LIMIT_BYTES,
    // The whole request (headers and body) within REQUEST_TIMEOUT_MS on every route, else 408 and the
    // connection closed: Node checks every `connectionsCheckingInterval`, so a trickling client is cut
    // within 1.5× the time-out (fastify applies both only when it creates the server, here).
    requestTimeout: ctx.config.REQUEST_TIMEOUT_MS,
    // (Node enforces the request time-out only when the headers' time-out is no longer than it.)
    http: {
      headersTimeout: ctx.config.REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: Math.max(500, Math.floor(ctx.config.REQUEST_TIMEOUT_MS / 2)),
    },
    // X-Forwarded-* are believed only from TOLLGATE_TRUSTED_PROXIES (hops or addresses); unset: none.
    trustProxy: trustProxyOf(ctx.config.TOLLGATE_TRUSTED_PROXIES),
    return503OnClosing: true,
    forceCloseConnections: 'idle',
    // A path parameter may be as long as the longest value it carries: an end user id is up to 256
    // characters, each up to 9 when percent-encoded (find-my-way's default limit is 100: a 414).
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: MAX_PARAM_LENGTH },
    // Requests Node's HTTP parser refuses get the same error shape (./client-errors.ts).
    clientErrorHandler,
    // Every schema is zod (below): fastify's JSON-schema compilers (ajv, fast-json-stringify) are never
    // built, nor loaded.
    schemaController: {
      compilersFactory: {
        // (fastify types the factories for ajv's compilers; fastify calls them as schema compilers.)
        buildValidator: (() => validatorCompiler) as unknown as CompilersFactory['buildValidator'],
        buildSerializer: (() => serializerCompiler) as unknown as CompilersFactory['buildSerializer'],
      },
    },
    // Errors fastify raises before routing (a malformed URL, a bad header) get the same error shape.
    frameworkErrors: (error, _request, reply: FastifyReply) => {
      const apiError = toApiError(error);
      reply.status(apiError.status).send(apiError.toBody());
    },
  });
  app.decorate('ctx', ctx);
  // Inputs are declared on each route as zod schemas (`schema: { body, querystring, params }`, typed
  // through `withTypeProvider<ZodTypeProvider>()`); invalid input becomes a 400 in OpenAI's shape
  // before the handler runs (../core/validation.ts). JSON bodies are strict UTF-8 and depth-limited.
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  installJsonParser(app, ctx.config.JSON_MAX_DEPTH);

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const apiError = toApiError(error);
    if (apiError.code === 'database_unavailable')
      request.log.warn({ url: request.url }, 'database unavailable');
    else if (apiError.code === 'sealed_value_unreadable')
      request.log.error({ url: request.url }, error.message);
    else if (apiError.status >= 500) request.log.error({ err: error, url: request.url }, 'request failed');
    reply.status(apiError.status).headers(apiError.headers).send(apiError.toBody());
  });
  app.setNotFoundHandler((request, reply) => {
    const err = new ApiError(
      404,
      'not_found_error',
      `Unknown request URL: ${request.method} ${request.url.split('?')[0]}.`,
      {
        code: 'unknown_url',
      },
    );
    reply.status(404).send(err.toBody());
  });
  // One info line per /v1 request (decision, amount, duration), a debug line per other request.
  logRequests(app);

  // Every route belongs to a family of paths the chart's ingress knows (route-families.ts).
  app.addHook('onRoute', (route) => {
    if (!familyOf(route.url)) {
      throw new Error(
        `The route ${route.url} belongs to no family of paths: add it to src/http/route-families.json.`,
      );
    }
  });
  await registerAll(app, [
    metricsRoutes,
    healthRoutes,
    pageRoutes,
    paymentWebhookRoutes,
    homeRoutes,
    docsRoutes,
  ]);
  // One set of sign-in and sign-up limits for the admin API and the dashboard.
  await app.register(accountLimits);
  await app.register(adminRoutes, { prefix: '/admin/v1' });
  // The metered flow (`app.metering`) the metered APIs' routes serve through.
  await app.register(metering);
  await app.register(dashboardRoutes, { prefix: '/dashboard' });
  await app.register((v1) => v1Routes(v1, app), { prefix: '/v1' });
  return app;
}

/** `/v1/*`: the hop check, authentication (../auth/plugin.ts), then the domains' routes. */
async function v1Routes(v1: FastifyInstance, app: FastifyInstance): Promise<void> {
  const ctx = app.ctx;
  // A request that left this deployment for a provider and came back: refused before anything
  // is counted (src/net/hop.ts).
  const own = ownHopIds(ctx.sealer);
  v1.addHook('onRequest', async (request) => {
    const hop = request.headers[HOP_HEADER];
    if (typeof hop === 'string' && own.has(hop)) throw loopDetected();
  });
  installAuth(v1);
  await registerAll(v1, [
    modelRoutes,
    chatRoutes,
    responsesRoutes,
    embeddingsRoutes,
    messagesRoutes,
    webhookRoutes,
  ]);
  // `/v1/user/*` counts against the project's, the key's and the user's rate limits as well; a route
  // that takes no query parameters refuses any (400 naming it), as docs/api.md promises.
  await v1.register(async (user) => {
    user.addHook('onRoute', (route) => {
      route.schema ??= {};
      route.schema.querystring ??= NO_QUERY;
    });
    user.addHook('preHandler', (request, reply) =>
      app.metering.limitRequest(request, userNamed(request), reply),
    );
    await registerAll(user, [userRoutes, paymentUserRoutes, spendCapRoutes]);
  });
}

/** fastify's `trustProxy` for TOLLGATE_TRUSTED_PROXIES: none, the first `n` hops, or these addresses. */
function trustProxyOf(setting: number | string[] | undefined) {
  if (setting === undefined) return false;
  if (typeof setting === 'number') return (_address: string, hop: number) => hop < setting;
  return setting;
}

/** The query of a route that takes none. */
const NO_QUERY = z.strictObject({});

/** The end user a `/v1/user/*` request names (`user` in its query or body), '' when none. */
function userNamed(request: { query: unknown; body: unknown }): string {
  const named =
    (request.query as { user?: unknown } | undefined)?.user ??
    (request.body as { user?: unknown } | undefined)?.user;
  return typeof named === 'string' ? named : '';
}

/** 508: the request is this deployment's own, come back through a provider URL that points at it. */
function loopDetected(): ApiError {
  return new ApiError(
    508,
    'invalid_request_error',
    'This request came from this Tollgate itself: a model provider URL points back at it. Nothing was charged.',
    { code: 'loop_detected' },
  );
}
