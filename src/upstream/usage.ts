/**
 * Reading providers' usage: where reasoning tokens stand.
 *
 * OpenAI counts reasoning tokens inside `completion_tokens` / `output_tokens` and details them in
 * `completion_tokens_details.reasoning_tokens` / `output_tokens_details.reasoning_tokens`; some
 * OpenAI-compatible servers report them beside it (the completion is the visible answer only). The
 * total tells which: `total_tokens` = input + output + reasoning means beside (the output charged is
 * output + reasoning); so does reasoning above the output (it cannot be inside). Otherwise — total =
 * input + output, no total, anything else — inside, as OpenAI's.
 */
export function outputWithReasoning(
  input: unknown,
  output: unknown,
  reasoning: unknown,
  total: unknown,
): number | undefined {
  if (typeof output !== 'number') return undefined;
  if (typeof reasoning !== 'number' || !(reasoning > 0)) return output;
  if (reasoning > output) return output + reasoning;
  const prompt = typeof input === 'number' ? input : 0;
  return total === prompt + output + reasoning ? output + reasoning : output;
}
