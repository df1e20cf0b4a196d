import { formatAmount, Money } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';
import { periodSeconds } from '../models/pricing.ts';

/**
 * What a metered request costs, exactly (decimal.js, never floats):
 * - per request: the model's price;
 * - per token: (input − cached) × inputPerMillion / 1e6 + cached × cachedInputPerMillion / 1e6
 *   + output × outputPerMillion / 1e6 — `cachedInputPerMillion` defaults to the input price, and
 *   reasoning tokens are part of the output (providers count them in `completion_tokens` /
 *   `output_tokens`);
 * - subscription: nothing per request (the period fee is charged when a period starts).
 */
export type MeteredPricing =
  | { mode: 'per_request'; perRequest: Money }
  | { mode: 'per_token'; inputPerMillion: Money; outputPerMillion: Money; cachedInputPerMillion: Money }
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

/** Exact cost of a per-token request, as a canonical decimal string. */
export function tokenCost(
  pricing: { inputPerMillion: Money; outputPerMillion: Money; cachedInputPerMillion?: Money },
  inputTokens: number,
  outputTokens: number,
  cachedInputTokens = 0,
): string {
  const cached = Math.min(cachedInputTokens, inputTokens);
  return formatAmount(
    pricing.inputPerMillion
      .times(inputTokens - cached)
      .plus((pricing.cachedInputPerMillion ?? pricing.inputPerMillion).times(cached))
      .plus(pricing.outputPerMillion.times(outputTokens))
      .div(MILLION),
  );
}

/** The most a per-token request can cost: cached input is never assumed (nor priced above input). */
export function tokenHold(
  pricing: { inputPerMillion: Money; outputPerMillion: Money; cachedInputPerMillion: Money },
  inputTokens: number,
  outputTokens: number,
): string {
  const input = Money.max(pricing.inputPerMillion, pricing.cachedInputPerMillion);
  return tokenCost(
    { inputPerMillion: input, outputPerMillion: pricing.outputPerMillion },
    inputTokens,
    outputTokens,
  );
}

/** The real cost of a served request under a metered pricing. */
export function requestCost(pricing: MeteredPricing, usage: TokenUsage): string {
  switch (pricing.mode) {
    case 'per_request':
      return formatAmount(pricing.perRequest);
    case 'per_token':
      return tokenCost(pricing, usage.input, usage.output, usage.cachedInput);
    case 'subscription':
      return '0';
  }
}
