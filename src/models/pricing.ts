import { z } from 'zod';
import { currencySchema, Money, priceSchema } from '../core/money.ts';
import { isPlainText } from '../core/validation.ts';
import type { ModelEndpoint, ModelRow, PricingMode } from '../db/schema.ts';
import { holdMarginSchema, tokenizerFamily, upstreamNamesOf } from './hold-margin.ts';
import { tokenLimitSchema } from './output-limits.ts';

/**
 * Pricing of a model: per request, per token (prices per 1M input/output tokens, optionally a lower one
 * for cached input tokens; embeddings models need only the input price), or subscription (a fee per
 * period charged from the balance, then unlimited use until the period ends).
 */
export const periodSchema = z
  .string()
  .regex(/^[1-9]\d{0,4}[hdw]$/, { message: 'must be a number followed by h, d or w, such as "30d"' });

const PERIOD_UNIT_SECONDS = { h: 3600, d: 86_400, w: 604_800 } as const;

export function periodSeconds(period: string): number {
  const unit = period.slice(-1) as keyof typeof PERIOD_UNIT_SECONDS;
  return Number(period.slice(0, -1)) * PERIOD_UNIT_SECONDS[unit];
}

export const pricingSchema = z.discriminatedUnion('mode', [
  z.strictObject({
    mode: z.literal('per_request'),
    perRequest: priceSchema.describe('Price of one request.'),
  }),
  z.strictObject({
    mode: z.literal('per_token'),
    inputPerMillion: priceSchema.describe('Price of 1M input tokens.'),
    /** Optional: 0 when omitted (embeddings produce no output tokens). */
    outputPerMillion: priceSchema.optional().describe('Price of 1M output tokens (default 0).'),
    /** Optional: the price of input tokens the provider reports as cached; the input price when omitted. */
    cachedInputPerMillion: priceSchema
      .optional()
      .describe('Price of 1M cached input tokens (default: the input price).'),
    /**
     * Optional: the prices of input tokens the provider writes to its cache (Anthropic's
     * `cache_creation_input_tokens`), for 5 minutes and for one hour; when omitted, 1.25× and 2× the
     * input price on a Claude-family model (Anthropic's multipliers), the input price otherwise.
     */
    cacheWritePerMillion: priceSchema
      .optional()
      .describe(
        'Price of 1M input tokens written to the cache for 5 minutes (default: 1.25× the input price on Claude models, else the input price).',
      ),
    cacheWrite1hPerMillion: priceSchema
      .optional()
      .describe(
        'Price of 1M input tokens written to the cache for 1 hour (default: 2× the input price on Claude models, else the input price).',
      ),
    /**
     * Optional: the multiplier of Tollgate's prompt estimate in the hold (1 to 10); the default of the
     * upstream model's tokenizer family when omitted (src/models/hold-margin.ts).
     */
    holdMargin: holdMarginSchema
      .optional()
      .describe(
        "Multiplier of the prompt estimate in the hold, 1 to 10 (default: the upstream model's tokenizer family's).",
      ),
  }),
  z.strictObject({
    mode: z.literal('subscription'),
    fee: priceSchema.describe('Subscription fee per period.'),
    period: periodSchema.describe('Subscription period: <n>h, <n>d or <n>w.'),
  }),
]);
export type Pricing = z.infer<typeof pricingSchema>;

export const modelIdSchema = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:/-]*$/, { message: 'may hold letters, digits and . _ : / -' });

/** The OpenAI APIs a model can serve through Tollgate. */
export const ENDPOINTS = ['chat', 'responses', 'embeddings'] as const satisfies readonly ModelEndpoint[];
export const DEFAULT_ENDPOINTS: ModelEndpoint[] = ['chat', 'responses'];
export const endpointsSchema = z
  .array(z.enum(ENDPOINTS, { message: "must be one of 'chat', 'responses', 'embeddings'" }))
  .min(1, { message: 'must list at least one endpoint' });

/** A route of a model (src/routing): a provider of the project and the model name it serves. */
export const routeSchema = z.strictObject({
  provider: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, { message: 'must be a provider name' })
    .describe('A provider of the project (a ModelProvider providerName).'),
  model: z.string().min(1).max(256),
  priority: z.number().int().min(0).max(1000).optional(),
  weight: z.number().positive().max(1_000_000).optional(),
});

const rateLimitSchema = z.strictObject({
  rpm: z.number().int().min(1).max(1_000_000_000).optional().describe('Requests per minute.'),
  tpm: z.number().int().min(1).max(1_000_000_000_000).optional().describe('Tokens per minute.'),
});

/**
 * Rate limits per project, API key and end user, and spend caps per end user (src/limits). The
 * LimitPolicy CRD's `spec` is generated from it (src/operator/crd-schema.ts).
 */
export const limitsSchema = z.strictObject({
  project: rateLimitSchema.optional().describe("The project's limits."),
  key: rateLimitSchema.optional().describe("Each API key's limits."),
  user: rateLimitSchema.optional().describe("Each end user's limits."),
  spend: z
    .strictObject({
      daily: priceSchema.optional().describe('Most an end user may be charged per day.'),
      monthly: priceSchema.optional().describe('Most an end user may be charged per month.'),
    })
    .optional()
    .describe('Spend caps per end user, in the project currency.'),
});

export const modelSpecSchema = z.strictObject({
  id: modelIdSchema.describe('What clients send as model.'),
  upstreamModel: z
    .string()
    .min(1)
    .max(256)
    .refine(isPlainText, { message: 'must not contain control characters' })
    .optional()
    .describe('What the provider gets (default: id).'),
  /** Tried in order (`priority`, then `weight` among equals); default: the provider `default`. */
  routes: z
    .array(routeSchema)
    .min(1)
    .max(16)
    .optional()
    .describe(
      'Providers tried in order of priority, then by weight among equals (default: the provider "default").',
    ),
  pricing: pricingSchema,
  /** Which APIs serve the model (default: chat and responses). */
  endpoints: endpointsSchema.optional().describe('APIs serving it (default chat, responses).'),
  /** Output bound when the client sets none, and the most input accepted (default: the family's; src/models/output-limits.ts). */
  maxOutputTokens: tokenLimitSchema
    .optional()
    .describe("Output bound when the client sets none (default: the provider model family's)."),
  contextWindow: tokenLimitSchema
    .optional()
    .describe("Most input tokens the provider accepts (default: the provider model family's)."),
});
export type ModelSpec = z.infer<typeof modelSpecSchema>;

/** The pricing file of `tollgate models apply`. */
export const pricingFileSchema = z
  .strictObject({
    currency: currencySchema,
    models: z.array(modelSpecSchema).min(1, { message: 'must list at least one model' }),
    limits: limitsSchema.optional(),
  })
  .superRefine((file, ctx) => {
    const seen = new Set<string>();
    file.models.forEach((m, i) => {
      if (seen.has(m.id))
        ctx.addIssue({ code: 'custom', path: ['models', i, 'id'], message: `duplicate model id ${m.id}` });
      seen.add(m.id);
    });
  });
export type PricingFile = z.infer<typeof pricingFileSchema>;

export function pricingOf(row: ModelRow): Pricing {
  switch (row.pricing_mode as PricingMode) {
    case 'per_request':
      return { mode: 'per_request', perRequest: row.per_request ?? '0' };
    case 'per_token':
      return {
        mode: 'per_token',
        inputPerMillion: row.input_per_million ?? '0',
        outputPerMillion: row.output_per_million ?? '0',
        ...(row.cached_input_per_million != null
          ? { cachedInputPerMillion: row.cached_input_per_million }
          : {}),
        ...(row.cache_write_per_million != null ? { cacheWritePerMillion: row.cache_write_per_million } : {}),
        ...(row.cache_write_1h_per_million != null
          ? { cacheWrite1hPerMillion: row.cache_write_1h_per_million }
          : {}),
        ...(row.hold_margin != null ? { holdMargin: row.hold_margin } : {}),
      };
    case 'subscription':
      return { mode: 'subscription', fee: row.fee ?? '0', period: row.period ?? '30d' };
  }
}

/** Columns of a models row for a pricing. */
export function pricingColumns(pricing: Pricing) {
  return {
    pricing_mode: pricing.mode,
    per_request: pricing.mode === 'per_request' ? pricing.perRequest : null,
    input_per_million: pricing.mode === 'per_token' ? pricing.inputPerMillion : null,
    output_per_million: pricing.mode === 'per_token' ? (pricing.outputPerMillion ?? '0') : null,
    cached_input_per_million: pricing.mode === 'per_token' ? (pricing.cachedInputPerMillion ?? null) : null,
    cache_write_per_million: pricing.mode === 'per_token' ? (pricing.cacheWritePerMillion ?? null) : null,
    cache_write_1h_per_million:
      pricing.mode === 'per_token' ? (pricing.cacheWrite1hPerMillion ?? null) : null,
    hold_margin: pricing.mode === 'per_token' ? (pricing.holdMargin ?? null) : null,
    fee: pricing.mode === 'subscription' ? pricing.fee : null,
    period: pricing.mode === 'subscription' ? pricing.period : null,
    period_seconds: pricing.mode === 'subscription' ? periodSeconds(pricing.period) : null,
  };
}

/** A models row as the pricing file states it (routes only when it has some). */
export function specOf(row: ModelRow): ModelSpec {
  return {
    id: row.id,
    upstreamModel: row.upstream_model,
    ...(row.routes?.length ? { routes: row.routes } : {}),
    pricing: pricingOf(row),
    endpoints: endpointsOf(row),
    ...limitsOfRow(row),
  };
}

/** The token limits a model row sets (none: the family's defaults apply). */
export function limitsOfRow(row: ModelRow): Pick<ModelSpec, 'maxOutputTokens' | 'contextWindow'> {
  return {
    ...(row.max_output_tokens != null ? { maxOutputTokens: row.max_output_tokens } : {}),
    ...(row.context_window != null ? { contextWindow: row.context_window } : {}),
  };
}

/** The APIs a model row serves. */
export function endpointsOf(row: ModelRow): ModelEndpoint[] {
  return row.endpoints?.length ? row.endpoints : DEFAULT_ENDPOINTS;
}

/** Anthropic's cache write multipliers of the input price: 5-minute and 1-hour writes. */
export const CLAUDE_CACHE_WRITE = { fiveMinutes: '1.25', oneHour: '2' } as const;

/**
 * The cache write prices of a per-token model: as set, else 1.25× / 2× the input price when any of its
 * upstream names is a Claude model, else the input price.
 */
export function cacheWritePrices(
  row: Pick<ModelRow, 'cache_write_per_million' | 'cache_write_1h_per_million' | 'upstream_model' | 'routes'>,
  input: Money,
): { cacheWritePerMillion: Money; cacheWrite1hPerMillion: Money } {
  const claude = upstreamNamesOf(row).some((name) => tokenizerFamily(name) === 'claude');
  const fallback = (times: string) => (claude ? new Money(input.times(times).toFixed()) : input);
  return {
    cacheWritePerMillion:
      row.cache_write_per_million != null
        ? new Money(row.cache_write_per_million)
        : fallback(CLAUDE_CACHE_WRITE.fiveMinutes),
    cacheWrite1hPerMillion:
      row.cache_write_1h_per_million != null
        ? new Money(row.cache_write_1h_per_million)
        : fallback(CLAUDE_CACHE_WRITE.oneHour),
  };
}
