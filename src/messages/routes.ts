import { ApiError, notFound } from '../core/errors.ts';
import { routeModule } from '../core/plugins.ts';
import type { ModelRoute, ModelRow } from '../db/schema.ts';
import { holdMarginOf } from '../models/hold-margin.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { DEFAULT_PROVIDER, ECHO_UPSTREAM } from '../projects/service.ts';
import { estimatingCounter } from '../tokens/count.ts';
import { anthropicError, countMessagesInput, forwardedHeaders, messagesApi } from './api.ts';
import { type CountTokensRequest, countTokensRequestSchema } from './schema.ts';

/** Says where a `count_tokens` answer comes from: `provider` (forwarded) or `estimate` (Tollgate's). */
export const TOKEN_COUNT_HEADER = 'x-tollgate-token-count';

/**
 * `POST /v1/messages` (Anthropic's Messages API: metered, paywalled) and `POST /v1/messages/count_tokens`
 * (unmetered). `count_tokens` is what Claude Code reads to decide when to compact its context, so it
 * answers as the model's provider would: a model served only by Anthropic providers gets it forwarded
 * to its first route (Anthropic does not charge for it), with the client's `anthropic-version` and
 * `anthropic-beta`; any other model gets the calibrated estimate of its tokenizer family — Tollgate's
 * o200k count (countMessagesInput: exact up to 128 KiB of text, the same ratio beyond, so a huge body
 * never stalls the pod) times the model's hold margin (src/models/hold-margin.ts: 1.3 for Claude),
 * rounded up, the same input the hold pays for (also when the Anthropic provider cannot be reached).
 * The `x-tollgate-token-count` header says which.
 *
 * Every error of these routes — authentication, validation, limits, provider failures — is answered in
 * Anthropic's error shape (`{"type":"error","error":{"type","message"}}`), so Anthropic's SDKs raise
 * their own error classes.
 */
export const messagesRoutes = routeModule((app) => {
  const flow = app.metering;
  // Errors are rendered in OpenAI's shape by the server's error handler; reshaped here for this scope.
  app.addHook('onSend', async (_request, reply, payload) => {
    if (reply.statusCode < 400 || typeof payload !== 'string') return payload;
    return reshapeError(reply.statusCode, payload);
  });
  app.post('/messages', { schema: { body: messagesApi.schema } }, (request, reply) =>
    flow.handle(messagesApi, request.body, request, reply),
  );
  app.post(
    '/messages/count_tokens',
    { schema: { body: countTokensRequestSchema } },
    async (request, reply) => {
      const body = request.body;
      const model = request.project.models.get(body.model);
      if (!model) throw notFound(`The model '${body.model}' does not exist`, 'model_not_found', 'model');
      const route = anthropicRoute(request.project, model);
      if (route) {
        reply.header(TOKEN_COUNT_HEADER, 'provider');
        const forwarded = {
          project: request.project,
          method: 'POST',
          body: { ...body, model: route.model },
          upstreamProvider: route.provider,
          upstreamHeaders: forwardedHeaders(request),
        };
        try {
          return await flow.passthrough(forwarded, reply, '/messages/count_tokens');
        } catch (err) {
          // The provider could not be reached (its own answers, errors included, are relayed): the
          // agent still gets a count to decide on, the estimate.
          if (!(err instanceof ApiError) || err.status < 500 || reply.sent) throw err;
          request.log.warn(
            { err, provider: route.provider },
            'count_tokens: provider unreachable, estimated',
          );
        }
      }
      reply.header(TOKEN_COUNT_HEADER, 'estimate');
      return { input_tokens: estimatedInputTokens(body, model) };
    },
  );
});

/** The first route of a model served only by Anthropic providers (undefined: another serves it). */
export function anthropicRoute(project: ProjectContext, model: ModelRow): ModelRoute | undefined {
  // (As the router orders them: by priority, a route without one at its place in the list.)
  const routes: ModelRoute[] = model.routes?.length
    ? model.routes
        .map((route, i) => ({ route, priority: route.priority ?? i }))
        .sort((a, b) => a.priority - b.priority)
        .map((r) => r.route)
    : [{ provider: DEFAULT_PROVIDER, model: model.upstream_model }];
  for (const route of routes) {
    const config = project.providers.get(route.provider);
    if (config?.kind !== 'anthropic' || config.baseUrl === ECHO_UPSTREAM) return undefined;
  }
  return routes[0];
}

/** The model family's estimate: the o200k count times the model's hold margin, rounded up. */
export function estimatedInputTokens(body: CountTokensRequest, model: ModelRow): number {
  const counted = countMessagesInput(body, estimatingCounter());
  // The margin has at most 3 decimals: in thousandths, the product is an exact integer.
  const thousandths = Math.round(Number(holdMarginOf(model).margin) * 1000);
  return Math.ceil((counted * thousandths) / 1000);
}

/** An OpenAI-shaped error body (`{"error":{"message","type","param","code"}}`) in Anthropic's shape. */
function reshapeError(status: number, payload: string): string {
  let body: { error?: { message?: unknown; param?: unknown; code?: unknown } };
  try {
    body = JSON.parse(payload);
  } catch {
    return payload;
  }
  const error = body?.error;
  if (!error || typeof error !== 'object' || typeof error.message !== 'string') return payload;
  const apiError = new ApiError(status, 'invalid_request_error', error.message, {
    param: typeof error.param === 'string' ? error.param : null,
    code: typeof error.code === 'string' ? error.code : null,
  });
  return JSON.stringify(anthropicError(apiError));
}
