/**
 * Hop detection: every request Tollgate sends a provider carries `X-Tollgate-Hop` with this deployment's
 * hop id; a request that comes in carrying the same id went out of this deployment and came back (a
 * provider URL pointing at Tollgate itself, directly or through its public hostname) and is refused
 * with 508 before anything is counted — one chat can no longer turn into a charge per loop. Another
 * Tollgate deployment in front of this one has another id and passes.
 *
 * The id is derived from the signing key (an HMAC), so every pod of a deployment sends and recognises
 * the same one, and it reveals nothing about the key. A pod sends the id of the active key and
 * recognises those of every key of the ring: while a key rotation rolls out, a request sent by a pod
 * still on the old key comes back to one on the new ring and is still refused.
 */
export const HOP_HEADER = 'x-tollgate-hop';

const HOP_DATA = 'tollgate-hop';
const hopOf = (signature: string) => signature.slice(0, 22);

/** The hop id this deployment sends (under the active key). */
export function hopId(sealer: { sign(data: string): string }): string {
  return hopOf(sealer.sign(HOP_DATA));
}

/** The hop ids this deployment recognises as its own: one per key of the ring. */
export function ownHopIds(sealer: { signatures(data: string): string[] }): Set<string> {
  return new Set(sealer.signatures(HOP_DATA).map(hopOf));
}
