import { createHmac, timingSafeEqual } from 'node:crypto';

/**
 * Verifies a Tollgate webhook on the receiving side. Import it from `tollgate/webhooks/verify`.
 *
 * Checks, in order: the signature header is present and 64 hex characters; it equals the HMAC-SHA256
 * of the raw body keyed with the subscription secret (constant-time comparison of equal-length
 * buffers); the timestamp header is present, parseable and within `toleranceSeconds` of now; and it
 * equals `delivery.updatedAt` inside the signed body, so it cannot have been altered in transit.
 */
export interface VerifyOptions {
  /** Largest accepted distance between X-Service-Timestamp and now; default 300 s. 0 disables. */
  toleranceSeconds?: number;
  /** The current time (tests). */
  now?: Date;
}

export type VerifyResult =
  | { ok: true; payload: { delivery: Record<string, unknown>; event: Record<string, unknown> } }
  | {
      ok: false;
      reason:
        | 'missing_signature'
        | 'malformed_signature'
        | 'signature_mismatch'
        | 'missing_timestamp'
        | 'malformed_timestamp'
        | 'timestamp_out_of_window'
        | 'timestamp_mismatch'
        | 'malformed_body';
    };

type HeaderBag =
  | Headers
  | Record<string, string | string[] | undefined>
  | { get(name: string): string | null };

function header(headers: HeaderBag, name: string): string | undefined {
  if (typeof (headers as Headers).get === 'function') return (headers as Headers).get(name) ?? undefined;
  const record = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(record).find((k) => k.toLowerCase() === name);
  const value = key === undefined ? undefined : record[key];
  return Array.isArray(value) ? value[0] : value;
}

export function verifyWebhook(
  secret: string,
  rawBody: string | Uint8Array,
  headers: HeaderBag,
  options: VerifyOptions = {},
): VerifyResult {
  const tolerance = options.toleranceSeconds ?? 300;
  const signature = header(headers, 'x-service-signature')?.trim();
  if (!signature) return { ok: false, reason: 'missing_signature' };
  if (!/^[0-9a-fA-F]{64}$/.test(signature)) return { ok: false, reason: 'malformed_signature' };
  const body = typeof rawBody === 'string' ? Buffer.from(rawBody, 'utf8') : Buffer.from(rawBody);
  const expected = createHmac('sha256', secret).update(body).digest();
  const given = Buffer.from(signature, 'hex');
  if (given.length !== expected.length || !timingSafeEqual(given, expected))
    return { ok: false, reason: 'signature_mismatch' };
  const timestamp = header(headers, 'x-service-timestamp')?.trim();
  if (!timestamp) return { ok: false, reason: 'missing_timestamp' };
  const at = Date.parse(timestamp);
  if (Number.isNaN(at)) return { ok: false, reason: 'malformed_timestamp' };
  const now = (options.now ?? new Date()).getTime();
  if (tolerance > 0 && Math.abs(now - at) > tolerance * 1000)
    return { ok: false, reason: 'timestamp_out_of_window' };
  let payload: { delivery: Record<string, unknown>; event: Record<string, unknown> };
  try {
    payload = JSON.parse(body.toString('utf8'));
  } catch {
    return { ok: false, reason: 'malformed_body' };
  }
  if (!payload || typeof payload !== 'object' || !payload.delivery || !payload.event)
    return { ok: false, reason: 'malformed_body' };
  const signedAt = payload.delivery.updatedAt;
  if (typeof signedAt === 'string' && Date.parse(signedAt) !== at)
    return { ok: false, reason: 'timestamp_mismatch' };
  return { ok: true, payload };
}
