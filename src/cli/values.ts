import { readFileSync } from 'node:fs';
import { type Grant, UsageError } from '../admin/operations.ts';
import { amountSchema } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { PricingFile } from '../models/pricing.ts';
import { parsePricingFile } from '../models/service.ts';
import { grantBody } from '../users/schema.ts';
import type { GrantRequest } from '../users/service.ts';

/** The parsed options of an admin command, read the same way on the database and over HTTP. */
export type Values = Record<string, string | boolean | string[] | undefined>;

export function required(values: Values, name: string): string {
  const value = values[name];
  if (typeof value !== 'string' || value === '') throw new UsageError(`--${name} is required`);
  return value;
}

export function optional(values: Values, name: string): string | undefined {
  const value = values[name];
  return typeof value === 'string' ? value : undefined;
}

/** The project settings given as options (`project create/set`). */
export function settingsFrom(values: Values) {
  const maxTokens = optional(values, 'max-completion-tokens');
  const settings = {
    checkoutUrl: optional(values, 'checkout-url'),
    returnUrl: optional(values, 'return-url'),
    connectMessage: optional(values, 'connect-message'),
    topupMessage: optional(values, 'topup-message'),
    maxCompletionTokens: maxTokens === undefined ? undefined : Number(maxTokens),
    debtLimit: optional(values, 'debt-limit'),
  };
  return Object.fromEntries(Object.entries(settings).filter(([, v]) => v !== undefined));
}

/** The pricing file named by `--file`, read and checked. */
export function pricingFileFrom(values: Values): PricingFile {
  const path = required(values, 'file');
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new UsageError(
      `cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  return parsePricingFile(text);
}

/**
 * A credit grant given as options (`users grant`), validated by the API's own schema — and, on the
 * database, in the project's currency.
 */
export function grantInputFrom(values: Values, currency?: string): GrantRequest {
  const priority = optional(values, 'priority');
  const input = parseInput(grantBody, {
    user: required(values, 'user'),
    amount: required(values, 'amount'),
    reason: required(values, 'reason'),
    ...(priority === undefined ? {} : { priority: Number(priority) }),
    ...(optional(values, 'expires') === undefined ? {} : { expiresAt: optional(values, 'expires') }),
  });
  if (currency) input.amount = parseInput(amountSchema(currency), input.amount, 'amount');
  return input;
}

/** One line saying what a grant did. */
export function grantSummary(g: Grant): string {
  return `Granted ${g.amount} ${g.currency} of ${g.reason} credit to ${g.user}${g.expiresAt ? ` (expires ${g.expiresAt})` : ''}; balance ${g.balance} ${g.currency}`;
}

/** `--days N` as a number (the schema checks the range); undefined when not given. */
export function days(values: Values): number | undefined {
  const given = optional(values, 'days');
  if (given === undefined) return undefined;
  if (!/^\d+$/.test(given)) throw new UsageError('--days must be a whole number of days (1 to 90)');
  return Number(given);
}

/** An option that must be a positive whole number when given. */
export function optionalNumber(value: unknown, name: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 100_000)
    throw new UsageError(`--${name} must be a whole number from 1 to 100000`);
  return n;
}
