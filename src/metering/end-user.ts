import { badRequest } from '../core/errors.ts';
import { userIdSchema } from '../users/schema.ts';

export const END_USER_HEADER = 'x-service-user';

/**
 * The end user of a metered request (chat, responses, embeddings): the body's `user`, else the
 * `X-Service-User` header. When both are given the body wins (it is the per-request field; the header is
 * often a client-wide default). A request with neither gets 400 naming `user`.
 */
export function resolveEndUser(
  body: { user?: string | undefined },
  header: string | string[] | undefined,
): string {
  if (body.user !== undefined) return body.user;
  const fromHeader = Array.isArray(header) ? header[0] : header;
  if (fromHeader) {
    const checked = userIdSchema.safeParse(fromHeader);
    if (!checked.success) {
      throw badRequest(`Invalid 'X-Service-User': ${checked.error.issues[0]!.message}`, 'user');
    }
    return checked.data;
  }
  throw badRequest(
    'No end user: pass `user` in the body or the `X-Service-User` header, a stable pseudonymous id of your user.',
    'user',
    'missing_user',
  );
}
