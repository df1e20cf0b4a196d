import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * A real OpenAI-compatible provider on a loopback port, for the chat tests and the proxy benchmark.
 * It answers `POST /v1/chat/completions` with `tokens` pieces of text (each piece ` hello` is exactly one
 * o200k token), cut at the request's `max_tokens`/`max_completion_tokens`, streaming or not, and can
 * report or omit usage, fail, stall and send malformed streams.
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
  /** Keep producing past max_tokens (a misbehaving provider). */
  ignoreMaxTokens?: boolean;
  /** Delay between streamed chunks. */
  chunkDelayMs?: number;
  /** Answer with this status and an OpenAI-shaped error. */
  failStatus?: number;
  /** Never answer (the proxy's response time-out must fire). */
  stall?: boolean;
  /** Streaming: send this many content chunks, then stall. */
  stallAfterChunks?: number;
  /** Streaming: send an event that is not JSON after the first chunk; non-streaming: a body that is not JSON. */
  malformed?: boolean;
  /** Streaming: end the body after this many content chunks without finish_reason or [DONE]. */
  truncateAfterChunks?: number;
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

  const server = http.createServer((req, res) => {
    if (req.method !== 'POST' || !req.url?.endsWith('/chat/completions')) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'not found', type: 'invalid_request_error' } }));
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
      answer(body, behavior, res).then(
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
    res.writeHead(b.failStatus, { 'content-type': 'application/json' });
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
  const usage = { prompt_tokens: promptTokens, completion_tokens: count, total_tokens: promptTokens + count };
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
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: piece.repeat(count), refusal: null },
          logprobs: null,
          finish_reason: finishReason,
        },
      ],
      ...(b.usage === false ? {} : { usage }),
    };
    const text = JSON.stringify(completion);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
    return;
  }

  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const send = (payload: unknown) => res.write(`data: ${JSON.stringify(payload)}\n\n`);
  const chunk = (delta: Record<string, unknown>, finish: string | null = null) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  });
  send(chunk({ role: 'assistant', content: '' }));
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
    send(chunk({ content: piece }));
    if (b.malformed && i === 0) res.write('data: {"choices": [oops\n\n');
  }
  send(chunk({}, finishReason));
  if (body.stream_options?.include_usage && b.usage !== false) {
    send({ id, object: 'chat.completion.chunk', created, model, choices: [], usage });
  }
  res.end('data: [DONE]\n\n');
}
