import { badRequest } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { estimatingCounter } from '../../tokens/count.ts';
import { type ChatPrompt, countPromptTokens } from '../../tokens/inputs.ts';
import type { ChatUsage, Provider, SseMessage, UpstreamCall } from '../types.ts';
import { streamError, streamEventJson, UpstreamError } from '../types.ts';
import { outputWithReasoning } from '../usage.ts';
import { isSessionUserId, noAnthropicUsage } from './provider.ts';
import { TranslatingProvider } from './translating-provider.ts';

/**
 * Anthropic's Messages API over an OpenAI-compatible provider: a `POST /v1/messages` whose route is a
 * provider of kind `openai-compatible` (or the echo provider) is sent as a Chat Completions request and
 * its answer — JSON or stream — comes back as an Anthropic message / event stream. What changes the
 * answer's meaning and cannot be carried is a 400 naming the field; hints with no Chat Completions
 * counterpart are left out and named in the answer's `x-tollgate-dropped-hints` header, never silently.
 * The mapping (also docs/coding-agents-fields.md):
 *
 * | Messages request                          | Chat Completions request                               |
 * |-------------------------------------------|--------------------------------------------------------|
 * | `system` (string or text blocks)          | a first `system` message                               |
 * | a `system` turn inside `messages`         | a `system` message at the same place                   |
 * | `text` block                              | `text` part                                            |
 * | `image` block (base64 or url)             | `image_url` part (a data URL for base64)               |
 * | `document` block (base64 PDF / text)      | `file` part (`file_data`) / `text` part                |
 * | assistant `tool_use` blocks               | the assistant message's `tool_calls`                   |
 * | user `tool_result` blocks                 | `tool` messages (before the user's other content)      |
 * | `tools` (custom: name, description, input_schema) | `tools` of type `function` (`parameters`)      |
 * | a tool with `defer_loading`               | the same function tool, sent with the others (hint)    |
 * | the tool search tools (`tool_search_tool_*`) | left out: every tool is already sent (hint)         |
 * | `tool_reference` blocks of a tool result  | text naming the tool (its definition is in `tools`)    |
 * | `tool_choice` auto / any / tool / none    | `auto` / `required` / `{function}` / `none`            |
 * | `disable_parallel_tool_use`               | `parallel_tool_calls: false`                           |
 * | `max_tokens`, `stop_sequences`, `temperature`, `top_p` | `max_tokens`, `stop`, `temperature`, `top_p` |
 * | `metadata.user_id`                        | `user`                                                 |
 * | `thinking` enabled (`budget_tokens`)      | `reasoning_effort` low (< 4096) / medium (< 16384) / high |
 * | `output_config.effort` (wins over thinking) | `reasoning_effort` low / medium / high (xhigh, max: high) |
 * | `output_config.format` (`json_schema`)    | `response_format` `json_schema`                        |
 * | `stream`                                  | `stream` with `stream_options.include_usage`           |
 * | `cache_control`, `inference_geo`, `speed`, `diagnostics`, `service_tier`, `context_management`, `output_config.task_budget`, the `anthropic-beta` header, `thinking` blocks of earlier turns, Claude Code's session `metadata.user_id` | left out: hints |
 *
 * Refused with a 400: other server tools (`web_search_…`, …), `file` image or document sources,
 * `top_k`, `container`, `mcp_servers`, another `output_config.format`, other assistant blocks
 * (server tool results) and other Anthropic-only fields.
 *
 * Answers: `content` → a `text` block, `tool_calls` → `tool_use` blocks (arguments parsed as JSON),
 * `finish_reason` stop / length / tool_calls / content_filter → `stop_reason` end_turn / max_tokens /
 * tool_use / refusal; usage `prompt_tokens` (minus `cached_tokens`) → `input_tokens`, `cached_tokens` →
 * `cache_read_input_tokens`, `completion_tokens` → `output_tokens`.
 */

/** Request fields carried over (or read) by the translation; any other one is refused. */
const CARRIED = new Set([
  'model',
  'messages',
  'system',
  'max_tokens',
  'stop_sequences',
  'temperature',
  'top_p',
  'tools',
  'tool_choice',
  'metadata',
  'stream',
  'thinking',
  'output_config',
]);

type Json = Record<string, unknown>;

/** Hints with no Chat Completions meaning, left out (not content: the answer is the same without them). */
const HINTS = new Set([
  'cache_control',
  'inference_geo',
  'speed',
  'diagnostics',
  'service_tier',
  // Anthropic's context editing: the provider gets the history as the client sent it.
  'context_management',
]);

/** Anthropic's tool search tools: their search runs at Anthropic; translated, every tool is sent. */
const isToolSearch = (type: unknown) => typeof type === 'string' && type.startsWith('tool_search_tool_');

/** A tool search Anthropic ran in an earlier turn (its call and result): the tools it found are sent. */
const isToolSearchStep = (block: Json) =>
  block.type === 'tool_search_tool_result' ||
  (block.type === 'server_tool_use' && String(block.name ?? '').startsWith('tool_search_tool'));

/** `output_config.effort` → `reasoning_effort` (Chat Completions knows low / medium / high). */
const EFFORTS: Record<string, string> = {
  low: 'low',
  medium: 'medium',
  high: 'high',
  xhigh: 'high',
  max: 'high',
};

const cannot = (field: string, why: string) =>
  badRequest(
    `'${field}' cannot be sent to this model's provider (an OpenAI-compatible API, reached through Chat Completions): ${why}.`,
    field,
    'untranslatable_field',
  );

/**
 * The Chat Completions request of a Messages request. `dropped` collects the names of the hints left
 * out (each once), for the `x-tollgate-dropped-hints` header.
 */
export function messagesToChat(body: Json, dropped: string[] = []): Json {
  const drop = (name: string) => {
    if (!dropped.includes(name)) dropped.push(name);
  };
  for (const field of Object.keys(body)) {
    if (body[field] === undefined || body[field] === null) continue;
    if (HINTS.has(field)) drop(field);
    else if (!CARRIED.has(field)) throw cannot(field, 'Chat Completions has no such field');
  }
  const messages: Json[] = [];
  const system = body.system;
  if (typeof system === 'string') messages.push({ role: 'system', content: system });
  else if (Array.isArray(system)) {
    messages.push({
      role: 'system',
      content: (system as Json[]).map((b) => String(b.text ?? '')).join('\n'),
    });
  }
  for (const [i, message] of (body.messages as Json[]).entries()) {
    messages.push(...chatMessages(message, `messages.${i}`, drop));
  }
  const out: Json = { model: body.model, messages, max_tokens: body.max_tokens };
  if (/^(o\d|gpt-5)/.test(String(body.model))) {
    out.max_completion_tokens = out.max_tokens;
    delete out.max_tokens;
  }
  if (body.stop_sequences !== undefined) out.stop = body.stop_sequences;
  if (body.temperature !== undefined) out.temperature = body.temperature;
  if (body.top_p !== undefined) out.top_p = body.top_p;
  const userId = (body.metadata as { user_id?: unknown } | undefined)?.user_id;
  if (typeof userId === 'string') {
    // Claude Code's per-session id names no user: not the provider's `user` either.
    if (isSessionUserId(userId)) drop('metadata.user_id');
    else out.user = userId;
  }
  if (body.stream === true) {
    out.stream = true;
    out.stream_options = { include_usage: true };
  }
  const thinking = body.thinking as { type?: string; budget_tokens?: number } | undefined;
  if (thinking?.type === 'enabled') {
    const budget = thinking.budget_tokens ?? 0;
    out.reasoning_effort = budget < 4096 ? 'low' : budget < 16384 ? 'medium' : 'high';
  } else if (thinking?.type === 'adaptive') {
    out.reasoning_effort = 'medium';
  }
  outputConfig(body.output_config as Json | undefined, out, drop);
  if (Array.isArray(body.tools) && body.tools.length) {
    const tools = chatTools(body.tools as Json[], drop);
    if (tools.length) out.tools = tools;
  }
  const choice = body.tool_choice as { type?: string; name?: string; disable_parallel_tool_use?: boolean };
  if (choice) {
    out.tool_choice =
      choice.type === 'any'
        ? 'required'
        : choice.type === 'tool'
          ? { type: 'function', function: { name: choice.name } }
          : choice.type;
    if (choice.disable_parallel_tool_use === true && out.tools) out.parallel_tool_calls = false;
  }
  return out;
}

/** `output_config`: effort → `reasoning_effort` (it wins over `thinking`'s), format → `response_format`. */
function outputConfig(config: Json | undefined, out: Json, drop: (name: string) => void): void {
  if (!config || typeof config !== 'object') return;
  for (const [name, value] of Object.entries(config)) {
    if (value === undefined || value === null) continue;
    if (name === 'effort') {
      const effort = EFFORTS[String(value)];
      if (effort) out.reasoning_effort = effort;
      else drop('output_config.effort');
    } else if (name === 'format') {
      const format = value as Json;
      if (format.type !== 'json_schema') {
        throw cannot(
          'output_config.format',
          `an output format of type '${String(format.type)}' is Anthropic's own`,
        );
      }
      out.response_format = {
        type: 'json_schema',
        json_schema: { name: 'output', schema: format.schema ?? {}, strict: true },
      };
    } else drop(`output_config.${name}`);
  }
}

/**
 * Custom tools as function tools — deferred ones (`defer_loading`) too: the model can call every tool
 * without Anthropic's tool search, which is left out.
 */
function chatTools(tools: Json[], drop: (name: string) => void): Json[] {
  const out: Json[] = [];
  for (const [i, tool] of tools.entries()) {
    if (isToolSearch(tool.type)) {
      drop(String(tool.type));
      continue;
    }
    if (tool.type !== undefined && tool.type !== null && tool.type !== 'custom') {
      throw cannot(`tools.${i}`, `the server tool '${String(tool.type)}' runs only at Anthropic`);
    }
    if (tool.defer_loading === true) drop('defer_loading');
    out.push({
      type: 'function',
      function: {
        name: tool.name,
        ...(tool.description !== undefined ? { description: tool.description } : {}),
        parameters: tool.input_schema ?? { type: 'object', properties: {} },
      },
    });
  }
  return out;
}

/** The text of a system turn: its string, or its text blocks joined. */
function systemText(content: unknown, path: string): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return (content as Json[])
    .map((block, j) => {
      if (block.type !== 'text') {
        throw cannot(`${path}.content.${j}`, `a system turn carries only text to Chat Completions`);
      }
      return String(block.text ?? '');
    })
    .join('\n');
}

/**
 * One Anthropic message as Chat Completions messages: a system turn stays a system message in place;
 * tool results become `tool` messages; thinking blocks of earlier turns are left out (Claude's own
 * signed reasoning: another model cannot read it, and Anthropic itself drops earlier turns' thinking).
 */
function chatMessages(message: Json, path: string, drop: (name: string) => void): Json[] {
  const role = message.role as 'user' | 'assistant' | 'system';
  const content = message.content;
  if (role === 'system') {
    if (message.output_config !== undefined && message.output_config !== null) drop('messages.output_config');
    if (content === undefined) return [];
    return [{ role: 'system', content: systemText(content, path) }];
  }
  if (typeof content === 'string') return [{ role, content }];
  const blocks = content as Json[];
  if (role === 'assistant') {
    let text = '';
    const toolCalls: Json[] = [];
    for (const [j, block] of blocks.entries()) {
      const where = `${path}.content.${j}`;
      if (block.type === 'text') text += String(block.text ?? '');
      else if (block.type === 'tool_use') {
        toolCalls.push({
          id: block.id,
          type: 'function',
          function: { name: block.name, arguments: JSON.stringify(block.input ?? {}) },
        });
      } else if (block.type === 'thinking' || block.type === 'redacted_thinking') drop('thinking blocks');
      else if (isToolSearchStep(block)) drop('tool search steps');
      else throw cannot(where, `an assistant '${String(block.type)}' block has no Chat Completions form`);
    }
    return [
      {
        role: 'assistant',
        content: text || (toolCalls.length ? null : ''),
        ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
      },
    ];
  }
  const out: Json[] = [];
  const parts: Json[] = [];
  for (const [j, block] of blocks.entries()) {
    const where = `${path}.content.${j}`;
    if (block.type === 'tool_result') {
      out.push({ role: 'tool', tool_call_id: block.tool_use_id, content: toolResultText(block, where) });
      continue;
    }
    parts.push(chatPart(block, where));
  }
  if (parts.length) out.push({ role: 'user', content: parts });
  return out;
}

function chatPart(block: Json, where: string): Json {
  switch (block.type) {
    case 'text':
      return { type: 'text', text: block.text };
    case 'image': {
      const source = block.source as { type?: string; media_type?: string; data?: string; url?: string };
      if (source.type === 'base64') {
        return { type: 'image_url', image_url: { url: `data:${source.media_type};base64,${source.data}` } };
      }
      if (source.type === 'url') return { type: 'image_url', image_url: { url: source.url } };
      throw cannot(`${where}.source`, `an image source of type '${String(source.type)}' is Anthropic's own`);
    }
    case 'document': {
      const source = block.source as { type?: string; media_type?: string; data?: unknown };
      if (source.type === 'base64') {
        return {
          type: 'file',
          file: {
            filename: typeof block.title === 'string' ? block.title : 'document.pdf',
            file_data: `data:${source.media_type};base64,${String(source.data)}`,
          },
        };
      }
      if (source.type === 'text') return { type: 'text', text: String(source.data ?? '') };
      throw cannot(
        `${where}.source`,
        `a document source of type '${String(source.type)}' is Anthropic's own`,
      );
    }
  }
  throw cannot(where, `a '${String(block.type)}' block has no Chat Completions form`);
}

function toolResultText(block: Json, where: string): string {
  const content = block.content;
  const text =
    typeof content === 'string'
      ? content
      : Array.isArray(content)
        ? (content as Json[])
            .map((inner, k) => {
              // A tool the search loaded: its definition is already among the function tools.
              if (inner.type === 'tool_reference')
                return `Tool '${String(inner.tool_name ?? '')}' is loaded.`;
              if (inner.type !== 'text') {
                throw cannot(`${where}.content.${k}`, 'a tool result carries only text to Chat Completions');
              }
              return String(inner.text ?? '');
            })
            .join('')
        : '';
  return block.is_error === true ? `Error: ${text}` : text;
}

const STOP_REASONS: Record<string, string> = {
  stop: 'end_turn',
  length: 'max_tokens',
  tool_calls: 'tool_use',
  function_call: 'tool_use',
  content_filter: 'refusal',
};

const stopReason = (finish: unknown) =>
  typeof finish === 'string' ? (STOP_REASONS[finish] ?? 'end_turn') : 'end_turn';

/**
 * Chat usage as Anthropic's: reasoning tokens reported beside `completion_tokens` join the output
 * (../usage.ts); cache writes a provider reports (`cache_creation_input_tokens`) stay cache writes.
 */
export function anthropicUsage(usage: ChatUsage | null | undefined) {
  const cached = usage?.prompt_tokens_details?.cached_tokens ?? 0;
  const written = usage?.cache_creation_input_tokens ?? 0;
  return {
    input_tokens: Math.max(0, (usage?.prompt_tokens ?? 0) - cached - written),
    output_tokens:
      outputWithReasoning(
        usage?.prompt_tokens,
        usage?.completion_tokens,
        usage?.completion_tokens_details?.reasoning_tokens,
        usage?.total_tokens,
      ) ?? 0,
    cache_creation_input_tokens: written,
    cache_read_input_tokens: cached,
    ...(usage?.cache_creation ? { cache_creation: usage.cache_creation } : {}),
  };
}

function parseArguments(text: unknown): unknown {
  if (typeof text !== 'string' || !text) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new UpstreamError('malformed', 'The provider returned tool call arguments that are not JSON.');
  }
}

/** The Anthropic message of a chat completion. */
export function chatToMessage(json: Json, model: string): Json {
  const choice = (json.choices as Json[] | undefined)?.[0];
  if (!choice) throw new UpstreamError('malformed', 'The provider returned a response without `choices`.');
  const message = (choice.message ?? {}) as Json;
  const content: Json[] = [];
  const text = [message.content, message.refusal].filter((t) => typeof t === 'string' && t).join('');
  if (text) content.push({ type: 'text', text });
  for (const call of (message.tool_calls as Json[] | undefined) ?? []) {
    const fn = (call.function ?? {}) as Json;
    content.push({ type: 'tool_use', id: call.id, name: fn.name, input: parseArguments(fn.arguments) });
  }
  return {
    id: `msg_${String(json.id ?? newId('msg')).replace(/^chatcmpl[-_]?/, '')}`,
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: stopReason(choice.finish_reason),
    stop_sequence: null,
    usage: anthropicUsage(json.usage as ChatUsage | undefined),
  };
}

const event = (type: string, data: Json): SseMessage => ({
  event: type,
  data: JSON.stringify({ type, ...data }),
});

/**
 * A Chat Completions stream as Anthropic's events: `message_start` at the first chunk, a `text` block
 * for content, a `tool_use` block per tool call (its arguments as `input_json_delta`), each block
 * stopped when the next starts, then at `[DONE]` `message_delta` (stop reason and the usage of the
 * provider's usage chunk) and `message_stop`. A stream that ends without `[DONE]` ends without them
 * (the flow then reports it truncated).
 *
 * The provider's usage comes only at the end, so `message_start` carries Tollgate's estimate of the
 * input (o200k count of the Chat Completions prompt, so clients that read it there see no 0) and is
 * flagged `placeholderUsage`: the metering never takes it for the provider's usage (nor a
 * `message_delta` whose provider sent no usage chunk).
 */
export async function* chatStreamToMessages(
  chunks: AsyncIterable<SseMessage>,
  model: string,
  sent?: UpstreamCall,
): AsyncGenerator<SseMessage> {
  let started = false;
  let index = -1;
  let open: 'text' | 'tool' | undefined;
  const tools = new Map<number, number>(); // chat tool call index → block index
  let finish: unknown;
  let usage: ChatUsage | undefined;
  for await (const message of chunks) {
    if (message.data === '[DONE]') {
      if (!started) break;
      if (open) yield event('content_block_stop', { index });
      const delta = event('message_delta', {
        delta: { stop_reason: stopReason(finish), stop_sequence: null },
        usage: anthropicUsage(usage),
      });
      yield usage ? delta : { ...delta, placeholderUsage: true };
      yield event('message_stop', {});
      return;
    }
    const chunk = streamEventJson(message.data);
    if (chunk.error) throw streamError(message.data);
    if (!started) {
      started = true;
      const start = event('message_start', {
        message: {
          id: `msg_${String(chunk.id ?? newId('msg')).replace(/^chatcmpl[-_]?/, '')}`,
          type: 'message',
          role: 'assistant',
          model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { ...noAnthropicUsage(), input_tokens: estimatedInput(sent) },
        },
      });
      yield { ...start, placeholderUsage: true };
    }
    if (chunk.usage) usage = chunk.usage as ChatUsage;
    const choice = (chunk.choices as Json[] | undefined)?.[0];
    if (!choice) continue;
    const delta = (choice.delta ?? {}) as Json;
    const text = [delta.content, delta.refusal].filter((t) => typeof t === 'string' && t).join('');
    if (text) {
      if (open !== 'text') {
        if (open) yield event('content_block_stop', { index });
        index++;
        open = 'text';
        yield event('content_block_start', { index, content_block: { type: 'text', text: '' } });
      }
      yield event('content_block_delta', { index, delta: { type: 'text_delta', text } });
    }
    for (const call of (delta.tool_calls as Json[] | undefined) ?? []) {
      const callIndex = typeof call.index === 'number' ? call.index : 0;
      const fn = (call.function ?? {}) as Json;
      if (!tools.has(callIndex)) {
        if (open) yield event('content_block_stop', { index });
        index++;
        open = 'tool';
        tools.set(callIndex, index);
        yield event('content_block_start', {
          index,
          content_block: {
            type: 'tool_use',
            id: call.id ?? `toolu_${index}`,
            name: fn.name ?? '',
            input: {},
          },
        });
      }
      if (typeof fn.arguments === 'string' && fn.arguments) {
        yield event('content_block_delta', {
          index: tools.get(callIndex)!,
          delta: { type: 'input_json_delta', partial_json: fn.arguments },
        });
      }
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}

/** Text counted exactly for the estimate a translated `message_start` shows (a few ms at most). */
const DISPLAY_BUDGET_BYTES = 16 * 1024;

/** Tollgate's estimate of a translated request's prompt tokens (0 without the request), for display. */
function estimatedInput(sent: UpstreamCall | undefined): number {
  const messages = sent?.body.messages;
  if (!Array.isArray(messages)) return 0;
  try {
    return countPromptTokens(sent!.body as ChatPrompt, estimatingCounter(DISPLAY_BUDGET_BYTES));
  } catch {
    return 0; // an estimate for the client's display only
  }
}

/**
 * An OpenAI-compatible provider (or the echo provider) that also answers the Messages API, through
 * Chat Completions; every other call goes to it as is.
 */
export class MessagesOverChat extends TranslatingProvider {
  constructor(inner: Provider) {
    const passes = (path: string) => path !== '/messages';
    super(inner, { passes, call: chatCall, answer: chatToMessage, stream: chatStreamToMessages });
  }
}

/**
 * The chat call of a Messages call. The client's Anthropic headers are not sent (`anthropic-beta` is
 * named among the dropped hints); the hints left out are told to the caller (`onDropped`).
 */
function chatCall(call: UpstreamCall): UpstreamCall {
  const dropped: string[] = [];
  if (call.headers?.['anthropic-beta']) dropped.push('anthropic-beta');
  const body = messagesToChat(call.body, dropped);
  call.onDropped?.(dropped);
  return { path: '/chat/completions', body, signal: call.signal };
}
