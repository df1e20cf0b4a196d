import { countTokens } from 'gpt-tokenizer';
import { audioTokens, fileTokens, imageTokens } from '../metering/media-tokens.ts';
import type { ChatMessage, ChatRequest } from './schema.ts';

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
 * Content parts count by kind: text as text, images by OpenAI's tile rule (media-tokens.ts), audio by
 * its length, files by their size; an assistant's `tool_calls` count as their names and arguments.
 */
export function countPromptTokens(body: ChatRequest): number {
  let tokens = 3;
  for (const message of body.messages) {
    tokens += 4 + contentTokens(message.content);
    if (message.name) tokens += 1 + countText(message.name);
    if (typeof message.refusal === 'string') tokens += countText(message.refusal);
    if (message.tool_calls) tokens += countText(producedText({ tool_calls: message.tool_calls }));
    if (message.function_call) tokens += countText(producedText({ function_call: message.function_call }));
    if (message.tool_call_id) tokens += countText(message.tool_call_id);
  }
  for (const field of PROMPT_FIELDS) {
    const value = body[field];
    if (value !== undefined && value !== null) tokens += countText(JSON.stringify(value));
  }
  return tokens;
}

/** Tokens of a message's content: a string, or parts of any kind. */
export function contentTokens(content: ChatMessage['content']): number {
  if (content == null) return 0;
  if (typeof content === 'string') return countText(content);
  let tokens = 0;
  for (const part of content) tokens += partTokens(part);
  return tokens;
}

/** A content part of either API, as far as counting reads it. */
export interface AnyPart {
  type: string;
  text?: unknown;
  refusal?: unknown;
  /** Chat: `{url, detail}`; Responses: the URL. */
  image_url?: unknown;
  detail?: unknown;
  input_audio?: { data?: unknown } | undefined;
  file?: { file_data?: unknown } | undefined;
  file_data?: unknown;
}

const str = (value: unknown): string => (typeof value === 'string' ? value : '');

/** One content part, Chat Completions' or Responses' kinds. */
export function partTokens(part: AnyPart): number {
  switch (part.type) {
    case 'text':
    case 'input_text':
    case 'output_text':
      return countText(str(part.text));
    case 'refusal':
      return countText(str(part.refusal));
    case 'image_url': {
      const image = (part.image_url ?? {}) as { url?: unknown; detail?: unknown };
      return imageTokens(str(image.url), str(image.detail));
    }
    case 'input_image':
      return imageTokens(str(part.image_url), str(part.detail));
    case 'input_audio':
      return audioTokens(str(part.input_audio?.data));
    case 'file':
      return fileTokens(str(part.file?.file_data) || undefined);
    case 'input_file':
      return fileTokens(str(part.file_data) || undefined);
    default:
      return countText(JSON.stringify(part));
  }
}

/** The text of a message's content (its text parts joined). */
export function contentText(content: ChatMessage['content'] | undefined): string {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  return content.map((part) => (part.type === 'text' ? String(part.text) : '')).join('');
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
