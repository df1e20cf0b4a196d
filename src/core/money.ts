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
  // A plain decimal string (Postgres NUMERIC text, amounts in transit): the same canonical form
  // without building a Decimal.
  if (typeof value === 'string') {
    const canonical = canonicalDecimal(value);
    if (canonical !== undefined) return canonical;
  }
  const s = (Decimal.isDecimal(value) ? (value as Decimal) : new Money(value)).toFixed();
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}

const isDigit = (c: number) => c >= 48 && c <= 57;

/**
 * `-?digits(.digits)?` in canonical form — leading zeros of the integer and trailing zeros of the
 * fraction dropped, zero without a sign — in one pass; undefined for anything else.
 */
function canonicalDecimal(value: string): string | undefined {
  const n = value.length;
  let i = value.charCodeAt(0) === 45 ? 1 : 0;
  const whole = i;
  while (i < n && isDigit(value.charCodeAt(i))) i++;
  const wholeEnd = i;
  if (wholeEnd === whole) return undefined;
  let end = wholeEnd;
  if (i < n) {
    if (value.charCodeAt(i) !== 46) return undefined;
    const fraction = ++i;
    while (i < n && isDigit(value.charCodeAt(i))) i++;
    if (i === fraction || i < n) return undefined;
    end = n;
    while (end > fraction && value.charCodeAt(end - 1) === 48) end--;
    if (end === fraction) end = wholeEnd; // nothing but zeros after the point
  }
  let start = whole;
  while (start < wholeEnd - 1 && value.charCodeAt(start) === 48) start++;
  const digits = start === 0 && end === n ? value : value.slice(start, end);
  if (whole === 0) return digits;
  return digits === '0' ? '0' : `-${digits}`;
}

/**
 * Amounts as whole numbers of 10^-LEDGER_SCALE (a bigint): the arithmetic of the metered hot path (the
 * escrow's slices, a settle's wallet), exact for every amount the ledger holds — prices carry at most
 * PRICE_SCALE decimals, so a charge or a hold carries at most LEDGER_SCALE, and deposits, manual charges
 * and debt limits fewer — converted from and to decimal strings at its edges. (decimal.js there was
 * ~4 % of the proxy's CPU at concurrency 16.)
 */
export type Units = bigint;

const UNIT_DIGITS = '0'.repeat(LEDGER_SCALE);
const UNIT = 10n ** BigInt(LEDGER_SCALE);

/** `value` in units; undefined when it is not a plain decimal string with at most LEDGER_SCALE decimals. */
export function parseUnits(value: string): Units | undefined {
  // (one pass over the characters, then one BigInt: a regular expression here was ~1.5 % of the proxy's CPU)
  const n = value.length;
  let i = value.charCodeAt(0) === 45 ? 1 : 0;
  const whole = i;
  while (i < n && isDigit(value.charCodeAt(i))) i++;
  if (i === whole) return undefined;
  if (i === n) return BigInt(value) * UNIT;
  if (value.charCodeAt(i) !== 46) return undefined;
  const dot = i++;
  while (i < n && isDigit(value.charCodeAt(i))) i++;
  if (i === dot + 1 || i < n) return undefined;
  let digits = n - dot - 1;
  if (digits > LEDGER_SCALE) {
    // finer digits are accepted only when they are zeros (Postgres NUMERIC text of a wider scale)
    for (let k = dot + 1 + LEDGER_SCALE; k < n; k++) if (value.charCodeAt(k) !== 48) return undefined;
    digits = LEDGER_SCALE;
  }
  return BigInt(value.slice(0, dot) + value.slice(dot + 1, dot + 1 + digits) + UNIT_DIGITS.slice(digits));
}

/** An amount of the ledger in units: a RangeError for anything finer (which the ledger never holds). */
export function toUnits(value: string): Units {
  const units = parseUnits(value);
  if (units === undefined) {
    throw new RangeError(`${JSON.stringify(value)} is not an amount of at most ${LEDGER_SCALE} decimals`);
  }
  return units;
}

/** The canonical decimal string of an amount in units (as `formatAmount` writes it). */
export function fromUnits(units: Units): string {
  const negative = units < 0n;
  const digits = (negative ? -units : units).toString().padStart(LEDGER_SCALE + 1, '0');
  const cut = digits.length - LEDGER_SCALE;
  let end = digits.length;
  while (end > cut && digits.charCodeAt(end - 1) === 48) end--;
  const text = end === cut ? digits.slice(0, cut) : `${digits.slice(0, cut)}.${digits.slice(cut, end)}`;
  return negative ? `-${text}` : text;
}

/** The smaller of two amounts in units (Math.min takes no bigint). */
export function minUnits(a: Units, b: Units): Units {
  if (b < a) return b;
  return a;
}

/** The larger of two amounts in units. */
export function maxUnits(a: Units, b: Units): Units {
  if (b > a) return b;
  return a;
}

/** `a − b`, canonical and exact: in units when both fit, by decimal.js otherwise. */
export function difference(a: string, b: string): string {
  const ua = parseUnits(a);
  const ub = parseUnits(b);
  return ua !== undefined && ub !== undefined ? fromUnits(ua - ub) : formatAmount(new Money(a).minus(b));
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
 * An amount as a person reads it: rounded to the currency's decimals ("9.999982" → "10.00" for usd);
 * an amount that is not zero but rounds to zero says so ("<0.01", "-<0.01") instead of showing "0.00".
 * For display only: the ledger, the API and the CSV exports keep the exact value.
 */
export function displayAmount(value: Decimal.Value, currency: string): string {
  const d = new Money(value);
  const decimals = currencyDecimals(currency);
  const shown = d.toDecimalPlaces(decimals);
  if (shown.isZero()) {
    if (d.isZero()) return new Money(0).toFixed(decimals);
    const unit = new Money(1).dividedBy(10 ** decimals).toFixed(decimals);
    return d.isNegative() ? `-<${unit}` : `<${unit}`;
  }
  return shown.toFixed(decimals);
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
