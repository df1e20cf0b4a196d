import { ApiError, notFound } from '../core/errors.ts';
import { routeModule } from '../core/plugins.ts';
import { estimatingCounter } from '../tokens/count.ts';
import { anthropicError, countMessagesInput, messagesApi } from './api.ts';
import { countTokensRequestSchema } from './schema.ts';

/**
 * `POST /v1/messages` (Anthropic's Messages API: metered, paywalled) and `POST /v1/messages/count_tokens`
 * (unmetered: Tollgate's own estimate, see countMessagesInput — the hold's: exact up to 128 KiB of text,
 * the same ratio beyond, so a huge body never stalls the pod). Every error of these routes —
 * authentication, validation, limits, provider failures — is answered in Anthropic's error shape
 * (`{"type":"error","error":{"type","message"}}`), so Anthropic's SDKs raise their own error classes.
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
  app.post('/messages/count_tokens', { schema: { body: countTokensRequestSchema } }, async (request) => {
    const body = request.body;
    if (!request.project.models.has(body.model)) {
      throw notFound(`The model '${body.model}' does not exist`, 'model_not_found', 'model');
    }
    return { input_tokens: countMessagesInput(body, estimatingCounter()) };
  });
});

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
