import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * A real OpenAI-compatible provider on a loopback port, for the chat tests and the proxy benchmark.
 * It answers `POST /v1/chat/completions` with `tokens` pieces of text (each piece ` hello` is exactly one
 * o200k token), cut at the request's `max_tokens`/`max_completion_tokens`, streaming or not, and can
 * report or omit usage, fail, stall and send malformed streams; with `toolCalls` it asks for tool calls
 * (until the conversation carries a `tool` message), with `n` it answers that many choices.
 * `POST /v1/responses` answers a Response (or its event stream) of the same text, cut at
 * `max_output_tokens` (or `function_call` items, with `toolCalls`), and `GET /v1/responses/{id}` returns it again; `POST /v1/embeddings` answers a
 * 3-dimensional vector per input (floats or base64). `POST /v1/messages` speaks Anthropic's Messages API
 * natively (the same text as a `text` block, or `tool_use` blocks with `toolCalls` until the last user
 * turn carries a `tool_result`; usage with `cacheWriteTokens` / `cachedTokens` as cache creation / reads;
 * streaming with Anthropic's events, a `ping` included); it wants `x-api-key` and `anthropic-version`.
 *
 * Behaviour is chosen per upstream model name (`behaviors`), falling back to `defaults`, so tests that
 * run at the same time can use different behaviours through different models.
 */
export interface MockBehavior {
  /** Pieces of completion text to produce (default 5). */
  tokens?: number;
  /** The text of one piece (default ' hello', one token). */
  piece?: string;
  /** Report `usage` (non-streaming) / send the usage chunk when asked (streaming). Default true. */
  usage?: boolean;
  /** prompt_tokens to report (default 12). */
  promptTokens?: number;
  /**
   * Output tokens to report (chat `completion_tokens`, Responses `output_tokens`) instead of the pieces
   * produced — a provider whose tokenizer counts more than o200k does.
   */
  completionTokens?: number;
  /** Keep producing past max_tokens (a misbehaving provider). */
  ignoreMaxTokens?: boolean;
  /** Delay between streamed chunks. */
  chunkDelayMs?: number;
  /** Answer with this status and an OpenAI-shaped error. */
  failStatus?: number;
  /** With failStatus (chat): send this `Retry-After` header. */
  retryAfter?: string;
  /** Never answer (the proxy's response time-out must fire). */
  stall?: boolean;
  /** Streaming: send this many content chunks, then stall. */
  stallAfterChunks?: number;
  /** Streaming: send an event that is not JSON after the first chunk; non-streaming: a body that is not JSON. */
  malformed?: boolean;
  /** Streaming: end the body after this many content chunks without finish_reason or [DONE]. */
  truncateAfterChunks?: number;
  /**
   * Chat: answer with these tool calls (content null) unless the last message is a `tool` answer.
   * Responses: answer with these `function_call` items unless the input carries a `function_call_output`.
   */
  toolCalls?: Array<{ name: string; arguments: string }>;
  /** Cached input tokens to report (usage details). */
  cachedTokens?: number;
  /** Reasoning tokens to report (part of the output tokens). */
  reasoningTokens?: number;
  /** Answer 404 to /responses (a provider without the Responses API). */
  noResponses?: boolean;
  /** Messages: cache_creation_input_tokens to report. */
  cacheWriteTokens?: number;
}

export interface ReceivedRequest {
  body: any;
  headers: http.IncomingHttpHeaders;
}

export interface MockUpstream {
  /** e.g. http://127.0.0.1:41234/v1 — the base URL to configure as the project's upstream. */
  baseUrl: string;
  defaults: MockBehavior;
  behaviors: Map<string, MockBehavior>;
  requests: ReceivedRequest[];
  /** Requests whose connection closed before the mock finished answering. */
  aborted: number;
  /** Requests being answered right now. */
  inFlight: number;
  close(): Promise<void>;
}

export async function startMockUpstream(
  options: { port?: number; record?: boolean; defaults?: MockBehavior } = {},
): Promise<MockUpstream> {
  const record = options.record ?? true;
  const sockets = new Set<Socket>();
  const mock: MockUpstream = {
    baseUrl: '',
    defaults: options.defaults ?? {},
    behaviors: new Map(),
    requests: [],
    aborted: 0,
    inFlight: 0,
    close: async () => {},
  };

  const responses = new Map<string, unknown>();
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && (req.url ?? '').split('?')[0]!.endsWith('/models')) {
      // The model list a provider check (the admin API's live call) reads; the key must be present.
      // (Anthropic's API lists its models too, with the key in x-api-key.)
      const ok = /^Bearer \S+/.test(req.headers.authorization ?? '') || Boolean(req.headers['x-api-key']);
      res.writeHead(ok ? 200 : 401, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify(
          ok
            ? { object: 'list', data: [{ id: 'mock-model', object: 'model' }] }
            : { error: { message: 'no key', type: 'invalid_request_error' } },
        ),
      );
      return;
    }
    const route = routeOf(req.method, req.url ?? '');
    if (route === 'retrieve') {
      const id = decodeURIComponent((req.url ?? '').split('/responses/')[1]!.split(/[/?]/)[0]!);
      const stored = responses.get(id);
      res.writeHead(stored ? 200 : 404, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify(stored ?? { error: { message: `No response ${id}`, type: 'invalid_request_error' } }),
      );
      return;
    }
    if (!route) {
      notFound(res);
      return;
    }
    const parts: Buffer[] = [];
    req.on('data', (chunk: Buffer) => parts.push(chunk));
    req.on('end', () => {
      let body: any;
      try {
        body = JSON.parse(Buffer.concat(parts).toString('utf8'));
      } catch {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'invalid JSON', type: 'invalid_request_error' } }));
        return;
      }
      if (record) mock.requests.push({ body, headers: req.headers });
      mock.inFlight++;
      let finished = false;
      res.on('close', () => {
        mock.inFlight--;
        if (!finished && !res.writableFinished) mock.aborted++;
      });
      const behavior = { ...mock.defaults, ...mock.behaviors.get(String(body.model)) };
      const answering =
        route === 'chat'
          ? answer(body, behavior, res)
          : route === 'messages'
            ? answerMessages(body, behavior, req.headers, res)
            : route === 'responses'
              ? answerResponse(body, behavior, res, responses)
              : answerEmbeddings(body, behavior, res);
      answering.then(
        () => {
          finished = true;
        },
        () => {},
      );
    });
  });
  server.keepAliveTimeout = 60_000;
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  mock.baseUrl = `http://127.0.0.1:${port}/v1`;
  mock.close = async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return mock;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function answer(body: any, b: MockBehavior, res: http.ServerResponse): Promise<void> {
  // never answers; the socket is closed by the client or by close()
  if (b.stall) return new Promise((resolve) => res.on('close', resolve));
  if (b.failStatus) {
    res.writeHead(b.failStatus, {
      'content-type': 'application/json',
      ...(b.retryAfter ? { 'retry-after': b.retryAfter } : {}),
    });
    res.end(
      JSON.stringify({
        error: { message: `mock failure ${b.failStatus}`, type: 'server_error', code: 'mock' },
      }),
    );
    return;
  }
  const limit = body.max_completion_tokens ?? body.max_tokens;
  let count = b.tokens ?? 5;
  let finishReason = 'stop';
  if (!b.ignoreMaxTokens && typeof limit === 'number' && count > limit) {
    count = limit;
    finishReason = 'length';
  }
  const piece = b.piece ?? ' hello';
  const promptTokens = b.promptTokens ?? 12;
  const n = typeof body.n === 'number' ? body.n : 1;
  const lastRole = Array.isArray(body.messages) ? body.messages.at(-1)?.role : undefined;
  const toolCalls = b.toolCalls && lastRole !== 'tool' ? b.toolCalls : undefined;
  const usage = {
    prompt_tokens: promptTokens,
    completion_tokens: b.completionTokens ?? count * n,
    total_tokens: promptTokens + (b.completionTokens ?? count * n),
    ...details(b),
  };
  const id = `chatcmpl-mock${Math.random().toString(36).slice(2, 10)}`;
  const created = Math.floor(Date.now() / 1000);
  const model = body.model;

  if (!body.stream) {
    if (b.malformed) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"id": "broken", "choices": [');
      return;
    }
    const completion = {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: Array.from({ length: n }, (_, index) => ({
        index,
        message: toolCalls
          ? {
              role: 'assistant',
              content: null,
              refusal: null,
              tool_calls: toolCalls.map((call, i) => ({
                id: `call_${i}`,
                type: 'function',
                function: call,
              })),
            }
          : { role: 'assistant', content: piece.repeat(count), refusal: null },
        logprobs: null,
        finish_reason: toolCalls ? 'tool_calls' : finishReason,
      })),
      ...(b.usage === false ? {} : { usage }),
    };
    const text = JSON.stringify(completion);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
    return;
  }

  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const send = (payload: unknown) => res.write(`data: ${JSON.stringify(payload)}\n\n`);
  const chunk = (delta: Record<string, unknown>, finish: string | null = null, index = 0) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index, delta, logprobs: null, finish_reason: finish }],
  });
  for (let index = 0; index < (toolCalls ? 1 : n); index++)
    send(chunk({ role: 'assistant', content: toolCalls ? null : '' }, null, index));
  if (toolCalls) {
    // Each call: its id and name first, then its arguments 4 characters at a time.
    for (const [index, call] of toolCalls.entries()) {
      send(
        chunk({
          tool_calls: [
            { index, id: `call_${index}`, type: 'function', function: { name: call.name, arguments: '' } },
          ],
        }),
      );
      for (let at = 0; at < call.arguments.length; at += 4) {
        if (res.destroyed) return;
        if (b.chunkDelayMs) await sleep(b.chunkDelayMs);
        send(chunk({ tool_calls: [{ index, function: { arguments: call.arguments.slice(at, at + 4) } }] }));
      }
    }
    send(chunk({}, 'tool_calls'));
    if (body.stream_options?.include_usage && b.usage !== false) {
      send({ id, object: 'chat.completion.chunk', created, model, choices: [], usage });
    }
    res.end('data: [DONE]\n\n');
    return;
  }
  for (let i = 0; i < count; i++) {
    if (res.destroyed) return;
    if (b.chunkDelayMs) await sleep(b.chunkDelayMs);
    if (res.destroyed) return;
    if (b.stallAfterChunks !== undefined && i === b.stallAfterChunks) {
      return new Promise((resolve) => res.on('close', resolve));
    }
    if (b.truncateAfterChunks !== undefined && i === b.truncateAfterChunks) {
      res.end();
      return;
    }
    for (let index = 0; index < n; index++) send(chunk({ content: piece }, null, index));
    if (b.malformed && i === 0) res.write('data: {"choices": [oops\n\n');
  }
  for (let index = 0; index < n; index++) send(chunk({}, finishReason, index));
  if (body.stream_options?.include_usage && b.usage !== false) {
    send({ id, object: 'chat.completion.chunk', created, model, choices: [], usage });
  }
  res.end('data: [DONE]\n\n');
}

type Route = 'chat' | 'responses' | 'retrieve' | 'embeddings' | 'messages' | undefined;

function routeOf(method: string | undefined, url: string): Route {
  const path = url.split('?')[0]!;
  if (method === 'POST' && path.endsWith('/chat/completions')) return 'chat';
  if (method === 'POST' && path.endsWith('/responses')) return 'responses';
  if (method === 'GET' && path.includes('/responses/')) return 'retrieve';
  if (method === 'POST' && path.endsWith('/embeddings')) return 'embeddings';
  if (method === 'POST' && path.endsWith('/v1/messages')) return 'messages';
  return undefined;
}

function notFound(res: http.ServerResponse): void {
  res.writeHead(404, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message: 'not found', type: 'invalid_request_error' } }));
}

function details(b: MockBehavior) {
  return {
    ...(b.cachedTokens !== undefined ? { prompt_tokens_details: { cached_tokens: b.cachedTokens } } : {}),
    ...(b.reasoningTokens !== undefined
      ? { completion_tokens_details: { reasoning_tokens: b.reasoningTokens } }
      : {}),
  };
}

/** `POST /responses`: a Response of `tokens` pieces, or its event stream. */
async function answerResponse(
  body: any,
  b: MockBehavior,
  res: http.ServerResponse,
  store: Map<string, unknown>,
): Promise<void> {
  if (b.noResponses) return notFound(res);
  if (b.failStatus) {
    res.writeHead(b.failStatus, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `mock failure ${b.failStatus}`, type: 'server_error' } }));
    return;
  }
  const limit = body.max_output_tokens;
  let count = b.tokens ?? 5;
  let status = 'completed';
  if (typeof limit === 'number' && count > limit) {
    count = limit;
    status = 'incomplete';
  }
  const piece = b.piece ?? ' hello';
  const promptTokens = b.promptTokens ?? 12;
  const id = `resp_mock${Math.random().toString(36).slice(2, 10)}`;
  const messageId = `msg_mock${Math.random().toString(36).slice(2, 10)}`;
  const text = piece.repeat(count);
  const part = { type: 'output_text', text, annotations: [], logprobs: [] };
  const message = { type: 'message', id: messageId, status: 'completed', role: 'assistant', content: [part] };
  const answered =
    Array.isArray(body.input) && body.input.some((item: any) => item?.type === 'function_call_output');
  const calls = b.toolCalls && !answered ? b.toolCalls : undefined;
  const callItems = (calls ?? []).map((call, i) => ({
    type: 'function_call',
    id: `fc_mock${i}`,
    call_id: `call_${i}`,
    name: call.name,
    arguments: call.arguments,
    status: 'completed',
  }));
  const usage = {
    input_tokens: promptTokens,
    input_tokens_details: { cached_tokens: b.cachedTokens ?? 0 },
    output_tokens: b.completionTokens ?? count,
    output_tokens_details: { reasoning_tokens: b.reasoningTokens ?? 0 },
    total_tokens: promptTokens + (b.completionTokens ?? count),
  };
  const response = {
    id,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status,
    error: null,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    model: body.model,
    output: calls ? callItems : [message],
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    ...(body.conversation
      ? {
          conversation: {
            id: typeof body.conversation === 'string' ? body.conversation : body.conversation.id,
          },
        }
      : {}),
    ...(b.usage === false ? {} : { usage }),
  };
  store.set(id, response);
  if (!body.stream) {
    const json = JSON.stringify(response);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
    res.end(json);
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let seq = 0;
  const send = (event: Record<string, unknown>) =>
    res.write(`event: ${event.type}\ndata: ${JSON.stringify({ ...event, sequence_number: seq++ })}\n\n`);
  const item = { item_id: messageId, output_index: 0, content_index: 0 };
  send({
    type: 'response.created',
    response: { ...response, status: 'in_progress', output: [], usage: null },
  });
  if (calls) {
    // Each call: the item with empty arguments, the arguments 4 characters at a time, the item done.
    for (const [index, call] of callItems.entries()) {
      send({
        type: 'response.output_item.added',
        output_index: index,
        item: { ...call, arguments: '', status: 'in_progress' },
      });
      for (let at = 0; at < call.arguments.length; at += 4) {
        if (res.destroyed) return;
        if (b.chunkDelayMs) await sleep(b.chunkDelayMs);
        send({
          type: 'response.function_call_arguments.delta',
          item_id: call.id,
          output_index: index,
          delta: call.arguments.slice(at, at + 4),
        });
      }
      send({
        type: 'response.function_call_arguments.done',
        item_id: call.id,
        output_index: index,
        arguments: call.arguments,
      });
      send({ type: 'response.output_item.done', output_index: index, item: call });
    }
    send({ type: 'response.completed', response });
    res.end();
    return;
  }
  send({
    type: 'response.output_item.added',
    output_index: 0,
    item: { ...message, status: 'in_progress', content: [] },
  });
  send({ type: 'response.content_part.added', ...item, part: { ...part, text: '' } });
  for (let i = 0; i < count; i++) {
    if (res.destroyed) return;
    if (b.chunkDelayMs) await sleep(b.chunkDelayMs);
    send({ type: 'response.output_text.delta', ...item, delta: piece, logprobs: [] });
  }
  send({ type: 'response.output_text.done', ...item, text, logprobs: [] });
  send({ type: 'response.content_part.done', ...item, part });
  send({ type: 'response.output_item.done', output_index: 0, item: message });
  send({ type: status === 'completed' ? 'response.completed' : 'response.incomplete', response });
  res.end();
}

/** `POST /embeddings`: the vector [0.25, 0.5, 0.75] per input, as floats or base64 float32. */
async function answerEmbeddings(body: any, b: MockBehavior, res: http.ServerResponse): Promise<void> {
  if (b.failStatus) {
    res.writeHead(b.failStatus, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `mock failure ${b.failStatus}`, type: 'server_error' } }));
    return;
  }
  const inputs =
    typeof body.input === 'string' || typeof body.input?.[0] === 'number' ? [body.input] : body.input;
  const vector = [0.25, 0.5, 0.75];
  const embedding =
    body.encoding_format === 'base64'
      ? Buffer.from(new Float32Array(vector).buffer).toString('base64')
      : vector;
  const promptTokens = b.promptTokens ?? 12;
  const json = JSON.stringify({
    object: 'list',
    data: inputs.map((_: unknown, index: number) => ({ object: 'embedding', index, embedding })),
    model: body.model,
    ...(b.usage === false ? {} : { usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } }),
  });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}

/** `POST /v1/messages`: Anthropic's Messages API (a message of `tokens` pieces, or its event stream). */
async function answerMessages(
  body: any,
  b: MockBehavior,
  headers: http.IncomingHttpHeaders,
  res: http.ServerResponse,
): Promise<void> {
  const fail = (status: number, type: string, message: string) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ type: 'error', error: { type, message } }));
  };
  if (!headers['x-api-key']) return fail(401, 'authentication_error', 'x-api-key header is required');
  if (!headers['anthropic-version'])
    return fail(400, 'invalid_request_error', 'anthropic-version is required');
  if (b.stall) return new Promise((resolve) => res.on('close', resolve));
  if (b.failStatus) return fail(b.failStatus, 'api_error', `mock failure ${b.failStatus}`);
  const limit = body.max_tokens;
  let count = b.tokens ?? 5;
  let stopReason = 'end_turn';
  if (typeof limit === 'number' && count > limit) {
    count = limit;
    stopReason = 'max_tokens';
  }
  const piece = b.piece ?? ' hello';
  const last = Array.isArray(body.messages) ? body.messages.at(-1) : undefined;
  const answered =
    Array.isArray(last?.content) && last.content.some((block: any) => block?.type === 'tool_result');
  const calls = b.toolCalls && !answered ? b.toolCalls : undefined;
  const usage = {
    input_tokens: b.promptTokens ?? 12,
    cache_creation_input_tokens: b.cacheWriteTokens ?? 0,
    cache_read_input_tokens: b.cachedTokens ?? 0,
    output_tokens: count,
  };
  const toolBlocks = (calls ?? []).map((call, i) => ({
    type: 'tool_use',
    id: `toolu_mock${i}`,
    name: call.name,
    input: JSON.parse(call.arguments),
  }));
  const message = {
    id: `msg_mock${Math.random().toString(36).slice(2, 10)}`,
    type: 'message',
    role: 'assistant',
    model: body.model,
    content: calls ? toolBlocks : [{ type: 'text', text: piece.repeat(count) }],
    stop_reason: calls ? 'tool_use' : stopReason,
    stop_sequence: null,
    usage,
  };
  if (!body.stream) {
    const json = JSON.stringify(message);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
    res.end(json);
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const send = (event: Record<string, unknown>) =>
    res.write(`event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`);
  send({
    type: 'message_start',
    message: { ...message, content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } },
  });
  send({ type: 'ping' });
  if (calls) {
    for (const [index, block] of toolBlocks.entries()) {
      send({ type: 'content_block_start', index, content_block: { ...block, input: {} } });
      const json = JSON.stringify(block.input);
      for (let at = 0; at < json.length; at += 4) {
        if (res.destroyed) return;
        send({
          type: 'content_block_delta',
          index,
          delta: { type: 'input_json_delta', partial_json: json.slice(at, at + 4) },
        });
      }
      send({ type: 'content_block_stop', index });
    }
  } else {
    send({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
    for (let i = 0; i < count; i++) {
      if (res.destroyed) return;
      if (b.chunkDelayMs) await sleep(b.chunkDelayMs);
      if (b.truncateAfterChunks !== undefined && i === b.truncateAfterChunks) {
        res.end();
        return;
      }
      send({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: piece } });
    }
    send({ type: 'content_block_stop', index: 0 });
  }
  send({
    type: 'message_delta',
    delta: { stop_reason: message.stop_reason, stop_sequence: null },
    usage: { output_tokens: count },
  });
  send({ type: 'message_stop' });
  res.end();
}
