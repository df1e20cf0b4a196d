import { createHash } from 'node:crypto';
import { newId } from '../core/ids.ts';
import {
  type ChatPrompt,
  contentText,
  countEmbeddingInput,
  countPromptTokens,
  countResponsesInput,
  type EmbeddingsInput,
  type ResponsesInput,
} from '../tokens/inputs.ts';
import { textResponse } from './text-response.ts';
import type { PassthroughAnswer, Provider, SseMessage, UpstreamAnswer, UpstreamCall } from './types.ts';
import { UpstreamError } from './types.ts';

export const ECHO_PREFIX = '[echo provider] ';

/** The echo repeats at most this many characters (gpt-tokenizer's encode is quadratic in a long run). */
const ECHO_MAX_CHARS = 2000;

/**
 * The built-in provider of projects whose upstream is `echo://local` (the dev demo, offline tests): it
 * answers with the last user message (its first ECHO_MAX_CHARS characters) prefixed by `[echo provider] `,
 * cut at the request's bound, and reports usage counted with o200k — for every API Tollgate serves:
 * - Chat Completions: streaming sends the reply in several chunks, then a usage chunk when
 *   `stream_options.include_usage` asks for it;
 * - Responses (`input` as a string or items, bound `max_output_tokens`): a Response, or its event stream;
 * - Embeddings: a deterministic unit vector per input (8 dimensions, or `dimensions`), floats or base64;
 * - Messages: through Chat Completions, like any OpenAI-compatible provider (./anthropic/messages-over-chat.ts).
 * Other calls (`GET /responses/{id}`, …) answer 404, as a provider without them would.
 */
export class EchoProvider implements Provider {
  async complete(call: UpstreamCall): Promise<UpstreamAnswer> {
    await loadEncoder();
    if (call.path === '/responses') {
      const json = echoResponse(call.body);
      return { text: JSON.stringify(json), json };
    }
    if (call.path === '/embeddings') {
      const json = echoEmbeddings(call.body);
      return { text: JSON.stringify(json), json };
    }
    chatOnly(call.path);
    const reply = echoReply(call.body);
    const json = {
      ...chatHead(call, 'chat.completion'),
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: reply.text, refusal: null },
          logprobs: null,
          finish_reason: reply.finishReason,
        },
      ],
      usage: reply.usage,
    };
    return { text: JSON.stringify(json), json };
  }

  async stream(call: UpstreamCall): Promise<AsyncIterable<SseMessage>> {
    await loadEncoder();
    if (call.path === '/responses') return echoResponseStream(call);
    chatOnly(call.path);
    return echoStream(call);
  }

  async passthrough(): Promise<PassthroughAnswer> {
    throw notServed();
  }
}

const NOT_SERVED =
  'The echo provider serves POST /chat/completions, /responses, /embeddings (and the Messages API) only.';

function notServed(): UpstreamError {
  return new UpstreamError('status', NOT_SERVED, {
    status: 404,
    body: JSON.stringify({ error: { message: NOT_SERVED } }),
  });
}

function chatOnly(path: string): void {
  if (path !== '/chat/completions') throw notServed();
}

interface EchoReply {
  text: string;
  finishReason: 'stop' | 'length';
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

/** gpt-tokenizer's encoder, imported when the echo first answers (only dev and demo projects use it). */
let encoder: typeof import('gpt-tokenizer') | undefined;

async function loadEncoder(): Promise<void> {
  encoder ??= await import('gpt-tokenizer');
}

/** The echo of a text, cut at `limit` tokens. */
function echoText(
  said: string,
  limit: number | null | undefined,
): { text: string; tokens: number; cut: boolean } {
  const { encode, decode } = encoder!;
  let tokens = encode(ECHO_PREFIX + said.slice(0, ECHO_MAX_CHARS));
  const cut = Boolean(limit && tokens.length > limit);
  if (cut) tokens = tokens.slice(0, limit!);
  return { text: decode(tokens), tokens: tokens.length, cut };
}

function echoReply(body: Record<string, unknown>): EchoReply {
  const request = body as unknown as ChatPrompt & {
    max_tokens?: number | null;
    max_completion_tokens?: number | null;
  };
  const lastUser = [...request.messages].reverse().find((m) => m.role === 'user');
  const echo = echoText(contentText(lastUser?.content), request.max_completion_tokens ?? request.max_tokens);
  const prompt = countPromptTokens(request);
  return {
    text: echo.text,
    finishReason: echo.cut ? 'length' : 'stop',
    usage: { prompt_tokens: prompt, completion_tokens: echo.tokens, total_tokens: prompt + echo.tokens },
  };
}

/** The text of the last user message of a Responses `input`. */
function lastResponsesInput(input: unknown): string {
  if (typeof input === 'string') return input;
  if (!Array.isArray(input)) return '';
  const items = input as Array<{ role?: unknown; type?: unknown; content?: unknown }>;
  const last = [...items].reverse().find((i) => i.role === 'user' && (i.type ?? 'message') === 'message');
  if (!last) return '';
  if (typeof last.content === 'string') return last.content;
  if (!Array.isArray(last.content)) return '';
  return (last.content as Array<{ type?: unknown; text?: unknown }>)
    .map((part) => (part.type === 'input_text' && typeof part.text === 'string' ? part.text : ''))
    .join('');
}

/** A completed (or, cut at `max_output_tokens`, incomplete) Response echoing the last user input. */
function echoResponse(body: Record<string, unknown>) {
  const echo = echoText(lastResponsesInput(body.input), body.max_output_tokens as number | undefined);
  const input = countResponsesInput(body as ResponsesInput);
  return textResponse({
    model: String(body.model),
    text: echo.text,
    tokens: { input, output: echo.tokens },
    cut: echo.cut,
    instructions: body.instructions,
    maxOutputTokens: body.max_output_tokens,
  });
}

/** The same Response as Responses events, its text in several `response.output_text.delta` events. */
async function* echoResponseStream(call: UpstreamCall): AsyncGenerator<SseMessage> {
  const response = echoResponse(call.body);
  const message = response.output[0]!;
  const part = message.content[0]!;
  const item = { item_id: message.id, output_index: 0, content_index: 0 };
  const inProgress = { ...response, status: 'in_progress', output: [], usage: null };
  let sequence = 0;
  const event = (data: Record<string, unknown>): SseMessage => ({
    event: String(data.type),
    data: JSON.stringify({ ...data, sequence_number: sequence++ }),
  });
  yield event({ type: 'response.created', response: inProgress });
  yield event({ type: 'response.in_progress', response: inProgress });
  yield event({
    type: 'response.output_item.added',
    output_index: 0,
    item: { ...message, status: 'in_progress', content: [] },
  });
  yield event({ type: 'response.content_part.added', ...item, part: { ...part, text: '' } });
  for (const piece of pieces(part.text)) {
    if (call.signal.aborted) return;
    await new Promise<void>((resolve) => setImmediate(resolve));
    yield event({ type: 'response.output_text.delta', ...item, delta: piece, logprobs: [] });
  }
  yield event({ type: 'response.output_text.done', ...item, text: part.text, logprobs: [] });
  yield event({ type: 'response.content_part.done', ...item, part });
  yield event({ type: 'response.output_item.done', output_index: 0, item: message });
  yield event({
    type: response.status === 'completed' ? 'response.completed' : 'response.incomplete',
    response,
  });
}

/** A deterministic unit vector per input (its SHA-256 spread over the dimensions), usage counted. */
function echoEmbeddings(body: Record<string, unknown>) {
  const request = body as unknown as EmbeddingsInput;
  const raw = request.input as unknown;
  const inputs: unknown[] =
    typeof raw === 'string' || (Array.isArray(raw) && typeof raw[0] === 'number')
      ? [raw]
      : (raw as unknown[]);
  const dimensions = typeof body.dimensions === 'number' && body.dimensions > 0 ? body.dimensions : 8;
  const data = inputs.map((input, index) => {
    const digest = createHash('sha256').update(JSON.stringify(input)).digest();
    const vector = Array.from({ length: dimensions }, (_, i) => digest[i % digest.length]! / 255 - 0.5);
    const norm = Math.hypot(...vector) || 1;
    const unit = vector.map((v) => v / norm);
    const embedding =
      body.encoding_format === 'base64'
        ? Buffer.from(new Float32Array(unit).buffer).toString('base64')
        : unit;
    return { object: 'embedding', index, embedding };
  });
  const tokens = countEmbeddingInput(request);
  return {
    object: 'list',
    data,
    model: String(body.model),
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  };
}

/** A text in about STREAM_CHUNKS pieces, split by characters (never inside a multi-byte one). */
function pieces(text: string): string[] {
  const chars = Array.from(text);
  const size = Math.max(1, Math.ceil(chars.length / STREAM_CHUNKS));
  const out: string[] = [];
  for (let i = 0; i < chars.length; i += size) out.push(chars.slice(i, i + size).join(''));
  return out;
}

const STREAM_CHUNKS = 6;

/** The fields a chat completion (or each of its chunks) opens with. */
function chatHead(call: UpstreamCall, object: 'chat.completion' | 'chat.completion.chunk') {
  return {
    id: newId('chatcmpl'),
    object,
    created: Math.floor(Date.now() / 1000),
    model: String(call.body.model),
  };
}

async function* echoStream(call: UpstreamCall): AsyncGenerator<SseMessage> {
  const reply = echoReply(call.body);
  const base = chatHead(call, 'chat.completion.chunk');
  const chunk = (delta: Record<string, unknown>, finishReason: string | null = null): SseMessage => ({
    event: undefined,
    data: JSON.stringify({
      ...base,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    }),
  });
  yield chunk({ role: 'assistant', content: '' });
  // Split by characters (not tokens) so that no chunk ends inside a multi-byte character.
  for (const piece of pieces(reply.text)) {
    if (call.signal.aborted) return;
    // Let the event loop run between chunks, as a network provider would.
    await new Promise<void>((resolve) => setImmediate(resolve));
    yield chunk({ content: piece });
  }
  yield chunk({}, reply.finishReason);
  const options = call.body.stream_options as { include_usage?: boolean } | undefined;
  if (options?.include_usage)
    yield { event: undefined, data: JSON.stringify({ ...base, choices: [], usage: reply.usage }) };
  yield { event: undefined, data: '[DONE]' };
}
