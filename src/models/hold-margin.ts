import { z } from 'zod';
import { Money } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';

/**
 * The hold margin of a per-token model: what Tollgate's o200k count of a prompt is multiplied by when it
 * holds, because the provider counts with its own tokenizer. Set per model in the pricing file
 * (`pricing.holdMargin`), else the default of the tokenizer family of the model's upstream name(s).
 *
 * The defaults are measured (`npm run bench:tokenizers`, docs/benchmarks.md): each family's largest
 * tokens(family) / tokens(o200k) ratio over a fixed corpus of prose in six languages, JSON and code,
 * rounded up to the next 0.05, and never below 1.1 (what Tollgate approximates for every provider: tool
 * definitions as JSON text, images, audio and files by rule). Claude's is the exception: Anthropic
 * publishes no tokenizer for Claude 3 and later, and its `count_tokens` gives 1.16× (English) to 1.30×
 * (Python) o200k's count; the margin is 1.3, so the hold of every API — the Messages API's included,
 * with no margin of its own — is within 1.3× of what `count_tokens` says.
 */
export const TOKENIZER_FAMILIES = [
  'o200k',
  'cl100k',
  'claude',
  'llama3',
  'mistral',
  'gemini',
  'unknown',
] as const;
export type TokenizerFamily = (typeof TOKENIZER_FAMILIES)[number];

export const DEFAULT_HOLD_MARGINS: Record<TokenizerFamily, string> = {
  /** OpenAI's current models: Tollgate counts with their tokenizer (max ratio 1.000). */
  o200k: '1.1',
  /** GPT-4, GPT-3.5 and OpenAI's embeddings (text-embedding-3-*, ada-002): max 1.691 (Russian). */
  cl100k: '1.7',
  /**
   * Claude 3+: `count_tokens` against o200k, 1.16 (English) to 1.30 (Python); the legacy published
   * tokenizer (Claude 1/2) measured up to 1.853 on Russian, which this margin under-holds (the charge is
   * the provider's usage whatever the hold).
   */
  claude: '1.3',
  /** llama3-tokenizer-js (Llama 3.x): max 1.204 (German). */
  llama3: '1.25',
  /** mistral-tokenizer-js (the 32k SentencePiece vocabulary): max 1.429 (Russian). */
  mistral: '1.45',
  /** No Gemini tokenizer ships offline; Gemma's (a subset of Gemini's vocabulary), measured by hand: max 1.192. */
  gemini: '1.2',
  /** Any other name: the largest measured default. */
  unknown: '1.9',
};

/** Patterns on the lower-cased upstream name (provider prefixes such as `openai/` or `anthropic.` allowed). */
const PATTERNS: Array<[TokenizerFamily, RegExp]> = [
  ['claude', /claude/],
  ['gemini', /gemini|gemma/],
  ['mistral', /mistral|mixtral|codestral|ministral|pixtral|magistral|devstral/],
  ['llama3', /llama[-_.]?3/],
  ['o200k', /(^|[/.:])(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|chatgpt|codex|o[134](-|$))/],
  ['cl100k', /(^|[/.:])(gpt-4|gpt-3\.5|gpt-35|text-embedding-3|text-embedding-ada)/],
];

/** The tokenizer family of an upstream model name. */
export function tokenizerFamily(upstreamModel: string): TokenizerFamily {
  const name = upstreamModel.toLowerCase();
  for (const [family, pattern] of PATTERNS) if (pattern.test(name)) return family;
  return 'unknown';
}

/** The default margin for a model served under these upstream names: the largest of their families'. */
export function defaultHoldMargin(upstreamModels: readonly string[]): {
  margin: string;
  family: TokenizerFamily;
} {
  let best: { margin: string; family: TokenizerFamily } = {
    margin: DEFAULT_HOLD_MARGINS.o200k,
    family: 'o200k',
  };
  let first = true;
  for (const name of upstreamModels) {
    const family = tokenizerFamily(name);
    const margin = DEFAULT_HOLD_MARGINS[family];
    if (first || new Money(margin).gt(best.margin)) best = { margin, family };
    first = false;
  }
  return best;
}

/** Largest margin a pricing file may set. */
export const MAX_HOLD_MARGIN = '10';

/** `holdMargin` of the pricing file: a decimal from 1 to 10, at most 3 decimals (string or number). */
export const holdMarginSchema = z
  .union([z.string(), z.number()])
  .transform((v) => (typeof v === 'number' ? String(v) : v.trim()))
  .superRefine((v, ctx) => {
    const fail = (message: string) => ctx.addIssue({ code: 'custom', message, input: v });
    if (!/^\d{1,2}(\.\d{1,3})?$/.test(v)) return fail('must be a decimal multiplier such as "1.25"');
    const m = new Money(v);
    if (m.lt(1)) return fail('must be at least 1 (a margin never lowers the estimate)');
    if (m.gt(MAX_HOLD_MARGIN)) return fail(`must be at most ${MAX_HOLD_MARGIN}`);
  })
  .transform((v) => new Money(v).toFixed());

/** The upstream names a model row is served under: its upstream model and every route's model. */
export function upstreamNamesOf(row: Pick<ModelRow, 'upstream_model' | 'routes'>): string[] {
  return [row.upstream_model, ...(row.routes ?? []).map((r) => r.model)];
}

export interface HoldMargin {
  /** The multiplier, a decimal string. */
  margin: string;
  /** `file`: set in the pricing file; `default`: the family default. */
  source: 'file' | 'default';
  family: TokenizerFamily | undefined;
}

const cache = new WeakMap<object, HoldMargin>();

/** The margin in force for a model row (cached per row: rows live in the project cache). */
export function holdMarginOf(row: Pick<ModelRow, 'hold_margin' | 'upstream_model' | 'routes'>): HoldMargin {
  let found = cache.get(row);
  if (found) return found;
  if (row.hold_margin != null) {
    found = { margin: new Money(row.hold_margin).toFixed(), source: 'file', family: undefined };
  } else {
    const d = defaultHoldMargin(upstreamNamesOf(row));
    found = { margin: d.margin, source: 'default', family: d.family };
  }
  cache.set(row, found);
  return found;
}
