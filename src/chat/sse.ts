import { newId } from '../core/ids.ts';
import { DONE, sseEvent } from '../metering/relay.ts';

/** Chat completion chunks as OpenAI streams them (`chat.completion.chunk`), for replies Tollgate writes. */

export interface ChunkMeta {
  id: string;
  created: number;
  model: string;
}

export function chunkMeta(model: string): ChunkMeta {
  return { id: newId('chatcmpl'), created: Math.floor(Date.now() / 1000), model };
}

/** A chunk with the meta's id, created and model, then `fields` (`choices`, `usage`). */
function chunkWith(meta: ChunkMeta, fields: Record<string, unknown>): string {
  return JSON.stringify({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    ...fields,
  });
}

export function chunkJson(
  meta: ChunkMeta,
  delta: Record<string, unknown>,
  finishReason: string | null = null,
  index = 0,
): string {
  return chunkWith(meta, { choices: [{ index, delta, logprobs: null, finish_reason: finishReason }] });
}

export function usageChunkJson(
  meta: ChunkMeta,
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number },
): string {
  return chunkWith(meta, { choices: [], usage });
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
