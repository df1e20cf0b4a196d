import type http from 'node:http';
import { type Handler, json } from './scripted-provider.ts';

/**
 * Scripted answers that make a coding agent run a tool loop through Tollgate (for
 * scripted-provider.ts): the provider's first answer asks for a tool call the agent runs on its own
 * machine; once the tool's result is in the conversation, it answers with a final text that quotes what
 * the tool returned — so the agent's output shows the tool really ran. Every answer reports the usage a
 * test gives, which is what Tollgate charges. Anthropic's Messages API (native provider, for Claude
 * Code) and OpenAI's Responses API (for Codex), streamed as the agents ask.
 */
export interface ScriptedUsage {
  input: number;
  output: number;
}

export interface ToolLoopScript {
  /** The tool the first answer calls, and its arguments. */
  tool: string;
  input: Record<string, unknown>;
  /** The final text, given everything the tool returned. */
  final: (toolResult: string) => string;
  /** The usage reported by the tool-call answer and by the final one. */
  usage: { call: ScriptedUsage; final: ScriptedUsage };
  /** Every request body the provider received, in order. */
  requests: any[];
}

export function toolLoopScript(script: Omit<ToolLoopScript, 'requests'>): ToolLoopScript {
  return { ...script, requests: [] };
}

/** The text of the tool results in a Messages conversation (`tool_result` blocks of user turns). */
function anthropicToolResults(body: any): string | undefined {
  const results: string[] = [];
  for (const message of body.messages ?? []) {
    if (!Array.isArray(message.content)) continue;
    for (const block of message.content) {
      if (block.type !== 'tool_result') continue;
      if (typeof block.content === 'string') results.push(block.content);
      else for (const part of block.content ?? []) if (part.type === 'text') results.push(part.text);
    }
  }
  return results.length ? results.join('\n') : undefined;
}

function sseEvent(res: http.ServerResponse, name: string, data: unknown): void {
  res.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
}

/** An Anthropic-compatible provider's `/v1/messages` for one upstream model, running `script`. */
export function anthropicToolLoop(script: ToolLoopScript): Handler {
  let n = 0;
  return (body, res) => {
    script.requests.push(body);
    n++;
    const result = anthropicToolResults(body);
    const usage = result === undefined ? script.usage.call : script.usage.final;
    const content: Array<{ type: string; id?: string; name?: string; input?: unknown; text?: string }> =
      result === undefined
        ? [{ type: 'tool_use', id: `toolu_${n}`, name: script.tool, input: script.input }]
        : [{ type: 'text', text: script.final(result) }];
    const stopReason = result === undefined ? 'tool_use' : 'end_turn';
    const message = {
      id: `msg_scripted_${n}`,
      type: 'message',
      role: 'assistant',
      model: body.model,
      stop_sequence: null,
    };
    if (!body.stream) {
      json(res, {
        ...message,
        content,
        stop_reason: stopReason,
        usage: { input_tokens: usage.input, output_tokens: usage.output },
      });
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    sseEvent(res, 'message_start', {
      type: 'message_start',
      message: {
        ...message,
        content: [],
        stop_reason: null,
        usage: { input_tokens: usage.input, output_tokens: 1 },
      },
    });
    content.forEach((block, index) => {
      if (block.type === 'tool_use') {
        sseEvent(res, 'content_block_start', {
          type: 'content_block_start',
          index,
          content_block: { ...block, input: {} },
        });
        sseEvent(res, 'content_block_delta', {
          type: 'content_block_delta',
          index,
          delta: { type: 'input_json_delta', partial_json: JSON.stringify(block.input) },
        });
      } else {
        sseEvent(res, 'content_block_start', {
          type: 'content_block_start',
          index,
          content_block: { type: 'text', text: '' },
        });
        sseEvent(res, 'content_block_delta', {
          type: 'content_block_delta',
          index,
          delta: { type: 'text_delta', text: block.text ?? '' },
        });
      }
      sseEvent(res, 'content_block_stop', { type: 'content_block_stop', index });
    });
    sseEvent(res, 'message_delta', {
      type: 'message_delta',
      delta: { stop_reason: stopReason, stop_sequence: null },
      usage: { output_tokens: usage.output },
    });
    sseEvent(res, 'message_stop', { type: 'message_stop' });
    res.end();
  };
}

/** The outputs of function calls in a Responses `input` (`function_call_output` items). */
function responsesToolResults(body: any): string | undefined {
  if (!Array.isArray(body.input)) return undefined;
  const results: string[] = [];
  for (const item of body.input) {
    if (item.type !== 'function_call_output') continue;
    if (typeof item.output === 'string') results.push(item.output);
    else for (const part of item.output ?? []) if (typeof part.text === 'string') results.push(part.text);
  }
  return results.length ? results.join('\n') : undefined;
}

/** An OpenAI-compatible provider's `/v1/responses` for one upstream model, running `script` (streamed). */
export function responsesToolLoop(script: ToolLoopScript): Handler {
  let n = 0;
  return (body, res) => {
    script.requests.push(body);
    n++;
    const result = responsesToolResults(body);
    const usage = result === undefined ? script.usage.call : script.usage.final;
    const item =
      result === undefined
        ? {
            type: 'function_call',
            id: `fc_scripted_${n}`,
            call_id: `call_scripted_${n}`,
            name: script.tool,
            arguments: JSON.stringify(script.input),
            status: 'completed',
          }
        : {
            type: 'message',
            id: `msg_scripted_${n}`,
            role: 'assistant',
            status: 'completed',
            content: [{ type: 'output_text', text: script.final(result), annotations: [] }],
          };
    const response = {
      id: `resp_scripted_${n}`,
      object: 'response',
      created_at: Math.floor(Date.now() / 1000),
      model: body.model,
      output: [] as unknown[],
      status: 'in_progress',
    };
    const completed = {
      ...response,
      status: 'completed',
      output: [item],
      usage: {
        input_tokens: usage.input,
        input_tokens_details: { cached_tokens: 0 },
        output_tokens: usage.output,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: usage.input + usage.output,
      },
    };
    if (!body.stream) {
      json(res, completed);
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    let seq = 0;
    const event = (data: Record<string, unknown>) =>
      sseEvent(res, String(data.type), { ...data, sequence_number: seq++ });
    event({ type: 'response.created', response });
    event({ type: 'response.in_progress', response });
    event({ type: 'response.output_item.added', output_index: 0, item: { ...item, status: 'in_progress' } });
    if (item.type === 'function_call') {
      event({
        type: 'response.function_call_arguments.delta',
        item_id: item.id,
        output_index: 0,
        delta: item.arguments,
      });
      event({
        type: 'response.function_call_arguments.done',
        item_id: item.id,
        output_index: 0,
        arguments: item.arguments,
      });
    } else {
      const text = (item.content as Array<{ text: string }>)[0]!.text;
      event({
        type: 'response.output_text.delta',
        item_id: item.id,
        output_index: 0,
        content_index: 0,
        delta: text,
      });
      event({
        type: 'response.output_text.done',
        item_id: item.id,
        output_index: 0,
        content_index: 0,
        text,
      });
    }
    event({ type: 'response.output_item.done', output_index: 0, item });
    event({ type: 'response.completed', response: completed });
    res.end();
  };
}
