import { ApiError, badRequest } from '../core/errors.ts';
import { userIdSchema } from '../users/schema.ts';

export const END_USER_HEADER = 'x-service-user';

/** Where a metered request may name its end user. */
export interface EndUserSources {
  /** The user of the end-user key (`tgu_…`) that authenticated the request (src/auth). */
  key: string | undefined;
  /** The `X-Service-User` header. */
  header: string | string[] | undefined;
  /** The body's user: `user`, or what the API reads (Messages: `metadata.user_id`). */
  body: string | undefined;
}

/**
 * The end user of a metered request (chat, responses, embeddings, messages), in one order:
 *
 * 1. the end-user key's user — a request with such a key that names anyone else (in the header or the
 *    body) is refused, 403 `permission_error`; naming the same user is allowed;
 * 2. the `X-Service-User` header (the developer's choice for the client as a whole);
 * 3. the body's `user` (Messages: `metadata.user_id`).
 *
 * Neither → 400 naming `user`.
 */
export function resolveEndUser(from: EndUserSources): string {
  const header = Array.isArray(from.header) ? from.header[0] : from.header;
  if (from.key !== undefined) {
    if ((header && header !== from.key) || (from.body !== undefined && from.body !== from.key)) {
      throw new ApiError(
        403,
        'permission_error',
        'This key belongs to one end user: the request may not name another (X-Service-User, `user`, `metadata.user_id`).',
        { code: 'end_user_mismatch', param: 'user' },
      );
    }
    return from.key;
  }
  if (header) {
    const checked = userIdSchema.safeParse(header);
    if (!checked.success) {
      throw badRequest(`Invalid 'X-Service-User': ${checked.error.issues[0]!.message}`, 'user');
    }
    return checked.data;
  }
  if (from.body !== undefined) return from.body;
  throw badRequest(
    'No end user: pass `user` in the body or the `X-Service-User` header, a stable pseudonymous id of your user.',
    'user',
    'missing_user',
  );
}
