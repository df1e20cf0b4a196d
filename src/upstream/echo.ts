import { decode, encode } from 'gpt-tokenizer';
import type { ChatRequest } from '../chat/schema.ts';
import { contentText, countPromptTokens } from '../chat/tokens.ts';
import { newId } from '../core/ids.ts';
import {
  type PassthroughAnswer,
  type Provider,
  type SseMessage,
  type UpstreamAnswer,
  type UpstreamCall,
  UpstreamError,
} from './types.ts';

export const ECHO_PREFIX = '[echo provider] ';

/** The echo repeats at most this many characters (gpt-tokenizer's encode is quadratic in a long run). */
const ECHO_MAX_CHARS = 2000;

/**
 * The built-in provider of projects whose upstream is `echo://local` (the dev demo, offline tests): it
 * answers with the last user message (its first ECHO_MAX_CHARS characters) prefixed by `[echo provider] `,
 * cut at `max_tokens` / `max_completion_tokens`, and reports usage counted with o200k. Streaming sends the
 * reply in several chunks, then a usage chunk when `stream_options.include_usage` asks for it. It serves
 * chat completions only: other APIs answer 404, as a provider without them would.
 */
export class EchoProvider implements Provider {
  async complete(call: UpstreamCall): Promise<UpstreamAnswer> {
    chatOnly(call.path);
    const reply = echoReply(call.body);
    const json = {
      id: newId('chatcmpl'),
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: String(call.body.model),
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
    chatOnly(call.path);
    return echoStream(call);
  }

  async passthrough(): Promise<PassthroughAnswer> {
    throw notServed();
  }
}

function notServed(): UpstreamError {
  return new UpstreamError('status', 'The echo provider serves chat completions only.', {
    status: 404,
    body: JSON.stringify({ error: { message: 'The echo provider serves chat completions only.' } }),
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

function echoReply(body: Record<string, unknown>): EchoReply {
  const request = body as unknown as ChatRequest;
  const lastUser = [...request.messages].reverse().find((m) => m.role === 'user');
  let tokens = encode(ECHO_PREFIX + contentText(lastUser?.content).slice(0, ECHO_MAX_CHARS));
  const limit = request.max_completion_tokens ?? request.max_tokens;
  let finishReason: EchoReply['finishReason'] = 'stop';
  if (limit && tokens.length > limit) {
    tokens = tokens.slice(0, limit);
    finishReason = 'length';
  }
  const prompt = countPromptTokens(request);
  return {
    text: decode(tokens),
    finishReason,
    usage: { prompt_tokens: prompt, completion_tokens: tokens.length, total_tokens: prompt + tokens.length },
  };
}

const STREAM_CHUNKS = 6;

async function* echoStream(call: UpstreamCall): AsyncGenerator<SseMessage> {
  const reply = echoReply(call.body);
  const base = {
    id: newId('chatcmpl'),
    object: 'chat.completion.chunk',
    created: Math.floor(Date.now() / 1000),
    model: String(call.body.model),
  };
  const chunk = (delta: Record<string, unknown>, finishReason: string | null = null): SseMessage => ({
    event: undefined,
    data: JSON.stringify({
      ...base,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    }),
  });
  yield chunk({ role: 'assistant', content: '' });
  // Split by characters (not tokens) so that no chunk ends inside a multi-byte character.
  const chars = Array.from(reply.text);
  const size = Math.max(1, Math.ceil(chars.length / STREAM_CHUNKS));
  for (let i = 0; i < chars.length; i += size) {
    if (call.signal.aborted) return;
    // Let the event loop run between chunks, as a network provider would.
    await new Promise<void>((resolve) => setImmediate(resolve));
    yield chunk({ content: chars.slice(i, i + size).join('') });
  }
  yield chunk({}, reply.finishReason);
  const options = call.body.stream_options as { include_usage?: boolean } | undefined;
  if (options?.include_usage)
    yield { event: undefined, data: JSON.stringify({ ...base, choices: [], usage: reply.usage }) };
  yield { event: undefined, data: '[DONE]' };
}
