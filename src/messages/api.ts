import type { FastifyRequest } from 'fastify';
import { type ApiError, badRequest } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import type { ClientHeaders, MeteredApi, ReportedUsage, StreamReader, StreamStep } from '../metering/api.ts';
import { reportedUsage } from '../metering/api.ts';
import { END_USER_HEADER } from '../metering/end-user.ts';
import { sseEvent } from '../metering/relay.ts';
import { type LinkReply, paywallField } from '../paywall/replies.ts';
import { countText, type TextCounter } from '../tokens/count.ts';
import { partTokens } from '../tokens/inputs.ts';
import {
  type AnthropicUsage,
  cacheWritesOf,
  isSessionUserId,
  noAnthropicUsage,
} from '../upstream/anthropic/provider.ts';
import { type SseMessage, streamError, streamEventJson, UpstreamError } from '../upstream/types.ts';
import { userIdSchema } from '../users/schema.ts';
import type { ContentBlock, CountTokensRequest, MessagesRequest } from './schema.ts';
import { messagesRequestSchema } from './schema.ts';

/**
 * `POST /v1/messages` (Anthropic's Messages API) as a metered API. The request is forwarded as received
 * with the provider's model name (`max_tokens`, required by the API, is the bound the hold pays for),
 * with the client's `anthropic-version` and `anthropic-beta` headers; a provider of kind
 * `openai-compatible` gets it translated to Chat Completions
 * (src/upstream/anthropic/messages-over-chat.ts). Usage is read from `usage` of the message, or of the
 * stream's `message_start` and final `message_delta`:
 * `input_tokens` + `cache_creation_input_tokens` + `cache_read_input_tokens` are the input (cache reads
 * priced as cached input, cache writes at the cache write prices — `cache_creation.ephemeral_1h_input_tokens`
 * at the 1-hour one), `output_tokens` the output. Stream events pass through
 * untouched, with their `event:` names.
 */

/** Headers of Anthropic's clients passed on to the provider. */
export const FORWARDED_HEADERS = ['anthropic-version', 'anthropic-beta'] as const;

const str = (value: unknown): string => (typeof value === 'string' ? value : '');

/** Tokens of one content block as Tollgate estimates them (o200k; images by OpenAI's tile rule). */
function blockTokens(block: ContentBlock, count: TextCounter): number {
  switch (block.type) {
    case 'text':
      return count(str(block.text));
    case 'image': {
      const source = block.source as { type?: string; media_type?: string; data?: string; url?: string };
      const url =
        source.type === 'base64' ? `data:${source.media_type};base64,${source.data}` : str(source.url);
      return partTokens({ type: 'image_url', image_url: { url } }, count);
    }
    case 'tool_use':
      return count(`${str(block.name)}${JSON.stringify(block.input ?? {})}`);
    case 'tool_result': {
      const content = block.content;
      if (typeof content === 'string') return count(content);
      if (!Array.isArray(content)) return 0;
      let tokens = 0;
      for (const inner of content as ContentBlock[]) tokens += blockTokens(inner, count);
      return tokens;
    }
    case 'thinking':
      return count(str(block.thinking));
    default:
      return count(JSON.stringify(block));
  }
}

/**
 * Input tokens as Tollgate estimates them: 3 for the reply, per message 4 of framing plus its blocks,
 * the system prompt, tool definitions and tool choice as their JSON.
 */
export function countMessagesInput(body: CountTokensRequest, count: TextCounter = countText): number {
  let tokens = 3;
  const system = body.system;
  if (typeof system === 'string') tokens += 4 + count(system);
  else if (Array.isArray(system)) for (const block of system) tokens += 4 + count(block.text);
  for (const message of body.messages) {
    tokens += 4;
    if (typeof message.content === 'string') tokens += count(message.content);
    else for (const block of (message.content ?? []) as ContentBlock[]) tokens += blockTokens(block, count);
  }
  if (body.tools?.length) tokens += count(JSON.stringify(body.tools));
  if (body.tool_choice) tokens += count(JSON.stringify(body.tool_choice));
  return tokens;
}

/**
 * Anthropic's usage in Tollgate's terms: every input token (cache writes and reads included) is input;
 * reads are its cached part, writes its written part.
 */
export function messagesUsage(usage: AnthropicUsage | null | undefined): ReportedUsage | undefined {
  if (!usage) return undefined;
  const parts = [usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens];
  const input = parts.some((n) => typeof n === 'number')
    ? parts.reduce<number>((sum, n) => sum + (typeof n === 'number' ? n : 0), 0)
    : undefined;
  const writes = cacheWritesOf(usage);
  return reportedUsage({
    input,
    output: usage.output_tokens,
    cachedInput: usage.cache_read_input_tokens ?? (input === undefined ? undefined : 0),
    cacheWrite: writes?.write,
    cacheWrite1h: writes?.write1h,
  });
}

/** Text a message produced: text, thinking, tool inputs. */
function producedText(content: unknown): string {
  if (!Array.isArray(content)) return '';
  let text = '';
  for (const block of content as Array<Record<string, unknown>>) {
    text += str(block.text) + str(block.thinking);
    if (block.type === 'tool_use') text += str(block.name) + JSON.stringify(block.input ?? {});
  }
  return text;
}

/** The longest cache write a request asks for: `cache_control` at the top, on tools, system or content blocks. */
function cacheWriteOf(body: MessagesRequest): '5m' | '1h' | undefined {
  let found: '5m' | '1h' | undefined;
  const see = (part: unknown): void => {
    const control = (part as { cache_control?: { ttl?: unknown } | null } | null)?.cache_control;
    if (control) found = control.ttl === '1h' ? '1h' : (found ?? '5m');
  };
  see(body);
  for (const tool of body.tools ?? []) see(tool);
  if (Array.isArray(body.system)) for (const block of body.system) see(block);
  for (const message of body.messages) {
    if (Array.isArray(message.content)) for (const block of message.content) see(block);
  }
  return found;
}

export const messagesApi: MeteredApi<MessagesRequest> = {
  name: 'messages',
  endpoint: 'chat',
  title: 'Messages',
  upstreamPath: '/messages',
  schema: messagesRequestSchema,
  countInput: countMessagesInput,
  requestedBound: (body) => body.max_tokens,
  cacheWrite: cacheWriteOf,
  choices: () => 1,

  upstreamBody(body, model, bound) {
    const out: Record<string, unknown> = { ...body, model: model.upstream_model };
    if (bound !== undefined) out.max_tokens = bound;
    return out;
  },

  read(json) {
    if (!Array.isArray(json.content)) {
      throw new UpstreamError('malformed', 'The provider returned a message without `content`.');
    }
    const usage = messagesUsage(json.usage as AnthropicUsage | undefined);
    return {
      usage,
      produced: usage?.output === undefined ? countText(producedText(json.content)) : 0,
      finishReason: typeof json.stop_reason === 'string' ? json.stop_reason : null,
    };
  },

  refusal(link, x) {
    const message = linkMessage(link, x.model.id);
    if (!x.stream) return { kind: 'json', status: 200, body: message };
    return { kind: 'stream', body: linkMessageStream(message, link.message) };
  },

  streamReader: () => new MessagesStreamReader(),
  endUser: messagesEndUser,
  upstreamHeaders: forwardedHeaders,
  renderError: (error) => ({ event: 'error', body: anthropicError(error) }),
};

/**
 * The end user the body names: `metadata.user_id`, unless the `X-Service-User` header names one (the
 * developer's choice for the client as a whole) — and never Claude Code's session id (isSessionUserId),
 * which would make every session a new, unconnected user. Such a request's user comes from its
 * end-user key or the header; with neither it is a 400 saying how to name the user (not the device id:
 * a machine is not a person, and the user a wallet belongs to is the operator's to name).
 */
function messagesEndUser(body: MessagesRequest, client: ClientHeaders): string | undefined {
  if (client.headers[END_USER_HEADER]) return undefined;
  const id = body.metadata?.user_id ?? undefined;
  if (id === undefined) return undefined;
  if (isSessionUserId(id)) {
    // An end-user key names the user (src/auth sets it on the request it authenticated).
    if ((client as { endUser?: unknown }).endUser !== undefined) return undefined;
    throw badRequest(
      "No end user: 'metadata.user_id' is Claude Code's session id, not your user's. Authenticate with the user's end-user key, or name the user in the `X-Service-User` header (for Claude Code: ANTHROPIC_CUSTOM_HEADERS=\"X-Service-User: <user id>\").",
      'metadata.user_id',
      'missing_user',
    );
  }
  const checked = userIdSchema.safeParse(id);
  if (!checked.success) {
    throw badRequest(`Invalid 'metadata.user_id': ${checked.error.issues[0]!.message}`, 'metadata.user_id');
  }
  return checked.data;
}

/** The client's `anthropic-version` / `anthropic-beta`, to pass on. */
export function forwardedHeaders(request: FastifyRequest): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  for (const name of FORWARDED_HEADERS) {
    const value = request.headers[name];
    const text = Array.isArray(value) ? value.join(',') : value;
    if (text) out[name] = text;
  }
  return Object.keys(out).length ? out : undefined;
}

/** Anthropic's error types by HTTP status. */
function anthropicErrorType(error: ApiError): string {
  switch (error.status) {
    case 400:
      return 'invalid_request_error';
    case 401:
      return 'authentication_error';
    case 402:
      return 'billing_error';
    case 403:
      return 'permission_error';
    case 404:
      return 'not_found_error';
    case 413:
      return 'request_too_large';
    case 429:
      return 'rate_limit_error';
    case 503:
    case 529:
      return 'overloaded_error';
    case 504:
      return 'timeout_error';
  }
  return error.status < 500 ? 'invalid_request_error' : 'api_error';
}

/** An error in Anthropic's shape: `{"type":"error","error":{"type","message"}}` (plus Tollgate's code). */
export function anthropicError(error: ApiError) {
  return {
    type: 'error',
    error: {
      type: anthropicErrorType(error),
      message: error.message,
      ...(error.param ? { param: error.param } : {}),
      ...(error.code ? { code: error.code } : {}),
    },
  };
}

/**
 * An Anthropic stream: `message_start` (input usage), content blocks, `message_delta` (stop reason and
 * the cumulative usage), `message_stop`; `ping`s; an `error` event is the provider's failure. Relayed
 * whole (the bound is `max_tokens`, which the provider enforces).
 */
class MessagesStreamReader implements StreamReader {
  readonly canCut = false;
  #usage: AnthropicUsage = {};
  #seenUsage = false;
  finishReason: string | null = null;
  finished = false;

  get usage(): ReportedUsage | undefined {
    return this.#seenUsage ? messagesUsage(this.#usage) : undefined;
  }

  next(message: SseMessage): StreamStep {
    const event = streamEventJson<{
      type?: unknown;
      message?: { usage?: AnthropicUsage };
      usage?: AnthropicUsage;
      delta?: {
        type?: unknown;
        text?: unknown;
        partial_json?: unknown;
        thinking?: unknown;
        stop_reason?: unknown;
      };
      error?: { type?: unknown };
    }>(message.data);
    const type = typeof event.type === 'string' ? event.type : message.event;
    switch (type) {
      case 'error':
        throw streamError(message.data, event.error?.type === 'overloaded_error');
      case 'message_start':
        // its output_tokens is a placeholder (1): the output is final only in message_delta, and a
        // stream that breaks off before it is charged Tollgate's count of what was forwarded. A
        // translated stream's start carries no provider usage at all (Tollgate's estimate): not recorded.
        if (!message.placeholderUsage) this.#merge(event.message?.usage, ['output_tokens']);
        return { action: 'forward', tokens: 0 };
      case 'message_delta':
        if (!message.placeholderUsage) this.#merge(event.usage);
        if (typeof event.delta?.stop_reason === 'string') this.finishReason = event.delta.stop_reason;
        return { action: 'forward', tokens: 0 };
      case 'message_stop':
        this.finished = true;
        this.finishReason ??= 'end_turn';
        return { action: 'forward', tokens: 0 };
      case 'content_block_delta': {
        const delta = event.delta;
        const text = str(delta?.text) + str(delta?.partial_json) + str(delta?.thinking);
        return { action: 'forward', tokens: text ? countText(text) : 0 };
      }
    }
    return { action: 'forward', tokens: 0 };
  }

  /** Usage fields are cumulative: a later event's value replaces an earlier one. */
  #merge(usage: AnthropicUsage | undefined, except: string[] = []): void {
    if (!usage || typeof usage !== 'object') return;
    for (const [name, value] of Object.entries(usage)) {
      if (typeof value === 'number' && !except.includes(name)) {
        (this.#usage as Record<string, number>)[name] = value;
        this.#seenUsage = true;
      }
    }
    if (usage.cache_creation && typeof usage.cache_creation === 'object') {
      this.#usage.cache_creation = { ...this.#usage.cache_creation, ...usage.cache_creation };
    }
  }

  tail(): string {
    return '';
  }
}

/** A message whose one text block carries the link (plus `paywall` for programs). */
export function linkMessage(link: LinkReply, model: string) {
  return {
    id: newId('msg'),
    type: 'message',
    role: 'assistant',
    model,
    content: [{ type: 'text', text: link.message }],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage: noAnthropicUsage(),
    paywall: paywallField(link),
  };
}

/**
 * The same message as Anthropic's event stream: `message_start`, `content_block_start`,
 * `content_block_delta` (`text_delta`, the whole text), `content_block_stop`, `message_delta`,
 * `message_stop`.
 */
export function linkMessageStream(message: ReturnType<typeof linkMessage>, text: string): string {
  const events: Array<Record<string, unknown>> = [
    {
      type: 'message_start',
      message: { ...message, content: [], stop_reason: null },
    },
    { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
    { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } },
    { type: 'content_block_stop', index: 0 },
    {
      type: 'message_delta',
      delta: { stop_reason: 'end_turn', stop_sequence: null },
      usage: { output_tokens: 0 },
    },
    { type: 'message_stop' },
  ];
  return events.map((event) => sseEvent(JSON.stringify(event), String(event.type))).join('');
}
