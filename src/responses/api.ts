import type { AnswerIds, MeteredApi, ReportedUsage, StreamReader, StreamStep } from '../metering/api.ts';
import { reportedUsage } from '../metering/api.ts';
import { sseEvent } from '../metering/relay.ts';
import { type LinkReply, paywallField } from '../paywall/replies.ts';
import { countText } from '../tokens/count.ts';
import { countResponsesInput } from '../tokens/inputs.ts';
import { textResponse } from '../upstream/text-response.ts';
import { type SseMessage, streamError, streamEventJson, UpstreamError } from '../upstream/types.ts';
import { outputWithReasoning } from '../upstream/usage.ts';
import { type ResponsesRequest, responsesRequestSchema } from './schema.ts';

/**
 * `POST /v1/responses` (OpenAI's Responses API) as a metered API. The request is forwarded as received
 * with the provider's model name and `max_output_tokens` (the bound the hold pays for). A request
 * continuing a chain (`previous_response_id`, `conversation`) is held with the chain's recorded size
 * (src/metering/chains.ts); the answer's `id` (and `conversation.id`) are read for that record. Usage is read
 * from `usage` (`input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`,
 * `output_tokens_details.reasoning_tokens`) of the response, or of the stream's final
 * `response.completed` / `response.incomplete` / `response.failed` event. Stream events pass through
 * untouched, with their `event:` names.
 */
interface ResponsesUsage {
  input_tokens?: number;
  output_tokens?: number;
  total_tokens?: number;
  input_tokens_details?: { cached_tokens?: number | null } | null;
  output_tokens_details?: { reasoning_tokens?: number | null } | null;
}

/**
 * Responses usage in Tollgate's terms; reasoning tokens beside `output_tokens` (total = input + output
 * + reasoning) are added to the output, as for chat (src/upstream/usage.ts).
 */
export function responsesUsage(usage: ResponsesUsage | null | undefined): ReportedUsage | undefined {
  if (!usage) return undefined;
  const reasoning = usage.output_tokens_details?.reasoning_tokens;
  return reportedUsage({
    input: usage.input_tokens,
    output: outputWithReasoning(usage.input_tokens, usage.output_tokens, reasoning, usage.total_tokens),
    cachedInput: usage.input_tokens_details?.cached_tokens,
    reasoning,
  });
}

/** Statuses of a Response the provider is still working on. */
const WORKING = new Set(['queued', 'in_progress']);

/**
 * The id of a `background` Response the provider is still working on (its output, and usage, come
 * later through `GET /v1/responses/{id}`): the request is charged its hold until then
 * (./background.ts).
 */
export function backgroundPending(json: Record<string, unknown>): string | undefined {
  if (json.background !== true || typeof json.id !== 'string') return undefined;
  return typeof json.status === 'string' && WORKING.has(json.status) ? json.id : undefined;
}

/** A Response's usage in Tollgate's terms, from the Response itself (for background settles). */
export function usageOfResponse(json: Record<string, unknown>): ReportedUsage | undefined {
  return responsesUsage(json.usage as ResponsesUsage | null | undefined);
}

/** Text a response produced: output text, refusals, function call arguments, reasoning summaries. */
export function outputText(output: unknown): string {
  if (!Array.isArray(output)) return '';
  let text = '';
  for (const item of output as Array<Record<string, unknown>>) {
    if (typeof item.arguments === 'string') text += `${item.name ?? ''}${item.arguments}`;
    for (const list of [item.content, item.summary]) {
      if (!Array.isArray(list)) continue;
      for (const part of list as Array<Record<string, unknown>>) {
        if (typeof part.text === 'string') text += part.text;
        if (typeof part.refusal === 'string') text += part.refusal;
      }
    }
  }
  return text;
}

export const responsesApi: MeteredApi<ResponsesRequest> = {
  name: 'responses',
  title: 'Responses',
  upstreamPath: '/responses',
  schema: responsesRequestSchema,
  countInput: countResponsesInput,
  requestedBound: (body) => body.max_output_tokens ?? undefined,
  choices: () => 1,
  chain: (body) => {
    const conversation = typeof body.conversation === 'string' ? body.conversation : body.conversation?.id;
    if (!body.previous_response_id && !conversation) return undefined;
    return { previousResponseId: body.previous_response_id ?? undefined, conversationId: conversation };
  },

  upstreamBody(body, model, bound) {
    const out: Record<string, unknown> = { ...body, model: model.upstream_model };
    // The one bound held; Chat's names (which some compatible servers read here too) are not forwarded.
    delete out.max_tokens;
    delete out.max_completion_tokens;
    if (bound !== undefined) out.max_output_tokens = bound;
    return out;
  },

  read(json) {
    if (!Array.isArray(json.output)) {
      throw new UpstreamError('malformed', 'The provider returned a response without `output`.');
    }
    const usage = responsesUsage(json.usage as ResponsesUsage | null | undefined);
    return {
      usage,
      ids: answerIds(json),
      produced: usage?.output === undefined ? countText(outputText(json.output)) : 0,
      finishReason: typeof json.status === 'string' ? json.status : null,
      pending: backgroundPending(json),
    };
  },

  refusal(link, x) {
    const response = linkResponse(link, x.model.id);
    if (!x.stream) return { kind: 'json', status: 200, body: response };
    return { kind: 'stream', body: linkResponseStream(response, link.message) };
  },

  streamReader: () => new ResponsesStreamReader(),
};

/** The provider's response id and conversation id of a Response object. */
function answerIds(response: { id?: unknown; conversation?: unknown } | undefined): AnswerIds | undefined {
  if (typeof response?.id !== 'string' || !response.id) return undefined;
  const conversation = response.conversation as { id?: unknown } | string | null | undefined;
  const conversationId = typeof conversation === 'string' ? conversation : conversation?.id;
  return {
    responseId: response.id,
    ...(typeof conversationId === 'string' && conversationId ? { conversationId } : {}),
  };
}

/** Stream events that carry produced text in `delta`. */
const DELTA_EVENTS = new Set([
  'response.output_text.delta',
  'response.refusal.delta',
  'response.function_call_arguments.delta',
  'response.reasoning_summary_text.delta',
  'response.reasoning_text.delta',
  'response.custom_tool_call_input.delta',
]);
const FINAL_EVENTS = new Set(['response.completed', 'response.incomplete', 'response.failed']);

/**
 * A Responses stream ends with the provider's final event; it is relayed whole (Responses events cannot
 * be cut into a valid stream, so the bound is enforced by `max_output_tokens` and the hold's cap).
 */
class ResponsesStreamReader implements StreamReader {
  readonly canCut = false;
  usage: ReportedUsage | undefined;
  finishReason: string | null = null;
  finished = false;
  ids: AnswerIds | undefined;
  /** The Response of a `background` stream: it goes on at the provider if the stream breaks off. */
  #background: string | undefined;

  get pending(): string | undefined {
    return this.finished ? undefined : this.#background;
  }

  next(message: SseMessage): StreamStep {
    if (message.data === '[DONE]') {
      this.finished ||= this.finishReason !== null;
      return { action: 'end' };
    }
    const event = streamEventJson<{
      type?: unknown;
      delta?: unknown;
      response?: {
        id?: unknown;
        conversation?: unknown;
        status?: unknown;
        background?: unknown;
        usage?: ResponsesUsage;
      };
    }>(message.data);
    const type = typeof event.type === 'string' ? event.type : message.event;
    if (event.response) this.ids = answerIds(event.response) ?? this.ids;
    if (type === 'response.created' && event.response?.background === true) {
      this.#background = typeof event.response.id === 'string' ? event.response.id : undefined;
    }
    if (type === 'error') {
      throw streamError(message.data);
    }
    if (type && FINAL_EVENTS.has(type)) {
      this.finished = true;
      this.finishReason = typeof event.response?.status === 'string' ? event.response.status : type;
      this.usage = responsesUsage(event.response?.usage);
      return { action: 'forward', tokens: 0 };
    }
    const tokens =
      type && DELTA_EVENTS.has(type) && typeof event.delta === 'string' ? countText(event.delta) : 0;
    return { action: 'forward', tokens };
  }

  tail(): string {
    return '';
  }
}

/** A completed Response whose output is one assistant message carrying the link (plus `paywall`). */
export function linkResponse(link: LinkReply, model: string) {
  return {
    ...textResponse({ model, text: link.message, tokens: { input: 0, output: 0 }, reasoning: true }),
    paywall: paywallField(link),
  };
}

/**
 * The same Response as the Responses event stream: `response.created`, `response.in_progress`, the
 * message item and its text part added, `response.output_text.delta` (the whole text), the text, part
 * and item done, `response.completed`.
 */
export function linkResponseStream(response: ReturnType<typeof linkResponse>, text: string): string {
  const message = response.output[0]!;
  const part = message.content[0]!;
  const inProgress = { ...response, status: 'in_progress', output: [] };
  const item = { item_id: message.id, output_index: 0, content_index: 0 };
  const events: Array<Record<string, unknown>> = [
    { type: 'response.created', response: inProgress },
    { type: 'response.in_progress', response: inProgress },
    {
      type: 'response.output_item.added',
      output_index: 0,
      item: { ...message, status: 'in_progress', content: [] },
    },
    { type: 'response.content_part.added', ...item, part: { ...part, text: '' } },
    { type: 'response.output_text.delta', ...item, delta: text, logprobs: [] },
    { type: 'response.output_text.done', ...item, text, logprobs: [] },
    { type: 'response.content_part.done', ...item, part },
    { type: 'response.output_item.done', output_index: 0, item: message },
    { type: 'response.completed', response },
  ];
  return events
    .map((event, i) => sseEvent(JSON.stringify({ ...event, sequence_number: i }), String(event.type)))
    .join('');
}
