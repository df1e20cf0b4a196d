import Anthropic from '@anthropic-ai/sdk';

/**
 * The official Anthropic client against a Tollgate at `baseURL`, for end user `user` (the
 * X-Service-User header), with the key sent as `x-api-key` or, with `bearer`, as a Bearer token.
 */
export function anthropicFor(baseURL: string, key: string, user: string, bearer = false): Anthropic {
  return new Anthropic({
    baseURL,
    ...(bearer ? { authToken: key, apiKey: null } : { apiKey: key }),
    maxRetries: 0,
    defaultHeaders: { 'X-Service-User': user },
  });
}
