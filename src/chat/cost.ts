import { formatAmount, Money } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';
import { periodSeconds } from '../models/pricing.ts';

/**
 * What a chat request costs, exactly (decimal.js, never floats):
 * - per request: the model's price;
 * - per token: input_tokens × inputPerMillion / 1e6 + output_tokens × outputPerMillion / 1e6;
 * - subscription: nothing per request (the period fee is charged when a period starts).
 */
export type ChatPricing =
  | { mode: 'per_request'; perRequest: Money }
  | { mode: 'per_token'; inputPerMillion: Money; outputPerMillion: Money }
  | { mode: 'subscription'; fee: string; periodSeconds: number };

const MILLION = new Money(1_000_000);

// Model rows are cached in the project context, so their parsed pricing is cached alongside.
const parsed = new WeakMap<ModelRow, ChatPricing>();

export function chatPricing(model: ModelRow): ChatPricing {
  let pricing = parsed.get(model);
  if (pricing) return pricing;
  switch (model.pricing_mode) {
    case 'per_request':
      pricing = { mode: 'per_request', perRequest: new Money(model.per_request ?? '0') };
      break;
    case 'per_token':
      pricing = {
        mode: 'per_token',
        inputPerMillion: new Money(model.input_per_million ?? '0'),
        outputPerMillion: new Money(model.output_per_million ?? '0'),
      };
      break;
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

/** Exact cost of a per-token request, as a canonical decimal string. */
export function tokenCost(
  pricing: { inputPerMillion: Money; outputPerMillion: Money },
  inputTokens: number,
  outputTokens: number,
): string {
  return formatAmount(
    pricing.inputPerMillion
      .times(inputTokens)
      .plus(pricing.outputPerMillion.times(outputTokens))
      .div(MILLION),
  );
}

/** The real cost of a served request under a metered pricing. */
export function requestCost(pricing: ChatPricing, inputTokens: number, outputTokens: number): string {
  switch (pricing.mode) {
    case 'per_request':
      return formatAmount(pricing.perRequest);
    case 'per_token':
      return tokenCost(pricing, inputTokens, outputTokens);
    case 'subscription':
      return '0';
  }
}
