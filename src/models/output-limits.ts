import { z } from 'zod';
import type { ModelRow } from '../db/schema.ts';
import { upstreamNamesOf } from './hold-margin.ts';

/**
 * A model's token limits: `maxOutputTokens` (the output bound held and sent to the provider when the
 * client sets none) and `contextWindow` (the most input the provider accepts: the hold of an unknown
 * Responses chain, and the sanity bound of reported input). Set per model in the pricing file, else the
 * published figures of the upstream model's family (the smallest of its routes' names), else the
 * fallback: `DEFAULT_MAX_COMPLETION_TOKENS` output tokens and a 128 000-token context.
 */
export interface ModelLimits {
  maxOutputTokens: number;
  contextWindow: number;
  /** `file`: the pricing file's; `family`: the published figures of the name; `fallback`: unknown name. */
  source: 'file' | 'family' | 'fallback';
}

/** Context window of a model whose family Tollgate does not know (and the pricing file sets none). */
export const FALLBACK_CONTEXT_WINDOW = 128_000;

export const tokenLimitSchema = z
  .number({ message: 'must be a positive integer' })
  .int({ message: 'must be a positive integer' })
  .min(1, { message: 'must be a positive integer' })
  .max(100_000_000, { message: 'must be at most 100000000' });

/**
 * Published limits (output, context) per family, first match wins, on the lower-cased upstream name
 * (provider prefixes such as `openai/` or `anthropic.` allowed). Sources: OpenAI's and Anthropic's
 * model pages, Google's Gemini model page.
 */
const FAMILIES: Array<[RegExp, number, number]> = [
  [/gpt-5[.\d]*-chat/, 16_384, 128_000],
  [/gpt-5/, 128_000, 400_000],
  [/gpt-4\.1/, 32_768, 1_047_576],
  [/gpt-4o|gpt-4\.5|chatgpt-4o/, 16_384, 128_000],
  [/gpt-4-turbo|gpt-4-\d{4}-preview/, 4_096, 128_000],
  [/gpt-4(-\d{4})?$/, 8_192, 8_192],
  [/gpt-3\.5|gpt-35/, 4_096, 16_385],
  [/codex-mini/, 100_000, 200_000],
  [/(^|[/.:])o1-mini/, 65_536, 128_000],
  [/(^|[/.:])o1-preview/, 32_768, 128_000],
  [/(^|[/.:])o[134](-|$)/, 100_000, 200_000],
  [/gpt-oss/, 131_072, 131_072],
  // later generations (Claude Code's own default in 2.1.332 is claude-opus-5-5): at least 4.5's limits
  [/claude-(opus|sonnet|haiku)-([5-9]|[1-9]\d)/, 64_000, 200_000],
  [/claude-(opus-4-[5-9]|sonnet-4|haiku-4|4-sonnet|3-7-sonnet)/, 64_000, 200_000],
  [/claude-(opus-4|4-opus)/, 32_000, 200_000],
  [/claude-3-5/, 8_192, 200_000],
  [/claude/, 4_096, 200_000],
  [/gemini-(2\.5|3)/, 65_536, 1_048_576],
  [/gemini/, 8_192, 1_048_576],
];

/** The published (output, context) limits of an upstream name; undefined for an unknown family. */
export function familyLimits(
  upstreamModel: string,
): { maxOutputTokens: number; contextWindow: number } | undefined {
  const name = upstreamModel.toLowerCase();
  for (const [pattern, maxOutputTokens, contextWindow] of FAMILIES) {
    if (pattern.test(name)) return { maxOutputTokens, contextWindow };
  }
  return undefined;
}

const cache = new WeakMap<object, ModelLimits>();

/**
 * The limits in force for a model row (cached per row: rows live in the project cache). A model served
 * under several names takes the smallest output limit and the largest context of their families.
 */
export function modelLimitsOf(
  row: Pick<ModelRow, 'max_output_tokens' | 'context_window' | 'upstream_model' | 'routes'>,
  fallbackOutput: number,
): ModelLimits {
  let found = cache.get(row);
  if (found) return found;
  let output: number | undefined;
  let context: number | undefined;
  for (const name of upstreamNamesOf(row)) {
    const family = familyLimits(name);
    if (!family) {
      output = Math.min(output ?? fallbackOutput, fallbackOutput);
      context = Math.max(context ?? FALLBACK_CONTEXT_WINDOW, FALLBACK_CONTEXT_WINDOW);
      continue;
    }
    output = Math.min(output ?? family.maxOutputTokens, family.maxOutputTokens);
    context = Math.max(context ?? family.contextWindow, family.contextWindow);
  }
  const known = upstreamNamesOf(row).every((name) => familyLimits(name) !== undefined);
  const fromFile = row.max_output_tokens != null || row.context_window != null;
  found = {
    maxOutputTokens: row.max_output_tokens ?? output ?? fallbackOutput,
    contextWindow: row.context_window ?? context ?? FALLBACK_CONTEXT_WINDOW,
    source: fromFile ? 'file' : known ? 'family' : 'fallback',
  };
  cache.set(row, found);
  return found;
}
