import type { FastifyError } from 'fastify';
import { isDatabaseUnavailable } from '../db/index.ts';
import { SealedValueError } from './crypto.ts';
import { ApiError, databaseUnavailable } from './errors.ts';

/**
 * The error a request ends with, in OpenAI's shape, whatever was thrown while serving it: the HTTP
 * server's error handler (../http/server.ts) and the dashboard's error pages (../dashboard/plugin.ts)
 * both answer with it.
 */

/** Maps anything thrown while serving a request to an OpenAI-shaped error; bad input never becomes a 500. */
export function toApiError(error: FastifyError | Error): ApiError {
  if (error instanceof ApiError) return error;
  const fastifyError = error as FastifyError;
  switch (fastifyError.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ApiError(413, 'invalid_request_error', 'Request body is too large.', {
        code: 'request_too_large',
      });
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ApiError(415, 'invalid_request_error', 'Content-Type must be application/json.', {
        code: 'unsupported_media_type',
      });
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ApiError(400, 'invalid_request_error', 'Request body is empty; a JSON object is required.', {
        code: 'invalid_json',
      });
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new ApiError(
        400,
        'invalid_request_error',
        `Request body is not valid JSON: ${fastifyError.message}`,
        {
          code: 'invalid_json',
        },
      );
  }
  if (error instanceof SyntaxError || (fastifyError.statusCode === 400 && /JSON/i.test(error.message))) {
    return new ApiError(400, 'invalid_request_error', `Request body is not valid JSON: ${error.message}`, {
      code: 'invalid_json',
    });
  }
  // The database is down or restarting: 503 with Retry-After, not 500.
  if (isDatabaseUnavailable(error)) return databaseUnavailable();
  // A secret this server cannot open (its key left the ring): the operator's to fix, not the client's.
  if (error instanceof SealedValueError) {
    return new ApiError(
      503,
      'service_unavailable',
      'A secret this request needs cannot be opened with the server’s keys; the operator has been told.',
      { code: 'sealed_value_unreadable' },
    );
  }
  const status = fastifyError.statusCode;
  if (status && status >= 400 && status < 500) {
    return new ApiError(status, 'invalid_request_error', error.message, { code: fastifyError.code ?? null });
  }
  return new ApiError(500, 'server_error', 'The server had an error while processing your request.', {
    code: 'internal_error',
  });
}
