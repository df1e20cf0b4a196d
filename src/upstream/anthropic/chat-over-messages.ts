import { badRequest } from '../../core/errors.ts';
import type { ChatUsage, Provider, SseMessage, UpstreamCall } from '../types.ts';
import { streamError, streamEventJson, UpstreamError } from '../types.ts';
import { type AnthropicUsage, cacheWritesOf } from './provider.ts';
import { TranslatingProvider } from './translating-provider.ts';

/**
 * Chat Completions over Anthropic's Messages API: a `POST /v1/chat/completions` whose route is a
 * provider of kind `anthropic` is sent as a Messages request, and its answer — JSON or stream — comes
 * back as a chat completion / chunk stream. What cannot be carried is a 400 naming the field. The
 * mapping (also in docs/api.md):
 *
 * | Chat Completions request                     | Messages request                                     |
 * |----------------------------------------------|------------------------------------------------------|
 * | `system` / `developer` messages              | `system` (joined by blank lines)                     |
 * | `user` text / `image_url` / `file` (PDF) parts | `text` / `image` (base64 or url) / `document` blocks |
 * | assistant `content`, `tool_calls`            | `text` block, `tool_use` blocks                      |
 * | `tool` messages                              | `tool_result` blocks of the next user turn           |
 * | `tools` (function), `tool_choice`, `parallel_tool_calls: false` | `tools` (`input_schema`), `tool_choice` auto/any/tool/none, `disable_parallel_tool_use` |
 * | `max_completion_tokens` / `max_tokens`, `stop`, `temperature` (≤ 1), `top_p`, `user` | `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `metadata.user_id` |
 * | `stream`                                     | `stream`; events become chunks, usage in a last chunk |
 *
 * Left out as hints: `stream_options` (usage is always read), `store`, `metadata`, `seed`,
 * `service_tier`, `n: 1`. Refused with a 400: `n` > 1, `response_format`, `logprobs`, penalties,
 * `logit_bias`, `audio`, `modalities`, `reasoning_effort`, `prediction`, `web_search_options`, audio parts,
 * `function` messages and any other field. Answers: `text` blocks → `content`, `tool_use` → `tool_calls`,
 * `thinking` → `reasoning_content`; `stop_reason` end_turn / stop_sequence / max_tokens / tool_use /
 * refusal → `finish_reason` stop / stop / length / tool_calls / content_filter; usage: every input token
 * (cache writes and reads included) → `prompt_tokens`, cache reads → `cached_tokens`, `output_tokens` →
 * `completion_tokens`.
 */

type Json = Record<string, unknown>;

const CARRIED = new Set([
  'model',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'stop',
  'temperature',
  'top_p',
  'user',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'stream',
]);
const HINTS = new Set(['stream_options', 'store', 'metadata', 'seed', 'service_tier', 'n']);

const cannot = (field: string, why: string) =>
  badRequest(
    `'${field}' cannot be sent to this model's provider (Anthropic's Messages API): ${why}.`,
    field,
    'untranslatable_field',
  );

const text = (value: unknown): string => (typeof value === 'string' ? value : '');

/** The Messages request of a Chat Completions request. */
export function chatToMessages(body: Json): Json {
  for (const field of Object.keys(body)) {
    if (!CARRIED.has(field) && !HINTS.has(field) && body[field] !== undefined && body[field] !== null) {
      throw cannot(field, 'the Messages API has no such field');
    }
  }
  if (typeof body.n === 'number' && body.n > 1) throw cannot('n', 'the Messages API answers one choice');
  const system: string[] = [];
  const turns: Array<{ role: 'user' | 'assistant'; content: Json[] }> = [];
  const push = (role: 'user' | 'assistant', blocks: Json[]) => {
    const last = turns.at(-1);
    if (last && last.role === role) last.content.push(...blocks);
    else turns.push({ role, content: blocks });
  };
  for (const [i, message] of (body.messages as Json[]).entries()) {
    const where = `messages.${i}`;
    switch (message.role) {
      case 'system':
      case 'developer':
        system.push(plainText(message.content, `${where}.content`));
        break;
      case 'user':
        push('user', userBlocks(message.content, `${where}.content`));
        break;
      case 'assistant': {
        const blocks: Json[] = [];
        const said = plainText(message.content, `${where}.content`) + text(message.refusal);
        if (said) blocks.push({ type: 'text', text: said });
        for (const [j, call] of ((message.tool_calls as Json[] | undefined) ?? []).entries()) {
          const fn = (call.function ?? {}) as Json;
          let input: unknown;
          try {
            input = JSON.parse(text(fn.arguments) || '{}');
          } catch {
            throw cannot(`${where}.tool_calls.${j}.function.arguments`, 'tool arguments must be JSON');
          }
          blocks.push({ type: 'tool_use', id: call.id, name: fn.name, input });
        }
        if (message.function_call) throw cannot(`${where}.function_call`, 'use tool_calls');
        push('assistant', blocks.length ? blocks : [{ type: 'text', text: '' }]);
        break;
      }
      case 'tool':
        push('user', [
          {
            type: 'tool_result',
            tool_use_id: message.tool_call_id,
            content: plainText(message.content, `${where}.content`),
          },
        ]);
        break;
      default:
        throw cannot(`${where}.role`, `the role '${String(message.role)}' has no Messages form`);
    }
  }
  const out: Json = {
    model: body.model,
    messages: turns,
    max_tokens: body.max_completion_tokens ?? body.max_tokens,
  };
  if (system.length) out.system = system.join('\n\n');
  if (body.stop !== undefined && body.stop !== null) {
    out.stop_sequences = typeof body.stop === 'string' ? [body.stop] : body.stop;
  }
  if (typeof body.temperature === 'number') {
    if (body.temperature > 1) throw cannot('temperature', 'Anthropic takes a temperature from 0 to 1');
    out.temperature = body.temperature;
  }
  if (body.top_p !== undefined && body.top_p !== null) out.top_p = body.top_p;
  if (typeof body.user === 'string') out.metadata = { user_id: body.user };
  if (body.stream === true) out.stream = true;
  if (Array.isArray(body.tools) && body.tools.length) {
    out.tools = (body.tools as Json[]).map((tool, i) => {
      if (tool.type !== 'function') throw cannot(`tools.${i}.type`, 'only function tools are translated');
      const fn = (tool.function ?? {}) as Json;
      return {
        name: fn.name,
        ...(fn.description !== undefined ? { description: fn.description } : {}),
        input_schema: fn.parameters ?? { type: 'object', properties: {} },
      };
    });
  }
  const choice = body.tool_choice;
  let toolChoice: Json | undefined;
  if (choice === 'auto') toolChoice = { type: 'auto' };
  else if (choice === 'none') toolChoice = { type: 'none' };
  else if (choice === 'required') toolChoice = { type: 'any' };
  else if (choice && typeof choice === 'object') {
    toolChoice = { type: 'tool', name: ((choice as Json).function as Json | undefined)?.name };
  }
  if (body.parallel_tool_calls === false && out.tools) {
    toolChoice = { ...(toolChoice ?? { type: 'auto' }), disable_parallel_tool_use: true };
  }
  if (toolChoice) out.tool_choice = toolChoice;
  return out;
}

/** A system, tool or assistant content: a string, or text parts. */
function plainText(content: unknown, where: string): string {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw cannot(where, 'must be text');
  return (content as Json[])
    .map((part, k) => {
      if (part.type !== 'text') throw cannot(`${where}.${k}`, 'only text parts are translated here');
      return text(part.text);
    })
    .join('');
}

function userBlocks(content: unknown, where: string): Json[] {
  if (typeof content === 'string') return [{ type: 'text', text: content }];
  if (!Array.isArray(content)) throw cannot(where, 'must be a string or content parts');
  return (content as Json[]).map((part, k) => {
    const at = `${where}.${k}`;
    switch (part.type) {
      case 'text':
        return { type: 'text', text: text(part.text) };
      case 'image_url': {
        const url = text((part.image_url as Json | undefined)?.url);
        const data = /^data:([^;,]+);base64,(.*)$/s.exec(url);
        if (data) return { type: 'image', source: { type: 'base64', media_type: data[1], data: data[2] } };
        return { type: 'image', source: { type: 'url', url } };
      }
      case 'file': {
        const fileData = text((part.file as Json | undefined)?.file_data);
        const data = /^data:([^;,]+);base64,(.*)$/s.exec(fileData);
        if (!data) throw cannot(`${at}.file`, 'only inline `file_data` (a base64 data URL) is translated');
        return { type: 'document', source: { type: 'base64', media_type: data[1], data: data[2] } };
      }
    }
    throw cannot(at, `a '${String(part.type)}' part has no Messages form`);
  });
}

const FINISH: Record<string, string> = {
  end_turn: 'stop',
  stop_sequence: 'stop',
  pause_turn: 'stop',
  max_tokens: 'length',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
};
const finishReason = (stop: unknown) => (typeof stop === 'string' ? (FINISH[stop] ?? 'stop') : 'stop');

/**
 * Anthropic usage as Chat Completions': cache writes stay visible beside it, as
 * `cache_creation_input_tokens` (and `cache_creation`), so they are priced as writes.
 */
export function chatUsageOf(usage: AnthropicUsage | undefined): ChatUsage & { prompt_tokens: number } {
  const cached = usage?.cache_read_input_tokens ?? 0;
  const writes = cacheWritesOf(usage);
  const prompt = (usage?.input_tokens ?? 0) + (writes?.write ?? 0) + cached;
  const completion = usage?.output_tokens ?? 0;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
    ...(writes ? { cache_creation_input_tokens: writes.write } : {}),
    ...(usage?.cache_creation ? { cache_creation: usage.cache_creation } : {}),
  };
}

/** The input part of an Anthropic usage as chat usage (no output known yet: `message_start`). */
function inputUsageOf(usage: AnthropicUsage): ChatUsage | undefined {
  if (typeof usage.input_tokens !== 'number') return undefined;
  const { completion_tokens: _c, total_tokens: _t, ...input } = chatUsageOf(usage);
  return input;
}

const chatId = (id: unknown) => `chatcmpl-${String(id ?? '').replace(/^msg_/, '')}`;

/** The chat completion of an Anthropic message. */
export function messageToChat(json: Json, model: string): Json {
  if (!Array.isArray(json.content)) {
    throw new UpstreamError('malformed', 'The provider returned a message without `content`.');
  }
  let content = '';
  let reasoning = '';
  const toolCalls: Json[] = [];
  for (const block of json.content as Json[]) {
    if (block.type === 'text') content += text(block.text);
    else if (block.type === 'thinking') reasoning += text(block.thinking);
    else if (block.type === 'tool_use') {
      toolCalls.push({
        id: block.id,
        type: 'function',
        function: { name: block.name, arguments: JSON.stringify(block.input ?? {}) },
      });
    }
  }
  return {
    id: chatId(json.id),
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: content || (toolCalls.length ? null : ''),
          refusal: null,
          ...(reasoning ? { reasoning_content: reasoning } : {}),
          ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
        },
        logprobs: null,
        finish_reason: finishReason(json.stop_reason),
      },
    ],
    usage: chatUsageOf(json.usage as AnthropicUsage | undefined),
  };
}

/**
 * Anthropic's events as chat chunks: the role at `message_start`, `text_delta` → `content`,
 * `thinking_delta` → `reasoning_content`, each `tool_use` block a tool call (its `input_json_delta`s the
 * arguments), at `message_stop` the finish reason, a usage chunk and `[DONE]`. The usage Anthropic
 * reports before its end (the input at `message_start`, the output at `message_delta`) goes along as
 * the messages' `usage`, so a stream that breaks off after it is charged from it.
 */
export async function* messagesStreamToChat(
  events: AsyncIterable<SseMessage>,
  model: string,
): AsyncGenerator<SseMessage> {
  let id = chatId('');
  const created = Math.floor(Date.now() / 1000);
  const usage: AnthropicUsage = {};
  let stop: unknown;
  const tools = new Map<number, number>(); // block index → tool call index
  const chatChunk = (fields: Json): SseMessage => ({
    event: undefined,
    data: JSON.stringify({ id, object: 'chat.completion.chunk', created, model, ...fields }),
  });
  const chunk = (delta: Json, finish: string | null = null): SseMessage =>
    chatChunk({ choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] });
  for await (const message of events) {
    const event = streamEventJson(message.data);
    switch (event.type) {
      case 'error':
        throw streamError(message.data, (event.error as Json | undefined)?.type === 'overloaded_error');
      case 'message_start': {
        const started = (event.message ?? {}) as Json;
        id = chatId(started.id);
        Object.assign(usage, numbers(started.usage));
        delete usage.output_tokens; // a placeholder until message_delta
        const input = inputUsageOf(usage);
        yield { ...chunk({ role: 'assistant', content: '' }), ...(input ? { usage: input } : {}) };
        break;
      }
      case 'content_block_start': {
        const block = (event.content_block ?? {}) as Json;
        if (block.type === 'tool_use') {
          const index = tools.size;
          tools.set(Number(event.index), index);
          yield chunk({
            tool_calls: [
              { index, id: block.id, type: 'function', function: { name: block.name, arguments: '' } },
            ],
          });
        }
        break;
      }
      case 'content_block_delta': {
        const delta = (event.delta ?? {}) as Json;
        if (delta.type === 'text_delta') yield chunk({ content: text(delta.text) });
        else if (delta.type === 'thinking_delta') yield chunk({ reasoning_content: text(delta.thinking) });
        else if (delta.type === 'input_json_delta') {
          const index = tools.get(Number(event.index));
          if (index !== undefined) {
            yield chunk({ tool_calls: [{ index, function: { arguments: text(delta.partial_json) } }] });
          }
        }
        break;
      }
      case 'message_delta':
        Object.assign(usage, numbers(event.usage));
        stop = (event.delta as Json | undefined)?.stop_reason ?? stop;
        if (typeof usage.output_tokens === 'number')
          yield { event: undefined, data: '', usage: chatUsageOf(usage) };
        break;
      case 'message_stop':
        yield chunk({}, finishReason(stop));
        yield chatChunk({ choices: [], usage: chatUsageOf(usage) });
        yield { event: undefined, data: '[DONE]' };
        return;
    }
  }
}

function numbers(value: unknown): AnthropicUsage {
  const out: Record<string, unknown> = {};
  if (value && typeof value === 'object') {
    for (const [name, n] of Object.entries(value)) {
      if (typeof n === 'number' || (name === 'cache_creation' && n && typeof n === 'object')) out[name] = n;
    }
  }
  return out as AnthropicUsage;
}

/**
 * A provider of kind `anthropic`: the Messages API natively, Chat Completions translated to it; the
 * Responses and Embeddings APIs are refused with a 400 that says so.
 */
export class ChatOverMessages extends TranslatingProvider {
  constructor(inner: Provider) {
    const passes = (path: string) => path === '/messages';
    super(inner, { passes, call: messagesCall, answer: messageToChat, stream: messagesStreamToChat });
  }
}

function messagesCall(call: UpstreamCall): UpstreamCall {
  if (call.path !== '/chat/completions') {
    throw badRequest(
      `This model's provider speaks Anthropic's Messages API: POST /v1${call.path} is not translated to it (use /v1/chat/completions or /v1/messages).`,
      'model',
      'unsupported_endpoint',
    );
  }
  return { path: '/messages', body: chatToMessages(call.body), signal: call.signal };
}
