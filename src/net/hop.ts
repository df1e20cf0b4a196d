/**
 * Hop detection: every request Tollgate sends a provider carries `X-Tollgate-Hop` with this deployment's
 * hop id; a request that comes in carrying the same id went out of this deployment and came back (a
 * provider URL pointing at Tollgate itself, directly or through its public hostname) and is refused
 * with 508 before anything is counted — one chat can no longer turn into a charge per loop. Another
 * Tollgate deployment in front of this one has another id and passes.
 *
 * The id is derived from the active signing key (`sign`, an HMAC), so every pod of a deployment sends
 * and recognises the same one, and it reveals nothing about the key.
 */
export const HOP_HEADER = 'x-tollgate-hop';

export function hopId(sign: (data: string) => string): string {
  return sign('tollgate-hop').slice(0, 22);
}
