import { formatAmount, Money } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';
import { cacheWritePrices, periodSeconds } from '../models/pricing.ts';

/**
 * What a metered request costs, exactly (decimal.js, never floats):
 * - per request: the model's price;
 * - per token: (input − cached − cache writes) × inputPerMillion / 1e6 + cached × cachedInputPerMillion
 *   / 1e6 + 5-minute cache writes × cacheWritePerMillion / 1e6 + 1-hour cache writes ×
 *   cacheWrite1hPerMillion / 1e6 + output × outputPerMillion / 1e6 — `cachedInputPerMillion` defaults to
 *   the input price, the cache write prices to 1.25× / 2× the input price on Claude-family models (the
 *   input price elsewhere), and reasoning tokens are part of the output (the API readers add those a
 *   provider reports beside `completion_tokens` / `output_tokens`);
 * - subscription: nothing per request (the period fee is charged when a period starts).
 */
export type MeteredPricing =
  | { mode: 'per_request'; perRequest: Money }
  | {
      mode: 'per_token';
      inputPerMillion: Money;
      outputPerMillion: Money;
      cachedInputPerMillion: Money;
      cacheWritePerMillion: Money;
      cacheWrite1hPerMillion: Money;
    }
  | { mode: 'subscription'; fee: string; periodSeconds: number };
/** @deprecated the name from when only chat was metered */
export type ChatPricing = MeteredPricing;

/** Tokens of one request, as the provider reports them (or as Tollgate counted them). */
export interface TokenUsage {
  /** All input tokens, cached ones included. */
  input: number;
  /** The part of `input` the provider read from its cache. */
  cachedInput: number;
  /** All output tokens, reasoning ones included. */
  output: number;
  /** The part of `output` spent on reasoning (recorded, priced as output). */
  reasoning: number;
  /** The part of `input` the provider wrote to its cache (Anthropic's `cache_creation_input_tokens`). */
  cacheWrite?: number;
  /** The part of `cacheWrite` written for one hour (`cache_creation.ephemeral_1h_input_tokens`). */
  cacheWrite1h?: number;
}

const MILLION = new Money(1_000_000);

// Model rows are cached in the project context, so their parsed pricing is cached alongside.
const parsed = new WeakMap<ModelRow, MeteredPricing>();

export function meteredPricing(model: ModelRow): MeteredPricing {
  let pricing = parsed.get(model);
  if (pricing) return pricing;
  switch (model.pricing_mode) {
    case 'per_request':
      pricing = { mode: 'per_request', perRequest: new Money(model.per_request ?? '0') };
      break;
    case 'per_token': {
      const input = new Money(model.input_per_million ?? '0');
      pricing = {
        mode: 'per_token',
        inputPerMillion: input,
        outputPerMillion: new Money(model.output_per_million ?? '0'),
        cachedInputPerMillion:
          model.cached_input_per_million != null ? new Money(model.cached_input_per_million) : input,
        ...cacheWritePrices(model, input),
      };
      break;
    }
    case 'subscription':
      pricing = {
        mode: 'subscription',
        fee: formatAmount(model.fee ?? '0'),
        periodSeconds: model.period_seconds ?? periodSeconds(model.period ?? '30d'),
      };
      break;
  }
  parsed.set(model, pricing);
  return pricing;
}
export const chatPricing = meteredPricing;

/** The prices of a per-token cost; those left out are the input price. */
export interface TokenPrices {
  inputPerMillion: Money;
  outputPerMillion: Money;
  cachedInputPerMillion?: Money;
  cacheWritePerMillion?: Money;
  cacheWrite1hPerMillion?: Money;
}

/**
 * Exact cost of a per-token request, as a canonical decimal string. `cache` splits the input: the
 * cached part, and the part written to the cache (of which `write1h` for one hour); each is at most
 * what is left of the input.
 */
export function tokenCost(
  pricing: TokenPrices,
  inputTokens: number,
  outputTokens: number,
  cachedInputTokens = 0,
  cacheWrite: { write: number; write1h: number } = NO_WRITES,
): string {
  const cached = Math.min(cachedInputTokens, inputTokens);
  const written = Math.min(cacheWrite.write, inputTokens - cached);
  const written1h = Math.min(cacheWrite.write1h, written);
  const input = pricing.inputPerMillion;
  if (written === 0) {
    return costOf(
      input,
      inputTokens - cached,
      pricing.cachedInputPerMillion ?? input,
      cached,
      pricing.outputPerMillion,
      outputTokens,
    );
  }
  return costOf(
    input,
    inputTokens - cached - written,
    pricing.cachedInputPerMillion ?? input,
    cached,
    pricing.outputPerMillion,
    outputTokens,
    [
      [pricing.cacheWritePerMillion ?? input, written - written1h],
      [pricing.cacheWrite1hPerMillion ?? input, written1h],
    ],
  );
}

const NO_WRITES = { write: 0, write1h: 0 };

/**
 * The most a per-token request can cost: cached input is never assumed (nor priced above input), and a
 * request asking for cache writes (`cacheWrite`) may have every input token written at that price.
 */
export function tokenHold(
  pricing: {
    inputPerMillion: Money;
    outputPerMillion: Money;
    cachedInputPerMillion: Money;
    cacheWritePerMillion?: Money;
    cacheWrite1hPerMillion?: Money;
  },
  inputTokens: number,
  outputTokens: number,
  cacheWrite?: '5m' | '1h',
): string {
  // (The largest of the prices themselves, not a copy: their integer units are cached per price.)
  let input = pricing.cachedInputPerMillion.gt(pricing.inputPerMillion)
    ? pricing.cachedInputPerMillion
    : pricing.inputPerMillion;
  const write =
    cacheWrite === '1h'
      ? pricing.cacheWrite1hPerMillion
      : cacheWrite
        ? pricing.cacheWritePerMillion
        : undefined;
  if (write?.gt(input)) input = write;
  return costOf(input, inputTokens, input, 0, pricing.outputPerMillion, outputTokens);
}

/** (uncached × input + cached × cachedInput + output × outputPrice + Σ more) / 1e6, canonical. */
function costOf(
  inputPrice: Money,
  uncached: number,
  cachedPrice: Money,
  cached: number,
  outputPrice: Money,
  output: number,
  more: ReadonlyArray<readonly [Money, number]> = [],
): string {
  const fast = integerCost(inputPrice, uncached, cachedPrice, cached, outputPrice, output, more);
  if (fast !== undefined) return fast;
  let sum = inputPrice.times(uncached).plus(cachedPrice.times(cached)).plus(outputPrice.times(output));
  for (const [price, tokens] of more) sum = sum.plus(price.times(tokens));
  return formatAmount(sum.div(MILLION));
}

/** A price per million as an integer count of 10^-decimals units (prices are plain, non-negative). */
interface PriceUnits {
  units: number;
  decimals: number;
}

const priceUnits = new WeakMap<Money, PriceUnits | null>();

function unitsOf(price: Money): PriceUnits | null {
  let found = priceUnits.get(price);
  if (found !== undefined) return found;
  const match = /^(\d+)(?:\.(\d+))?$/.exec(price.toFixed());
  const units = match ? Number(match[1]! + (match[2] ?? '')) : Number.NaN;
  found = Number.isSafeInteger(units) ? { units, decimals: match![2]?.length ?? 0 } : null;
  priceUnits.set(price, found);
  return found;
}

/** tokens × price in 10^-decimals units (NaN when not a safe integer: then decimal.js decides). */
function term(tokens: number, price: PriceUnits, decimals: number): number {
  if (!Number.isSafeInteger(tokens) || tokens < 0) return Number.NaN;
  const product = tokens * price.units * 10 ** (decimals - price.decimals);
  return Number.isSafeInteger(product) ? product : Number.NaN;
}

/**
 * Σ tokens × price / 1e6, exactly, in integers: each price is a whole number of 10^-d units (d its
 * decimals, at most PRICE_SCALE for prices of the pricing file), so the cost is a whole number of
 * 10^-(D+6) units, D the most decimals of the prices. Undefined when a price is not a plain decimal or
 * a product leaves the safe integers: decimal.js then, with the same result.
 */
function integerCost(
  a: Money,
  aTokens: number,
  b: Money,
  bTokens: number,
  c: Money,
  cTokens: number,
  more: ReadonlyArray<readonly [Money, number]> = [],
): string | undefined {
  const ua = unitsOf(a);
  const ub = unitsOf(b);
  const uc = unitsOf(c);
  if (!ua || !ub || !uc) return undefined;
  let decimals = Math.max(ua.decimals, ub.decimals, uc.decimals);
  const extra: PriceUnits[] = [];
  for (const [price] of more) {
    const u = unitsOf(price);
    if (!u) return undefined;
    extra.push(u);
    if (u.decimals > decimals) decimals = u.decimals;
  }
  let total = term(aTokens, ua, decimals) + term(bTokens, ub, decimals) + term(cTokens, uc, decimals);
  for (let i = 0; i < extra.length; i++) total += term(more[i]![1], extra[i]!, decimals);
  if (!Number.isSafeInteger(total)) return undefined;
  return scaledToDecimal(total, decimals + 6);
}

/** The canonical decimal string of `value` × 10^-scale (value a non-negative safe integer). */
function scaledToDecimal(value: number, scale: number): string {
  if (value === 0) return '0';
  const digits = String(value).padStart(scale + 1, '0');
  const cut = digits.length - scale;
  let end = digits.length;
  while (end > cut && digits.charCodeAt(end - 1) === 48) end--;
  return end === cut ? digits.slice(0, cut) : `${digits.slice(0, cut)}.${digits.slice(cut, end)}`;
}

/** The real cost of a served request under a metered pricing. */
export function requestCost(pricing: MeteredPricing, usage: TokenUsage): string {
  switch (pricing.mode) {
    case 'per_request':
      return formatAmount(pricing.perRequest);
    case 'per_token':
      return tokenCost(pricing, usage.input, usage.output, usage.cachedInput, {
        write: usage.cacheWrite ?? 0,
        write1h: usage.cacheWrite1h ?? 0,
      });
    case 'subscription':
      return '0';
  }
}
