import { countText, holdInputTokens, type TextCounter } from './count.ts';
import { audioTokens, fileTokens, imageTokens } from './media.ts';

/**
 * The inputs of the metered APIs as o200k tokens: a chat prompt (Chat Completions' messages, as OpenAI
 * counts them), a Responses `input`, an Embeddings `input`, and the text a provider produced. The
 * request types here are the shapes counting reads (the routes' zod schemas, src/chat/schema.ts,
 * src/responses/schema.ts, src/embeddings/schema.ts, validate the requests themselves), so that the
 * metered flow, the APIs and the echo provider all count the same way from below.
 */

/** A chat message as counting reads it. */
export interface PromptMessage {
  role: string;
  content?: string | readonly AnyPart[] | null | undefined;
  name?: string | undefined;
  refusal?: string | null | undefined;
  tool_calls?: unknown;
  function_call?: unknown;
  tool_call_id?: string | undefined;
  [field: string]: unknown;
}

/** A Chat Completions request as counting reads it. */
export interface ChatPrompt {
  messages: readonly PromptMessage[];
  tools?: unknown;
  functions?: unknown;
  tool_choice?: unknown;
  response_format?: unknown;
  /** Other fields (`model`, `stream`, …) are not counted. */
  [field: string]: unknown;
}

/** Request fields the provider turns into prompt tokens besides the messages. */
const PROMPT_FIELDS = ['tools', 'functions', 'tool_choice', 'response_format'] as const;

/**
 * Prompt tokens as OpenAI counts them for chat models: each message costs its content and name plus
 * 4 tokens of framing, the reply is primed with 3, and tool/function definitions count as text.
 * Content parts count by kind: text as text, images by OpenAI's tile rule (./media.ts), audio by
 * its length, files by their size; an assistant's `tool_calls` count as their names and arguments.
 * `count` counts one text: exactly by default, or with a bound (see boundingCounter).
 */
export function countPromptTokens(body: ChatPrompt, count: TextCounter = countText): number {
  let tokens = 3;
  for (const message of body.messages) {
    tokens += 4 + contentTokens(message.content, count);
    if (message.name) tokens += 1 + count(message.name);
    if (typeof message.refusal === 'string') tokens += count(message.refusal);
    if (message.tool_calls) tokens += count(producedText({ tool_calls: message.tool_calls }));
    if (message.function_call) tokens += count(producedText({ function_call: message.function_call }));
    if (message.tool_call_id) tokens += count(message.tool_call_id);
  }
  for (const field of PROMPT_FIELDS) {
    const value = body[field];
    if (value !== undefined && value !== null) tokens += count(JSON.stringify(value));
  }
  return tokens;
}

/** Tokens of a message's content: a string, or parts of any kind. */
export function contentTokens(content: PromptMessage['content'], count: TextCounter = countText): number {
  if (content == null) return 0;
  if (typeof content === 'string') return count(content);
  let tokens = 0;
  for (const part of content) tokens += partTokens(part, count);
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
export function partTokens(part: AnyPart, count: TextCounter = countText): number {
  switch (part.type) {
    case 'text':
    case 'input_text':
    case 'output_text':
      return count(str(part.text));
    case 'refusal':
      return count(str(part.refusal));
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
      return count(JSON.stringify(part));
  }
}

/** The text of a message's content (its text parts joined). */
export function contentText(content: PromptMessage['content']): string {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  return content.map((part) => (part.type === 'text' ? String(part.text) : '')).join('');
}

/** A Responses request as counting reads it. */
export interface ResponsesInput {
  input?: string | readonly Record<string, unknown>[] | undefined;
  instructions?: string | null | undefined;
  tools?: unknown;
  tool_choice?: unknown;
  text?: unknown;
  [field: string]: unknown;
}

/** Request fields the provider turns into input tokens besides `input` and `instructions`. */
const INPUT_FIELDS = ['tools', 'tool_choice', 'text'] as const;

/**
 * Input tokens of a Responses request as Tollgate counts them: each message item 4 tokens of framing
 * plus its content (text, images by OpenAI's tile rule, files, audio — as for chat), other items
 * (function calls and their outputs, reasoning, …) as their text, plus instructions and tool
 * definitions. Earlier turns referred to by `previous_response_id` or `conversation` are not known to
 * Tollgate and not counted.
 */
export function countResponsesInput(body: ResponsesInput, count: TextCounter = countText): number {
  let tokens = 3;
  if (body.instructions) tokens += 4 + count(body.instructions);
  const input = body.input;
  if (typeof input === 'string') tokens += 4 + count(input);
  else if (Array.isArray(input)) {
    for (const item of input as Array<Record<string, unknown>>) {
      if (item.type === undefined || item.type === 'message') {
        tokens += 4;
        const content = item.content;
        if (typeof content === 'string') tokens += count(content);
        else if (Array.isArray(content))
          for (const part of content as AnyPart[]) tokens += partTokens(part, count);
      } else if (item.type === 'function_call') {
        tokens += count(`${item.name ?? ''}${item.arguments ?? ''}`);
      } else if (item.type === 'function_call_output') {
        tokens += count(typeof item.output === 'string' ? item.output : JSON.stringify(item.output));
      } else {
        tokens += count(JSON.stringify(item));
      }
    }
  }
  for (const field of INPUT_FIELDS) {
    const value = body[field];
    if (value !== undefined && value !== null) tokens += count(JSON.stringify(value));
  }
  return tokens;
}

/** An Embeddings request as counting reads it. */
export interface EmbeddingsInput {
  input: string | readonly (string | number | readonly number[])[];
  [field: string]: unknown;
}

/** Input tokens of an Embeddings request: strings counted, token arrays by their length. */
export function countEmbeddingInput(body: EmbeddingsInput, count: TextCounter = countText): number {
  const input = body.input;
  if (typeof input === 'string') return count(input);
  let tokens = 0;
  for (const item of input) {
    if (typeof item === 'string') tokens += count(item);
    else if (typeof item === 'number') tokens += 1;
    else tokens += item.length;
  }
  return tokens;
}

/** The hold's bound of a chat request's prompt (holdInputTokens over countPromptTokens). */
export function holdPromptTokens(
  body: ChatPrompt,
  margin?: string,
): { bound: number; exact: number | undefined } {
  return holdInputTokens(countPromptTokens, body, margin);
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
