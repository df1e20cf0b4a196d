import type { ServerResponse } from 'node:http';
import { newId } from '../core/ids.ts';

/**
 * Server-sent events as OpenAI streams them: `data: <json>\n\n` per chunk, ending with `data: [DONE]`.
 * The headers keep proxies and ingress controllers (nginx's `X-Accel-Buffering`) from buffering.
 */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache, no-transform',
  connection: 'keep-alive',
  'x-accel-buffering': 'no',
} as const;

export const DONE = 'data: [DONE]\n\n';

export function sseEvent(data: string): string {
  return `data: ${data}\n\n`;
}

/** Resolves when the response can take more data, or when the client went away. */
export function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

export interface ChunkMeta {
  id: string;
  created: number;
  model: string;
}

export function chunkMeta(model: string): ChunkMeta {
  return { id: newId('chatcmpl'), created: Math.floor(Date.now() / 1000), model };
}

export function chunkJson(
  meta: ChunkMeta,
  delta: Record<string, unknown>,
  finishReason: string | null = null,
): string {
  return JSON.stringify({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
  });
}

export function usageChunkJson(
  meta: ChunkMeta,
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number },
): string {
  return JSON.stringify({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    choices: [],
    usage,
  });
}

/** A whole assistant message as a complete SSE stream: role, content, stop, optional usage, [DONE]. */
export function messageStream(meta: ChunkMeta, content: string, includeUsage: boolean): string {
  let out =
    sseEvent(chunkJson(meta, { role: 'assistant', content: '' })) +
    sseEvent(chunkJson(meta, { content })) +
    sseEvent(chunkJson(meta, {}, 'stop'));
  if (includeUsage)
    out += sseEvent(usageChunkJson(meta, { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 }));
  return out + DONE;
}
