import type { Logger } from 'pino';
import { ApiError } from '../core/errors.ts';
import { UpstreamError } from '../upstream/types.ts';

/**
 * Provider failures as Tollgate's clients see them (OpenAI's error shape): 502/504 for the provider's
 * own failures, its 4xx passed on, and a 400 naming the missing API when a provider has no endpoint
 * for a metered API other than chat.
 */
/** An upstream failure as the client sees it: OpenAI's error shape, 502/504 (or the provider's 4xx). */
export function toClientError(err: unknown): ApiError {
  // A request a provider adapter cannot send (a field translation cannot carry): already the answer.
  if (err instanceof ApiError) return err;
  if (!(err instanceof UpstreamError)) {
    return new ApiError(500, 'server_error', 'The server had an error while processing your request.', {
      code: 'internal_error',
    });
  }
  switch (err.kind) {
    case 'timeout':
      return new ApiError(504, 'timeout_error', `The model provider timed out: ${err.message}`, {
        code: 'upstream_timeout',
      });
    case 'connection':
      return new ApiError(502, 'upstream_error', err.message, { code: 'upstream_unreachable' });
    case 'malformed':
      return new ApiError(
        502,
        'upstream_error',
        `The model provider sent a malformed response: ${err.message}`,
        {
          code: 'upstream_malformed',
        },
      );
    case 'status':
      break;
  }
  const status = err.upstreamStatus ?? 502;
  const detail = providerMessage(err.body);
  const suffix = detail ? `: ${detail}` : '.';
  if (status === 401 || status === 403) {
    return new ApiError(
      502,
      'upstream_error',
      `The model provider refused the project's provider key${suffix}`,
      {
        code: 'upstream_auth_failed',
      },
    );
  }
  if (status === 429) {
    return new ApiError(429, 'rate_limit_error', `The model provider is rate limiting${suffix}`, {
      code: 'upstream_rate_limited',
      ...(err.retryAfter ? { headers: { 'retry-after': err.retryAfter } } : {}),
    });
  }
  if (status >= 400 && status < 500) {
    return new ApiError(status, 'invalid_request_error', `The model provider rejected the request${suffix}`, {
      code: 'upstream_rejected',
    });
  }
  return new ApiError(502, 'upstream_error', `The model provider failed (status ${status})${suffix}`, {
    code: 'upstream_error',
  });
}

function providerMessage(body: string | undefined): string | undefined {
  if (!body) return undefined;
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown } | string; message?: unknown };
    const message =
      typeof parsed.error === 'string'
        ? parsed.error
        : typeof parsed.error?.message === 'string'
          ? parsed.error.message
          : typeof parsed.message === 'string'
            ? parsed.message
            : undefined;
    if (message) return message.slice(0, 500);
  } catch {}
  return body.slice(0, 200);
}

/**
 * A provider that answers 404 to `POST /responses` or `/embeddings` has no such API: a clear 400, not
 * a silent translation to chat completions.
 */
export function unsupportedEndpoint(err: unknown, title: string, path: string): ApiError | undefined {
  if (!(err instanceof UpstreamError) || err.kind !== 'status' || err.upstreamStatus !== 404)
    return undefined;
  const detail = providerMessage(err.body);
  return new ApiError(
    400,
    'invalid_request_error',
    `The model provider of this project does not serve the ${title} API (POST ${path} answered 404${detail ? `: ${detail}` : ''}). Use /v1/chat/completions with this provider.`,
    { code: 'unsupported_endpoint', param: 'model' },
  );
}

/**
 * The client sees one fixed message when a provider cannot be reached (no port scanning); the pod's log
 * keeps the cause (ECONNREFUSED, EPRIVATEADDRESS, a parser error…) for the operator.
 */
export function logUnreachable(log: Logger, err: unknown, projectId: string): void {
  if (!(err instanceof UpstreamError) || err.kind !== 'connection' || err.cause === undefined) return;
  const cause = err.cause as { code?: string; message?: string };
  log.warn({ project: projectId, cause: cause.code ?? cause.message }, err.message);
}
