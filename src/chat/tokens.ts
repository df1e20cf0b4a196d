import { countTokens } from 'gpt-tokenizer';
import type { ChatRequest } from './schema.ts';

/**
 * Token counting with gpt-tokenizer (o200k_base, the encoding of current OpenAI models). Used for the
 * hold of per-token requests, for charging when a provider reports no `usage`, and to enforce the
 * completion bound while streaming.
 */

/** Request fields the provider turns into prompt tokens besides the messages. */
const PROMPT_FIELDS = ['tools', 'functions', 'tool_choice', 'response_format'] as const;

/** Safety margin of the hold over the counted prompt: providers' tokenizers differ from o200k. */
const PROMPT_MARGIN = 1.1;

export function countText(text: string): number {
  return text ? countTokens(text) : 0;
}

/**
 * Prompt tokens as OpenAI counts them for chat models: each message costs its content and name plus
 * 4 tokens of framing, the reply is primed with 3, and tool/function definitions count as text.
 */
export function countPromptTokens(body: ChatRequest): number {
  let tokens = 3;
  for (const message of body.messages) {
    tokens += 4 + countText(message.content);
    if (message.name) tokens += 1 + countText(message.name);
  }
  for (const field of PROMPT_FIELDS) {
    const value = body[field];
    if (value !== undefined && value !== null) tokens += countText(JSON.stringify(value));
  }
  return tokens;
}

/** What the hold assumes the prompt costs: the count plus a margin for other tokenizers. */
export function promptTokensUpperBound(counted: number): number {
  return Math.ceil(counted * PROMPT_MARGIN);
}

interface Delta {
  content?: unknown;
  refusal?: unknown;
  reasoning_content?: unknown;
  tool_calls?: unknown;
  function_call?: unknown;
}

/** Text a provider produced in one message or streamed delta (content, refusal, reasoning, tool arguments). */
export function producedText(part: Delta | undefined | null): string {
  if (!part) return '';
  let text = '';
  if (typeof part.content === 'string') text += part.content;
  if (typeof part.refusal === 'string') text += part.refusal;
  if (typeof part.reasoning_content === 'string') text += part.reasoning_content;
  if (Array.isArray(part.tool_calls)) {
    for (const call of part.tool_calls as Array<{ function?: { name?: unknown; arguments?: unknown } }>) {
      if (typeof call?.function?.name === 'string') text += call.function.name;
      if (typeof call?.function?.arguments === 'string') text += call.function.arguments;
    }
  }
  const fn = part.function_call as { name?: unknown; arguments?: unknown } | undefined;
  if (fn) {
    if (typeof fn.name === 'string') text += fn.name;
    if (typeof fn.arguments === 'string') text += fn.arguments;
  }
  return text;
}
