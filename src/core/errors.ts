/**
 * Every error Tollgate returns has OpenAI's shape: {"error":{"message","type","param","code"}}.
 * Throw an ApiError anywhere below a route and the HTTP layer renders it.
 */
export type ErrorType =
  | 'invalid_request_error'
  | 'authentication_error'
  | 'permission_error'
  | 'not_found_error'
  | 'conflict_error'
  | 'rate_limit_error'
  | 'upstream_error'
  | 'timeout_error'
  | 'service_unavailable'
  | 'server_error';

export interface ErrorBody {
  error: { message: string; type: ErrorType; param: string | null; code: string | null };
}

export class ApiError extends Error {
  readonly status: number;
  /** The status under fastify's name, so that any error handler (the hosted pages') answers it, not a 500. */
  readonly statusCode: number;
  readonly type: ErrorType;
  readonly code: string | null;
  readonly param: string | null;
  readonly headers: Record<string, string>;

  constructor(
    status: number,
    type: ErrorType,
    message: string,
    options: { code?: string | null; param?: string | null; headers?: Record<string, string> } = {},
  ) {
    super(message);
    this.status = status;
    this.statusCode = status;
    this.type = type;
    this.code = options.code ?? null;
    this.param = options.param ?? null;
    this.headers = options.headers ?? {};
  }

  toBody(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export const badRequest = (message: string, param: string | null = null, code = 'invalid_request') =>
  new ApiError(400, 'invalid_request_error', message, { param, code });

export const notFound = (message: string, code = 'not_found', param: string | null = null) =>
  new ApiError(404, 'not_found_error', message, { code, param });

export const conflict = (message: string, code = 'conflict') =>
  new ApiError(409, 'conflict_error', message, { code });

export const unauthorized = (message: string) =>
  new ApiError(401, 'authentication_error', message, { code: 'invalid_api_key' });

/** Seconds a client is asked to wait (Retry-After) when the database cannot be reached. */
export const DATABASE_RETRY_AFTER_SECONDS = 2;

/** 503 while the database is down or restarting: nothing was done, the same request may be retried. */
export const databaseUnavailable = () =>
  new ApiError(
    503,
    'service_unavailable',
    'The service is temporarily unavailable (its database cannot be reached). Retry the request shortly; requests with an Idempotency-Key are safe to retry.',
    { code: 'database_unavailable', headers: { 'retry-after': String(DATABASE_RETRY_AFTER_SECONDS) } },
  );
