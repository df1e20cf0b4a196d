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

/** Canonical string of a decimal: no exponent, no trailing zeros beyond the fraction needed. */
export function formatAmount(value: Decimal.Value): string {
  const d = new Money(value);
  const s = d.toFixed();
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}

/** Formats with at least the currency's decimals (e.g. "10.50" for usd), keeping any finer digits. */
export function formatForCurrency(value: Decimal.Value, currency: string): string {
  const d = new Money(value);
  const min = currencyDecimals(currency);
  const canonical = formatAmount(d);
  const decimals = canonical.includes('.') ? canonical.split('.')[1]!.length : 0;
  return d.toFixed(Math.max(min, decimals));
}

/**
 * A positive amount string within the currency's precision and below MAX_AMOUNT. Used for deposits and
 * manual charges.
 */
export function amountSchema(currency: string) {
  const decimals = currencyDecimals(currency);
  return z
    .string({ message: 'must be a decimal string such as "10.00"' })
    .trim()
    .refine((v) => DECIMAL_RE.test(v), { message: 'must be a decimal string such as "10.00"' })
    .refine((v) => (v.split('.')[1]?.length ?? 0) <= decimals, {
      message: `must have at most ${decimals} decimal places for ${currency}`,
    })
    .refine((v) => new Money(v).gt(0), { message: 'must be greater than 0' })
    .refine((v) => new Money(v).lte(MAX_AMOUNT), { message: `must be at most ${MAX_AMOUNT.toFixed()}` })
    .transform((v) => formatForCurrency(v, currency));
}

/** A non-negative price with at most PRICE_SCALE decimals (given as a string or a number in YAML). */
export const priceSchema = z
  .union([z.string(), z.number()])
  .transform((v) => (typeof v === 'number' ? String(v) : v.trim()))
  .refine((v) => DECIMAL_RE.test(v), { message: 'must be a non-negative decimal such as "0.15"' })
  .refine((v) => (v.split('.')[1]?.length ?? 0) <= PRICE_SCALE, {
    message: `must have at most ${PRICE_SCALE} decimal places`,
  })
  .refine((v) => new Money(v).lte(MAX_AMOUNT), { message: `must be at most ${MAX_AMOUNT.toFixed()}` })
  .transform((v) => formatAmount(v));
