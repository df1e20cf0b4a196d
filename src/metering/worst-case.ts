import type { Logger } from 'pino';
import { ApiError, DATABASE_RETRY_AFTER_SECONDS } from '../core/errors.ts';
import { formatAmount } from '../core/money.ts';
import { holdMarginOf } from '../models/hold-margin.ts';
import { modelLimitsOf } from '../models/output-limits.ts';
import { holdInputTokens } from '../tokens/count.ts';
import type { Exchange } from './api.ts';
import type { ResponseChains } from './chains.ts';
import { tokenHold } from './cost.ts';

/**
 * The worst case of a request — the most it can be charged, known before anything is forwarded — which
 * is what it holds (and what the spend caps reserve):
 * - per request: the price;
 * - per token: input × the largest of the input and cached-input prices (and the cache write price
 *   the body asks for) + bound × choices × the output price, where
 *   - input = ceil(Tollgate's count of the body × the hold margin × the API's margin) + the chain's
 *     recorded size (Responses `previous_response_id` / `conversation`; an unknown chain: the context
 *     window), at most the model's context window (batched inputs — embeddings — are not capped);
 *   - bound = the client's bound, else the model's `maxOutputTokens` capped by the project's
 *     `maxCompletionTokens`; it is the one bound the provider receives.
 * Settlement charges at most these bounds (settlement.ts `withinBounds`): reported usage above them is
 * an anomaly, recorded, not charged.
 */
export function worstCase(
  x: Exchange,
  fallbackOutput: number,
  chain: number | 'unknown' | undefined,
): string {
  const pricing = x.pricing;
  if (pricing.mode === 'per_request') return formatAmount(pricing.perRequest);
  if (pricing.mode !== 'per_token') return '0';
  const limits = modelLimitsOf(x.model, fallbackOutput);
  // Counted cheaply (exact up to a budget, bounded by bytes beyond): a huge prompt never stalls the pod;
  // times the model's hold margin for its provider's tokenizer (src/models/hold-margin.ts).
  const input = holdInputTokens(x.api.countInput, x.body, holdMarginOf(x.model).margin);
  x.inputCount = input.exact;
  const cap = x.project.settings.maxCompletionTokens;
  x.bound =
    x.api.requestedBound(x.body) ??
    (cap === undefined ? limits.maxOutputTokens : Math.min(cap, limits.maxOutputTokens));
  x.inputBound = x.api.batched ? undefined : limits.contextWindow;
  const counted = Math.ceil(input.bound * (x.api.inputMargin ?? 1));
  const held = chain === 'unknown' ? limits.contextWindow : counted + (chain ?? 0);
  return tokenHold(
    pricing,
    Math.min(held, x.inputBound ?? held),
    x.bound * x.choices,
    x.api.cacheWrite?.(x.body),
  );
}

/**
 * The size of the chain a per-token request continues: its recorded tokens, `unknown` when Tollgate
 * has no record of it, undefined when the request continues none (one lookup, at admission).
 */
export async function chainSize(
  x: Exchange,
  chains: ResponseChains,
  log: Logger,
): Promise<number | 'unknown' | undefined> {
  if (x.pricing.mode !== 'per_token') return undefined;
  const ref = x.api.chain?.(x.body);
  if (!ref) return undefined;
  try {
    return (await chains.size(x.project.id, ref)) ?? 'unknown';
  } catch (err) {
    // as the paywall decision: nothing is forwarded whose worst case is not known
    log.error({ err }, 'reading the size of a response chain failed');
    throw new ApiError(
      503,
      'service_unavailable',
      'The billing database is unavailable; the request was not forwarded.',
      { code: 'database_unavailable', headers: { 'retry-after': String(DATABASE_RETRY_AFTER_SECONDS) } },
    );
  }
}
