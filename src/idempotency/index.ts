import { sql, type Transaction } from 'kysely';
import { sha256Hex } from '../core/crypto.ts';
import { ApiError, badRequest, conflict } from '../core/errors.ts';
import type { Database, DB } from '../db/index.ts';

/**
 * Idempotency keys for requests that move money (`Idempotency-Key` header).
 *
 * A key is scoped per project and endpoint. The first request with a key inserts the key row and runs
 * its work in the same transaction, storing its response there too: the money move and the stored
 * response commit together or not at all. A request arriving while the first one is still running
 * blocks on the key's unique index until that transaction ends, then replays the stored response (same
 * status, byte for byte the same body) — or gets 409 when its body differs. When the first request fails (its
 * transaction rolls back), the key is free again and a retry runs anew.
 *
 * Keys are kept for IDEMPOTENCY_KEY_TTL_SECONDS (24 hours); an expired key is taken over by the next
 * request that uses it, and the cleanup job deletes expired rows.
 */
export const IDEMPOTENCY_KEY_TTL_SECONDS = 24 * 3600;
export const IDEMPOTENCY_HEADER = 'idempotency-key';
const KEY_RE = /^[\x20-\x7e]{1,255}$/;

export interface IdempotencyScope {
  projectId: string;
  /** e.g. `POST /v1/user/charge` */
  endpoint: string;
  key: string;
  /** requestHash() of the request body */
  requestHash: string;
}

export interface IdempotentResponse {
  status: number;
  body: unknown;
}

export interface IdempotentResult extends IdempotentResponse {
  /** True when this is the stored response of an earlier request with the same key. */
  replayed: boolean;
  /**
   * The response body as JSON text: the bytes stored for the key, which the first response and every
   * replay send (as Stripe does), so a replay is byte-identical. Absent without a key.
   */
  raw?: string;
}

/**
 * Reads the `Idempotency-Key` header: undefined when absent, 400 when it is not 1–255 printable ASCII
 * characters.
 */
export function idempotencyKeyFrom(
  headers: Record<string, string | string[] | undefined>,
): string | undefined {
  const raw = headers[IDEMPOTENCY_HEADER];
  if (raw === undefined) return undefined;
  const value = Array.isArray(raw) ? raw.join(', ') : raw;
  if (!KEY_RE.test(value)) {
    throw badRequest(
      'Invalid Idempotency-Key header: it must be 1 to 255 printable ASCII characters.',
      'Idempotency-Key',
      'invalid_idempotency_key',
    );
  }
  return value;
}

/** Canonical JSON (object keys sorted) of a value, so that key order and whitespace do not matter. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.keys(value as Record<string, unknown>)
      .sort()
      .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`);
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(value ?? null);
}

/**
 * Where the work runs: a billing transaction (src/billing/service.ts `transaction`), whose money effects
 * run after the commit. Callers pass the application context.
 */
export interface MoneyTransactions {
  billing: { transaction<T>(fn: (tx: Transaction<DB>) => Promise<T>): Promise<T> };
}

/** The fingerprint of a request body that a reused key must match. */
export function requestHash(body: unknown): string {
  return sha256Hex(canonicalJson(body));
}

/**
 * Runs `fn` at most once per key: in one transaction, claims the key, runs `fn(tx)` and stores its
 * response. A later (or concurrent) request with the same key and body gets the stored response with
 * `replayed: true`; one with a different body gets 409. `fn` gets the transaction to move money in
 * (a billing transaction: the effects of what moved run after it commits, and never for a replay).
 */
export async function withIdempotency(
  ctx: MoneyTransactions,
  scope: IdempotencyScope,
  fn: (tx: Transaction<DB>) => Promise<IdempotentResponse>,
  ttlSeconds = IDEMPOTENCY_KEY_TTL_SECONDS,
): Promise<IdempotentResult> {
  return ctx.billing.transaction(async (tx) => {
    // Claims the key; an expired row is taken over. When another transaction holds an uncommitted row
    // for the key, this statement waits for it to end.
    const claimed = await tx
      .insertInto('idempotency_keys')
      .values({
        project_id: scope.projectId,
        endpoint: scope.endpoint,
        key: scope.key,
        request_hash: scope.requestHash,
        expires_at: sql`now() + make_interval(secs => ${ttlSeconds})`,
      })
      .onConflict((oc) =>
        oc
          .columns(['project_id', 'endpoint', 'key'])
          .doUpdateSet({
            request_hash: scope.requestHash,
            status_code: null,
            response_body: null,
            created_at: sql`now()`,
            expires_at: sql`now() + make_interval(secs => ${ttlSeconds})`,
          })
          .where('idempotency_keys.expires_at', '<=', sql<Date>`now()`),
      )
      .returning('key')
      .executeTakeFirst();
    if (!claimed) return replay(tx, scope);
    const response = await fn(tx);
    const raw = JSON.stringify(response.body);
    await tx
      .updateTable('idempotency_keys')
      .set({ status_code: response.status, response_body: raw })
      .where('project_id', '=', scope.projectId)
      .where('endpoint', '=', scope.endpoint)
      .where('key', '=', scope.key)
      .execute();
    return { ...response, raw, replayed: false };
  });
}

async function replay(tx: Transaction<DB>, scope: IdempotencyScope): Promise<IdempotentResult> {
  const row = await tx
    .selectFrom('idempotency_keys')
    .select(['request_hash', 'status_code', 'response_body'])
    .where('project_id', '=', scope.projectId)
    .where('endpoint', '=', scope.endpoint)
    .where('key', '=', scope.key)
    .executeTakeFirst();
  if (!row || row.status_code === null || row.response_body === null) {
    // Cannot happen while rows are written with their response in one transaction; never guess.
    throw new ApiError(409, 'conflict_error', 'A request with this Idempotency-Key is still in progress.', {
      code: 'idempotency_key_in_use',
    });
  }
  if (row.request_hash !== scope.requestHash) {
    throw conflict(
      'This Idempotency-Key was already used with a different request body. Use a new key for a new request.',
      'idempotency_key_reused',
    );
  }
  return {
    status: row.status_code,
    body: JSON.parse(row.response_body),
    raw: row.response_body,
    replayed: true,
  };
}

/** Deletes expired keys; returns how many. */
export async function deleteExpiredIdempotencyKeys(db: Database, limit = 5000): Promise<number> {
  const result = await sql<{ n: string }>`
    WITH gone AS (
      DELETE FROM idempotency_keys WHERE ctid IN (
        SELECT ctid FROM idempotency_keys WHERE expires_at <= now() LIMIT ${limit}
      ) RETURNING 1
    )
    SELECT count(*)::text AS n FROM gone
  `.execute(db);
  return Number(result.rows[0]?.n ?? 0);
}
