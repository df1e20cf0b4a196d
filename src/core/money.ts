import { Decimal } from 'decimal.js';
import { z } from 'zod';

/**
 * Money is exact: amounts travel as decimal strings, are computed with decimal.js and stored as
 * Postgres NUMERIC. A JS number never holds an amount.
 *
 * Deposits and manual charges are limited to the currency's minor unit (2 decimals for usd, 0 for jpy).
 * Metered charges (per-token prices) may carry up to LEDGER_SCALE decimals so that nothing is rounded.
 */
export const Money = Decimal.clone({
  precision: 60,
  rounding: Decimal.ROUND_HALF_EVEN,
  toExpNeg: -40,
  toExpPos: 60,
});
export type Money = Decimal;

export const LEDGER_SCALE = 12;
/** Largest single deposit or charge accepted. */
export const MAX_AMOUNT = new Money('1000000000');
/** Prices carry at most this many decimals, which keeps per-token costs exact at LEDGER_SCALE. */
export const PRICE_SCALE = 6;

const ZERO_DECIMAL_CURRENCIES = new Set([
  'bif',
  'clp',
  'djf',
  'gnf',
  'jpy',
  'kmf',
  'krw',
  'mga',
  'pyg',
  'rwf',
  'ugx',
  'vnd',
  'vuv',
  'xaf',
  'xof',
  'xpf',
]);
const THREE_DECIMAL_CURRENCIES = new Set(['bhd', 'jod', 'kwd', 'omr', 'tnd']);

export function currencyDecimals(currency: string): number {
  if (ZERO_DECIMAL_CURRENCIES.has(currency)) return 0;
  if (THREE_DECIMAL_CURRENCIES.has(currency)) return 3;
  return 2;
}

export const currencySchema = z
  .string()
  .regex(/^[a-z]{3}$/, { message: 'must be a lowercase three-letter currency code such as usd' });

const DECIMAL_RE = /^(0|[1-9]\d*)(\.\d+)?$/;

const PLAIN_DECIMAL_RE = /^(-?)(\d+)(?:\.(\d+))?$/;

/** Canonical string of a decimal: no exponent, no trailing zeros beyond the fraction needed. */
export function formatAmount(value: Decimal.Value): string {
  // A plain decimal string (Postgres NUMERIC text, amounts in transit): the same canonical form
  // without building a Decimal — leading zeros of the integer and trailing zeros of the fraction go,
  // and zero has no sign.
  if (typeof value === 'string') {
    const match = PLAIN_DECIMAL_RE.exec(value);
    if (match) return canonicalDecimal(match[1]!, match[2]!, match[3] ?? '');
  }
  const s = (Decimal.isDecimal(value) ? (value as Decimal) : new Money(value)).toFixed();
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}

function canonicalDecimal(sign: string, integer: string, fraction: string): string {
  let start = 0;
  while (start < integer.length - 1 && integer.charCodeAt(start) === 48) start++;
  let end = fraction.length;
  while (end > 0 && fraction.charCodeAt(end - 1) === 48) end--;
  const whole = start ? integer.slice(start) : integer;
  const digits = end ? `${whole}.${end === fraction.length ? fraction : fraction.slice(0, end)}` : whole;
  return sign && digits !== '0' ? `-${digits}` : digits;
}

/** Formats with at least the currency's decimals (e.g. "10.50" for usd), keeping any finer digits. */
export function formatForCurrency(value: Decimal.Value, currency: string): string {
  const d = new Money(value);
  const min = currencyDecimals(currency);
  const canonical = formatAmount(d);
  const decimals = canonical.includes('.') ? canonical.split('.')[1]!.length : 0;
  return d.toFixed(Math.max(min, decimals));
}

const DECIMAL_MESSAGE = 'must be a decimal string such as "10.00"';

/**
 * A positive amount string below MAX_AMOUNT, checked in order: the pattern (ASCII digits, one optional
 * fraction), then `maxDecimals` when given, then the range. Each check runs only when the previous ones
 * passed, so no malformed string ever reaches decimal.js.
 */
function positiveAmount(maxDecimals: number | undefined, currency: string | undefined) {
  return z
    .string({ message: DECIMAL_MESSAGE })
    .trim()
    .superRefine((v, ctx) => {
      const fail = (message: string) => ctx.addIssue({ code: 'custom', message, input: v });
      if (!DECIMAL_RE.test(v)) return fail(DECIMAL_MESSAGE);
      if (maxDecimals !== undefined && (v.split('.')[1]?.length ?? 0) > maxDecimals)
        return fail(`must have at most ${maxDecimals} decimal places for ${currency}`);
      const d = new Money(v);
      if (!d.gt(0)) return fail('must be greater than 0');
      if (!d.lte(MAX_AMOUNT)) return fail(`must be at most ${MAX_AMOUNT.toFixed()}`);
    });
}

/**
 * A positive amount string within the currency's precision and below MAX_AMOUNT, in the currency's
 * canonical form ("10.50" for usd). Used for deposits, manual charges and top-up links.
 */
export function amountSchema(currency: string) {
  return positiveAmount(currencyDecimals(currency), currency).transform((v) =>
    formatForCurrency(v, currency),
  );
}

/**
 * The currency-independent part of `amountSchema` (a positive decimal string below MAX_AMOUNT), for
 * route schemas, which are compiled before the project and its currency are known.
 */
export const amountInputSchema = positiveAmount(undefined, undefined);

/** A non-negative price with at most PRICE_SCALE decimals (given as a string or a number in YAML). */
export const priceSchema = z
  .union([z.string(), z.number()])
  .transform((v) => (typeof v === 'number' ? String(v) : v.trim()))
  .superRefine((v, ctx) => {
    const fail = (message: string) => ctx.addIssue({ code: 'custom', message, input: v });
    if (!DECIMAL_RE.test(v)) return fail('must be a non-negative decimal such as "0.15"');
    if ((v.split('.')[1]?.length ?? 0) > PRICE_SCALE)
      return fail(`must have at most ${PRICE_SCALE} decimal places`);
    if (!new Money(v).lte(MAX_AMOUNT)) return fail(`must be at most ${MAX_AMOUNT.toFixed()}`);
  })
  .transform((v) => formatAmount(v));
