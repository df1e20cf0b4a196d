import { isPlainText } from '../core/validation.ts';
import { type ChatRequest, chatRequestSchema, messageSchema } from './schema.ts';

/**
 * The common chat completion request checked without zod: text messages of the plain roles, the fields
 * Tollgate reads, any field the schema does not name. When a body is one of those and valid, the result
 * is what `chatRequestSchema` returns — the same object, key for key and in the same order (the schema's
 * keys first, in its order, then the others as sent; test/proxy/chat-schema-fast.test.ts holds the two
 * together). Anything else (another field of the schema, content parts, tool calls, an invalid value)
 * returns undefined and goes to zod, which accepts it or words the error. zod's parse of the whole
 * superset schema was the largest part of the validation of a request.
 */

/** The schema's own key order, which zod's output follows. */
const REQUEST_KEYS = Object.keys(chatRequestSchema.shape);
const MESSAGE_KEYS = Object.keys(messageSchema.shape);
const REQUEST_KNOWN = new Set(REQUEST_KEYS);
const MESSAGE_KNOWN = new Set(MESSAGE_KEYS);

/** The keys checked here; any other key of the schema sends the body to zod. */
const HANDLED_REQUEST = new Set([
  'model',
  'messages',
  'stream',
  'user',
  'max_tokens',
  'max_completion_tokens',
  'n',
  'stream_options',
]);
const HANDLED_MESSAGE = new Set(['role', 'content', 'name']);
const TEXT_ROLES = new Set(['system', 'user', 'assistant', 'developer']);
const NAME = /^[a-zA-Z0-9_]{1,64}$/;

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.getPrototypeOf(v) === Object.prototype;

const positiveInt = (v: unknown, max = Number.MAX_SAFE_INTEGER) =>
  v === null || (typeof v === 'number' && Number.isSafeInteger(v) && v >= 1 && v <= max);

/** zod's output for `input`, or undefined when only zod can say. */
export function fastChatRequest(input: unknown): ChatRequest | undefined {
  if (!isObject(input)) return undefined;
  for (const key in input) {
    if ((REQUEST_KNOWN.has(key) && !HANDLED_REQUEST.has(key)) || key in Object.prototype) return undefined;
  }
  const model = input.model;
  if (typeof model !== 'string' || model.length === 0) return undefined;
  const messages = fastMessages(input.messages);
  if (!messages) return undefined;
  if (Object.hasOwn(input, 'stream') && input.stream !== null && typeof input.stream !== 'boolean')
    return undefined;
  if (Object.hasOwn(input, 'user')) {
    const user = input.user;
    if (typeof user !== 'string' || user.length === 0 || user.length > 256 || !isPlainText(user))
      return undefined;
  }
  if (Object.hasOwn(input, 'max_tokens') && !positiveInt(input.max_tokens)) return undefined;
  if (Object.hasOwn(input, 'max_completion_tokens') && !positiveInt(input.max_completion_tokens))
    return undefined;
  if (Object.hasOwn(input, 'n') && !positiveInt(input.n, 128)) return undefined;
  let streamOptions: unknown;
  if (Object.hasOwn(input, 'stream_options')) {
    const options = input.stream_options;
    if (options === null) streamOptions = null;
    else {
      if (!isObject(options)) return undefined;
      for (const key in options) if (key in Object.prototype) return undefined;
      if (Object.hasOwn(options, 'include_usage') && typeof options.include_usage !== 'boolean')
        return undefined;
      streamOptions = reordered(options, STREAM_OPTIONS_KEYS, STREAM_OPTIONS_KNOWN);
    }
  }
  const out = reordered(input, REQUEST_KEYS, REQUEST_KNOWN);
  out.messages = messages;
  if (streamOptions !== undefined) out.stream_options = streamOptions;
  return out as ChatRequest;
}

const STREAM_OPTIONS_KEYS = ['include_usage'];
const STREAM_OPTIONS_KNOWN = new Set(STREAM_OPTIONS_KEYS);

function fastMessages(value: unknown): Json[] | undefined {
  if (!Array.isArray(value) || value.length === 0) return undefined;
  const out: Json[] = new Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const message = value[i];
    if (!isObject(message)) return undefined;
    for (const key in message) {
      if ((MESSAGE_KNOWN.has(key) && !HANDLED_MESSAGE.has(key)) || key in Object.prototype) return undefined;
    }
    if (typeof message.role !== 'string' || !TEXT_ROLES.has(message.role)) return undefined;
    if (typeof message.content !== 'string') return undefined;
    if (Object.hasOwn(message, 'name') && (typeof message.name !== 'string' || !NAME.test(message.name)))
      return undefined;
    out[i] = reordered(message, MESSAGE_KEYS, MESSAGE_KNOWN);
  }
  return out;
}

/**
 * A copy of `input` as zod builds it: the schema's keys present in the input, in the schema's order,
 * then the other keys in the input's order.
 */
function reordered(input: Json, schemaKeys: readonly string[], known: ReadonlySet<string>): Json {
  const out: Json = {};
  for (const key of schemaKeys) if (Object.hasOwn(input, key)) out[key] = input[key];
  for (const key in input) if (!known.has(key)) out[key] = input[key];
  return out;
}
