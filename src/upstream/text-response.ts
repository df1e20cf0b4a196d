import { newId } from '../core/ids.ts';

/**
 * A Responses API object that Tollgate writes itself (the echo provider's answer, the paywall's link
 * reply): its output is one assistant message of plain text, and it reports no tools and no sampling
 * settings. The fields stand in the order OpenAI sends them.
 */
export function textResponse(parts: {
  model: string;
  text: string;
  tokens: { input: number; output: number };
  /** Cut at `max_output_tokens`: the Response is `incomplete`. */
  cut?: boolean;
  instructions?: unknown;
  maxOutputTokens?: unknown;
  /** Whether the Response reports its (empty) `reasoning` settings. */
  reasoning?: boolean;
}) {
  const { input, output } = parts.tokens;
  return {
    id: newId('resp'),
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status: parts.cut ? 'incomplete' : 'completed',
    error: null,
    incomplete_details: parts.cut ? { reason: 'max_output_tokens' } : null,
    instructions: parts.instructions ?? null,
    max_output_tokens: parts.maxOutputTokens ?? null,
    model: parts.model,
    output: [
      {
        type: 'message',
        id: newId('msg'),
        status: 'completed',
        role: 'assistant',
        content: [{ type: 'output_text', text: parts.text, annotations: [], logprobs: [] }],
      },
    ],
    parallel_tool_calls: true,
    previous_response_id: null,
    ...(parts.reasoning ? { reasoning: { effort: null, summary: null } } : {}),
    store: false,
    temperature: null,
    text: { format: { type: 'text' } },
    tool_choice: 'auto',
    tools: [],
    top_p: null,
    truncation: 'disabled',
    usage: {
      input_tokens: input,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: output,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: input + output,
    },
    metadata: {},
  };
}
