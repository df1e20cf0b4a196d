import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { amountInputSchema, amountSchema } from '../core/money.ts';
import {
  isPlainText,
  isStorable,
  NOT_STORABLE,
  parseInput,
  textInput,
  wholeNumberParam,
} from '../core/validation.ts';

/**
 * The request schemas of the end-user API (`/v1/user/*`, and the user fields the other APIs take): the
 * developer's end-user id, metadata, amounts, credit grants. Imports nothing but ../core, so every
 * API's schema can use them.
 */

/** A credit grant's reason: a short lowercase word. */
export const GRANT_REASON_RE = /^[a-z][a-z0-9_-]{0,31}$/;

/** The developer's end-user id: 1–256 characters, no control characters. */
export const userIdSchema = z
  .string({ message: 'must be a string (your end user’s id)' })
  .min(1, { message: 'must not be empty' })
  .max(256, { message: 'must be at most 256 characters' })
  .refine(isPlainText, { message: 'must not contain control characters' });

const METADATA_MAX_KEYS = 50;
const METADATA_MAX_BYTES = 8192;

/** Caller's reference data: a JSON object of at most 50 keys and 8 KB. */
export const metadataSchema = z
  .record(z.string().min(1).max(64), z.unknown(), { message: 'must be a JSON object' })
  .refine((v) => Object.keys(v).length <= METADATA_MAX_KEYS, {
    message: `must have at most ${METADATA_MAX_KEYS} keys`,
  })
  .refine((v) => Buffer.byteLength(JSON.stringify(v)) <= METADATA_MAX_BYTES, {
    message: `must be at most ${METADATA_MAX_BYTES} bytes as JSON`,
  })
  .refine(isStorable, { message: NOT_STORABLE });

/**
 * Route schemas. An amount is checked for its shape here and for the currency's precision (and put in
 * its canonical form) by `inCurrency` once the project is known.
 */
export const moneyBody = z.strictObject({
  user: userIdSchema,
  amount: amountInputSchema,
  metadata: metadataSchema.optional(),
});
export const userBody = z.strictObject({ user: userIdSchema });
/** A user's own low-balance threshold; null: the project's applies again. */
export const alertsBody = z.strictObject({
  user: userIdSchema,
  lowBalanceThreshold: amountInputSchema.nullable(),
});
/** A credit grant: an amount, a reason, and optionally a priority and an expiry (in the future). */
export const grantBody = z.strictObject({
  user: userIdSchema,
  amount: amountInputSchema,
  reason: z.string().regex(GRANT_REASON_RE, {
    message: 'must be a short lowercase word such as "promo", "trial" or "goodwill"',
  }),
  priority: z.number().int().min(-1000).max(1000).optional(),
  expiresAt: z.iso
    .datetime({ offset: true, message: 'must be an ISO 8601 time such as 2027-01-31T00:00:00Z' })
    .refine((v) => new Date(v).getTime() > Date.now(), { message: 'must be in the future' })
    .optional(),
  metadata: metadataSchema.optional(),
});
export const userQuery = z.strictObject({ user: userIdSchema });
/** A new end-user key: its user, a name, and optionally an expiry (in the future) and a spend cap. */
export const userKeyBody = z.strictObject({
  user: userIdSchema,
  name: textInput(64, 'a name for the key, such as "laptop"'),
  expiresAt: z.iso
    .datetime({ offset: true, message: 'must be an ISO 8601 time such as 2027-01-31T00:00:00Z' })
    .refine((v) => new Date(v).getTime() > Date.now(), { message: 'must be in the future' })
    .optional(),
  spendCap: amountInputSchema.optional(),
});
/** The key name a connect link asks for (`?key=NAME`), when it is one. */
export function keyNameOf(query: unknown): string | undefined {
  const name = (query as Record<string, unknown> | undefined)?.key;
  const checked = userKeyBody.shape.name.safeParse(name);
  return checked.success ? checked.data : undefined;
}
export const connectBody = z.strictObject({
  user: userIdSchema,
  keyName: userKeyBody.shape.name.optional(),
});
export const userKeyParams = z.strictObject({
  id: z.string().regex(/^ukey_[0-9a-z]{1,64}$/, { message: 'must be an end-user key id (ukey_…)' }),
});
export const topupBody = z.strictObject({ user: userIdSchema, amount: amountInputSchema.optional() });
export const activityQuery = z.strictObject({
  user: userIdSchema,
  limit: wholeNumberParam(100, 20),
  after: textInput(64).optional(),
});

/** `preHandler` of routes taking an `amount`: the currency's precision and canonical form ("10.50"). */
export async function inCurrency(request: FastifyRequest): Promise<void> {
  const body = request.body as { amount?: string };
  if (body.amount === undefined) return;
  const checked = parseInput(z.object({ amount: amountSchema(request.project.currency) }), {
    amount: body.amount,
  });
  body.amount = checked.amount;
}
