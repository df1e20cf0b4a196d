import type { ServerResponse } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Agent } from 'undici';
import type { AppContext } from '../app/context.ts';
import { type PaywallRefusal, placeHold, releaseHold, settleHold, type Trigger } from '../billing/ledger.ts';
import { ApiError, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { formatAmount } from '../core/money.ts';
import type { ModelRow } from '../db/schema.ts';
import type { EventType } from '../events/catalog.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { ECHO_UPSTREAM } from '../projects/service.ts';
import { type ChatPricing, chatPricing, requestCost, tokenCost } from './cost.ts';
import { linkCompletion, linkReply, subscriptionAccess } from './paywall.ts';
import { EchoProvider } from './providers/echo.ts';
import { createUpstreamAgent, OpenAICompatibleProvider } from './providers/openai-compatible.ts';
import { type ChatProvider, isAbort, UpstreamError, type Usage } from './providers/types.ts';
import { type ChatRequest, END_USER_HEADER, resolveEndUser } from './schema.ts';
import {
  type ChunkMeta,
  chunkJson,
  chunkMeta,
  DONE,
  drained,
  messageStream,
  SSE_HEADERS,
  sseEvent,
  usageChunkJson,
} from './sse.ts';
import { countPromptTokens, countText, producedText, promptTokensUpperBound } from './tokens.ts';

/**
 * `POST /v1/chat/completions`: validation, the paywall decision, forwarding, charging.
 *
 * 1. Not connected → a completion carrying a connect link; cannot pay → one carrying a top-up link
 *    (no provider call, no charge). Both come out of the single conditional hold statement.
 * 2. Otherwise the most the request can cost is held (per request: the price; per token: the prompt
 *    counted with a margin plus the completion bound, which is also sent to the provider as
 *    `max_tokens`), the request is forwarded, and the hold is settled at the real cost from the
 *    provider's `usage` (counted with gpt-tokenizer when missing); the rest is released.
 * 3. Subscription models need no hold: a current period serves free, else its fee starts a new one.
 *
 * The settle runs right after the last byte is handed to the client, off the response's critical path;
 * `idle()` waits for those in flight (tests, shutdown).
 */
export class ChatService {
  readonly #ctx: AppContext;
  readonly #agent: Agent;
  readonly #echo = new EchoProvider();
  readonly #providers = new WeakMap<object, ChatProvider>();
  readonly #pending = new Set<Promise<unknown>>();

  constructor(ctx: AppContext) {
    this.#ctx = ctx;
    this.#agent = createUpstreamAgent({
      connectMs: ctx.config.UPSTREAM_CONNECT_TIMEOUT_MS,
      responseMs: ctx.config.UPSTREAM_RESPONSE_TIMEOUT_MS,
    });
  }

  /** Resolves when every settle, release and event write started so far has finished. */
  async idle(): Promise<void> {
    while (this.#pending.size) await Promise.allSettled([...this.#pending]);
  }

  async close(): Promise<void> {
    await this.idle();
    await this.#agent.close();
  }

  /** Serves one request whose body the route schema has validated. */
  async handle(request: FastifyRequest, reply: FastifyReply, body: ChatRequest): Promise<FastifyReply> {
    const started = performance.now();
    const ctx = this.#ctx;
    const project = request.project;
    const model = project.models.get(body.model);
    if (!model) throw notFound(`The model '${body.model}' does not exist`, 'model_not_found', 'model');
    const externalId = resolveEndUser(body, request.headers[END_USER_HEADER]);
    const upstream = project.upstream;
    if (!upstream) {
      throw new ApiError(
        503,
        'service_unavailable',
        'This project has no model provider configured. Set one with `tollgate project set --project ID --upstream-url URL --upstream-key KEY`.',
        { code: 'no_upstream' },
      );
    }
    const stream = body.stream === true;
    const pricing = chatPricing(model);
    const trigger: Trigger = { source: 'api', actorType: 'api_key', actorId: request.apiKeyId };
    const x: Exchange = {
      requestId: newId('req'),
      project,
      model,
      pricing,
      body,
      externalId,
      userId: '',
      stream,
      trigger,
      started,
      choices: body.n ?? 1,
      hold: undefined,
      promptTokens: undefined,
      bound: undefined,
      startedEvent: undefined,
    };
    const upstreamBody: Record<string, unknown> = { ...body, model: model.upstream_model };
    if (stream) upstreamBody.stream_options = { ...body.stream_options, include_usage: true };

    // ---- the paywall decision ----
    if (pricing.mode === 'subscription') {
      const access = await this.#decide(
        subscriptionAccess(ctx, project, model, externalId, pricing, trigger),
      );
      if (!access.ok) return this.#refuse(x, access, reply);
      x.userId = access.userId;
      if (access.renewal?.entryId) {
        ctx.metrics.charged.inc(
          { project: project.id, model: model.id, currency: project.currency, source: 'subscription' },
          Number(access.renewal.charged),
        );
      }
    } else {
      let amount: string;
      if (pricing.mode === 'per_token') {
        x.promptTokens = countPromptTokens(body);
        x.bound =
          body.max_completion_tokens ??
          body.max_tokens ??
          project.settings.maxCompletionTokens ??
          ctx.config.DEFAULT_MAX_COMPLETION_TOKENS;
        upstreamBody[boundField(body, model.upstream_model)] = x.bound;
        amount = tokenCost(pricing, promptTokensUpperBound(x.promptTokens), x.bound * x.choices);
      } else {
        amount = formatAmount(pricing.perRequest);
      }
      const held = await this.#decide(
        placeHold(ctx.db, {
          projectId: project.id,
          externalId,
          amount,
          purpose: 'chat',
          ttlSeconds: ctx.config.HOLD_TTL_SECONDS,
        }),
      );
      if (!held.ok) return this.#refuse(x, held, reply);
      x.hold = held.hold;
      x.userId = held.hold.userId;
      ctx.metrics.holdsOpen.inc({ project: project.id });
    }
    x.startedEvent = this.#event(x, 'proxy.request.started', {
      requestId: x.requestId,
      model: model.id,
      stream,
      holdAmount: x.hold?.amount ?? '0',
    });

    // ---- forward ----
    const provider = this.#provider(upstream);
    reply.header('x-tollgate-request-id', x.requestId);
    if (stream) return this.#stream(x, provider, upstreamBody, reply);
    return this.#complete(x, provider, upstreamBody, reply);
  }

  async #complete(
    x: Exchange,
    provider: ChatProvider,
    upstreamBody: Record<string, unknown>,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    const res = reply.raw;
    const abort = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) abort.abort();
    };
    res.on('close', onClose);
    const upstreamStarted = performance.now();
    let completion: Awaited<ReturnType<ChatProvider['complete']>>;
    try {
      completion = await provider.complete({ body: upstreamBody, signal: abort.signal });
    } catch (err) {
      // The client left before the answer.
      if (abort.signal.aborted) return this.#abandoned(x, reply);
      throw this.#failed(x, err);
    } finally {
      res.off('close', onClose);
    }
    const upstreamMs = performance.now() - upstreamStarted;
    let produced = 0;
    let finishReason: string | null = null;
    const usage = completion.json.usage ?? undefined;
    for (const choice of completion.json.choices) {
      if (usage?.completion_tokens == null) produced += countText(producedText(choice?.message));
      finishReason ??= choice?.finish_reason ?? null;
    }
    reply.header('content-type', 'application/json; charset=utf-8').send(completion.text);
    this.#observe(x, upstreamMs);
    this.#finish(x, { outcome: 'success', usage, produced, finishReason, charge: true });
    return reply;
  }

  async #stream(
    x: Exchange,
    provider: ChatProvider,
    upstreamBody: Record<string, unknown>,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    const res = reply.raw;
    const abort = new AbortController();
    let clientGone = false;
    const onClose = () => {
      if (!res.writableFinished) {
        clientGone = true;
        abort.abort();
      }
    };
    res.on('close', onClose);
    const upstreamStarted = performance.now();
    let events: AsyncIterable<string>;
    try {
      events = await provider.stream({ body: upstreamBody, signal: abort.signal });
    } catch (err) {
      res.off('close', onClose);
      if (clientGone) return this.#abandoned(x, reply);
      throw this.#failed(x, err);
    }
    reply.hijack();
    const wantsUsage = x.body.stream_options?.include_usage === true;
    const limit = x.bound === undefined ? undefined : x.bound * x.choices;
    let meta: ChunkMeta | undefined;
    let headSent = false;
    let usage: Usage | undefined;
    let produced = 0;
    let forwarded = 0;
    let finishReason: string | null = null;
    let done = false;
    let cut = false;
    const sendHead = () => {
      res.writeHead(200, { ...SSE_HEADERS, 'x-tollgate-request-id': x.requestId });
      headSent = true;
      this.#ctx.metrics.timeToFirstToken.observe(
        { project: x.project.id, model: x.model.id },
        (performance.now() - x.started) / 1000,
      );
      this.#observe(x, performance.now() - upstreamStarted, true);
    };
    try {
      for await (const data of events) {
        if (data === '[DONE]') {
          done = true;
          break;
        }
        let chunk: StreamChunk;
        try {
          chunk = JSON.parse(data) as StreamChunk;
        } catch {
          throw new UpstreamError('malformed', 'The provider sent a stream event that is not JSON.');
        }
        if (chunk === null || typeof chunk !== 'object') {
          throw new UpstreamError('malformed', 'The provider sent a stream event that is not a JSON object.');
        }
        if (chunk.error) {
          throw new UpstreamError('status', 'The provider reported an error in the stream.', {
            status: 500,
            body: data,
          });
        }
        meta ??= {
          id: String(chunk.id ?? ''),
          created: Number(chunk.created ?? 0),
          model: String(chunk.model ?? ''),
        };
        if (chunk.usage) usage = chunk.usage;
        const choices = chunk.choices;
        let tokens = 0;
        if (Array.isArray(choices) && choices.length > 0) {
          for (const choice of choices) {
            const text = producedText(choice?.delta);
            if (text) tokens += countText(text);
            if (choice?.finish_reason) finishReason = choice.finish_reason;
          }
        } else if (chunk.usage && !wantsUsage) {
          continue; // the usage chunk Tollgate asked for; the client did not
        }
        if (limit !== undefined && produced + tokens > limit) {
          // The provider went past the bound the hold pays for: stop it here, without this chunk.
          cut = true;
          abort.abort();
          break;
        }
        produced += tokens;
        if (!headSent) sendHead();
        forwarded++;
        if (!res.write(sseEvent(data))) await drained(res);
        if (clientGone) break;
      }
    } catch (err) {
      if (!clientGone && !isAbort(err)) {
        res.off('close', onClose);
        endWithError(res, headSent, this.#failed(x, err));
        return reply;
      }
    }
    res.off('close', onClose);
    if (clientGone || res.destroyed) {
      this.#finish(x, { outcome: 'client_closed', usage, produced, finishReason, charge: forwarded > 0 });
      return reply;
    }
    if (!done && !finishReason && !cut) {
      const truncated = new UpstreamError('malformed', 'The provider ended the stream before it finished.');
      endWithError(res, headSent, this.#failed(x, truncated));
      return reply;
    }
    if (!headSent) sendHead();
    meta ??= chunkMeta(x.model.upstream_model);
    let tail = '';
    if (cut) {
      finishReason = 'length';
      tail += sseEvent(chunkJson(meta, {}, 'length'));
    }
    const counted = usageOf(x, cut ? undefined : usage, produced);
    if (wantsUsage && (!usage || cut)) {
      tail += sseEvent(
        usageChunkJson(meta, {
          prompt_tokens: counted.input,
          completion_tokens: counted.output,
          total_tokens: counted.input + counted.output,
        }),
      );
    }
    res.end(tail + DONE);
    this.#finish(x, {
      outcome: cut ? 'bound_reached' : 'success',
      usage: cut ? undefined : usage,
      produced,
      finishReason,
      charge: true,
    });
    return reply;
  }

  /** The client left before anything reached it: nothing is charged, there is no one to answer. */
  #abandoned(x: Exchange, reply: FastifyReply): FastifyReply {
    this.#finish(x, {
      outcome: 'client_closed',
      usage: undefined,
      produced: 0,
      finishReason: null,
      charge: false,
    });
    return reply.hijack();
  }

  /** Answers with the link reply of a refused request; no provider call, no charge. */
  #refuse(x: Exchange, refusal: PaywallRefusal, reply: FastifyReply): FastifyReply {
    const ctx = this.#ctx;
    const link = linkReply(ctx, x.project, x.externalId, refusal);
    const meta = chunkMeta(x.model.id);
    ctx.metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: link.decision,
      outcome: 'link',
      stream: String(x.stream),
    });
    x.userId = refusal.wallet?.userId ?? '';
    if (link.decision === 'connect_required') {
      this.#event(x, 'auth.connection.required', { model: x.model.id, operation: 'chat' });
    } else {
      this.#event(x, 'limits.balance.insufficient', {
        model: x.model.id,
        operation: 'chat',
        required: link.required,
        available: link.available,
        currency: x.project.currency,
      });
    }
    reply.header('x-tollgate-paywall', link.decision);
    if (!x.stream) return reply.send(linkCompletion(meta, link));
    const includeUsage = x.body.stream_options?.include_usage === true;
    for (const [name, value] of Object.entries(SSE_HEADERS)) reply.header(name, value);
    return reply.send(messageStream(meta, link.message, includeUsage));
  }

  /** Records an upstream failure (hold released, nothing charged) and returns the error to answer with. */
  #failed(x: Exchange, err: unknown): ApiError {
    const ctx = this.#ctx;
    const error = toClientError(err);
    const reason = err instanceof UpstreamError ? err.kind : 'internal';
    if (!(err instanceof UpstreamError))
      ctx.log.error({ err, requestId: x.requestId }, 'chat request failed');
    ctx.metrics.upstreamErrors.inc({ project: x.project.id, model: x.model.id, reason });
    ctx.metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: 'allowed',
      outcome: err instanceof UpstreamError && err.kind === 'timeout' ? 'upstream_timeout' : 'upstream_error',
      stream: String(x.stream),
    });
    this.#release(x);
    this.#events(x, [
      [
        'proxy.request.failed',
        { requestId: x.requestId, model: x.model.id, status: error.status, code: error.code },
      ],
      [
        'routing.upstream.failed',
        {
          requestId: x.requestId,
          model: x.model.id,
          upstreamStatus: err instanceof UpstreamError ? (err.upstreamStatus ?? null) : null,
          reason: err instanceof UpstreamError ? `${err.kind}: ${err.message}` : 'internal error',
        },
      ],
    ]);
    return error;
  }

  #release(x: Exchange): void {
    const hold = x.hold;
    if (!hold) return;
    x.hold = undefined;
    this.#ctx.metrics.holdsOpen.dec({ project: x.project.id });
    this.#track(
      retrying(() => releaseHold(this.#ctx.db, hold.id, 'released')),
      x,
      'release',
    );
  }

  /** Charges a served request (off the response path) and records its metrics and completion event. */
  #finish(x: Exchange, end: Ending): void {
    const ctx = this.#ctx;
    const labels = { project: x.project.id, model: x.model.id };
    ctx.metrics.requests.inc({
      ...labels,
      decision: 'allowed',
      outcome: end.outcome,
      stream: String(x.stream),
    });
    if (!end.charge) {
      this.#release(x);
      return;
    }
    const { input, output } = usageOf(x, end.usage, end.produced);
    ctx.metrics.inputTokens.inc(labels, input);
    ctx.metrics.outputTokens.inc(labels, output);
    const cost = requestCost(x.pricing, input, output);
    const hold = x.hold;
    x.hold = undefined;
    if (hold) ctx.metrics.holdsOpen.dec({ project: x.project.id });
    const completed = (amount: string) => ({
      requestId: x.requestId,
      model: x.model.id,
      stream: x.stream,
      inputTokens: input,
      outputTokens: output,
      amount,
      currency: x.project.currency,
      finishReason: end.finishReason,
      outcome: end.outcome,
      durationMs: Math.round(performance.now() - x.started),
    });
    const work = async () => {
      await x.startedEvent;
      const wantsCompleted = ctx.events.wants(x.project.id, 'proxy.request.completed');
      if (!hold) {
        if (wantsCompleted) await this.#record(x, 'proxy.request.completed', completed('0'));
        return;
      }
      const settle = (db: typeof ctx.db) =>
        settleHold(db, ctx.events, {
          project: x.project,
          hold,
          cost,
          source: 'chat',
          trigger: x.trigger,
          subjectExternalId: x.externalId,
          metadata: { requestId: x.requestId, model: x.model.id, inputTokens: input, outputTokens: output },
          description: `chat ${x.model.id}: ${input} input + ${output} output tokens`,
        });
      let charged: string;
      if (wantsCompleted) {
        charged = await retrying(() =>
          ctx.db.transaction().execute(async (tx) => {
            const settled = await settle(tx);
            await ctx.events.record(
              tx,
              this.#eventInput(x, 'proxy.request.completed', completed(settled.charged)),
            );
            return settled.charged;
          }),
        );
        ctx.events.wake();
      } else {
        charged = (await retrying(() => settle(ctx.db))).charged;
      }
      if (charged !== '0') {
        ctx.metrics.charged.inc({ ...labels, currency: x.project.currency, source: 'chat' }, Number(charged));
      }
    };
    this.#track(work(), x, 'settle');
  }

  /** The paywall decision's database work: a failure there is a 503, and nothing was forwarded. */
  async #decide<T>(work: Promise<T>): Promise<T> {
    try {
      return await work;
    } catch (err) {
      if (err instanceof ApiError) throw err;
      this.#ctx.log.error({ err }, 'chat: the paywall decision failed');
      throw new ApiError(
        503,
        'service_unavailable',
        'The billing database is unavailable; the request was not forwarded.',
        {
          code: 'database_unavailable',
        },
      );
    }
  }

  #observe(x: Exchange, upstreamMs: number, stream = false): void {
    const metrics = this.#ctx.metrics;
    const labels = { project: x.project.id, model: x.model.id };
    metrics.upstreamLatency.observe({ ...labels, stream: String(stream) }, upstreamMs / 1000);
    metrics.overhead.observe(labels, Math.max(0, performance.now() - x.started - upstreamMs) / 1000);
  }

  /** Writes an event outside a transaction when some subscription wants it (off the response path). */
  #event(x: Exchange, type: EventType, data: Record<string, unknown>): Promise<unknown> | undefined {
    return this.#events(x, [[type, data]]);
  }

  /** Writes the wanted ones of several events, in order, after the request's `started` event. */
  #events(x: Exchange, list: Array<[EventType, Record<string, unknown>]>): Promise<unknown> | undefined {
    const wanted = list.filter(([type]) => this.#ctx.events.wants(x.project.id, type));
    if (!wanted.length) return undefined;
    const after = x.startedEvent;
    const write = async () => {
      await after;
      for (const [type, data] of wanted) await this.#record(x, type, data);
      this.#ctx.events.wake();
    };
    return this.#track(write(), x, wanted.map(([type]) => type).join(', '));
  }

  #record(x: Exchange, type: EventType, data: Record<string, unknown>) {
    return this.#ctx.events.record(this.#ctx.db, this.#eventInput(x, type, data));
  }

  #eventInput(x: Exchange, type: EventType, data: Record<string, unknown>) {
    return {
      project: x.project,
      type,
      trigger: x.trigger,
      subject: { type: 'user', id: x.userId, externalId: x.externalId },
      data,
    };
  }

  #track(work: Promise<unknown>, x: Exchange, what: string): Promise<unknown> {
    const tracked = work
      .catch((err) => {
        this.#ctx.log.error({ err, requestId: x.requestId, what }, `chat ${what} failed`);
      })
      .finally(() => this.#pending.delete(tracked));
    this.#pending.add(tracked);
    return tracked;
  }

  #provider(upstream: NonNullable<ProjectContext['upstream']>): ChatProvider {
    if (upstream.baseUrl === ECHO_UPSTREAM) return this.#echo;
    let provider = this.#providers.get(upstream);
    if (!provider) {
      provider = new OpenAICompatibleProvider(this.#agent, upstream.baseUrl, upstream.apiKey);
      this.#providers.set(upstream, provider);
    }
    return provider;
  }
}

interface Exchange {
  requestId: string;
  project: ProjectContext;
  model: ModelRow;
  pricing: ChatPricing;
  body: ChatRequest;
  externalId: string;
  userId: string;
  stream: boolean;
  trigger: Trigger;
  started: number;
  /** `n`: completions asked for. */
  choices: number;
  hold: { id: string; amount: string } | undefined;
  /** Prompt tokens counted by Tollgate (per-token pricing). */
  promptTokens: number | undefined;
  /** Completion tokens the hold pays for, per choice (per-token pricing). */
  bound: number | undefined;
  startedEvent: Promise<unknown> | undefined;
}

interface Ending {
  outcome: 'success' | 'client_closed' | 'bound_reached';
  usage: Usage | undefined;
  /** Completion tokens counted by Tollgate from what was produced. */
  produced: number;
  finishReason: string | null;
  /** False when nothing reached the client: the hold is released. */
  charge: boolean;
}

interface StreamChunk {
  id?: unknown;
  created?: unknown;
  model?: unknown;
  error?: unknown;
  usage?: Usage | null;
  choices?: Array<{ delta?: Record<string, unknown>; finish_reason?: string | null } | null>;
}

/**
 * Ends a stream with an error: an ordinary OpenAI-shaped error response before the first chunk, an SSE
 * `data: {"error": …}` event after it (the official clients raise it as an APIError).
 */
function endWithError(res: ServerResponse, headSent: boolean, error: ApiError): void {
  if (headSent) {
    res.end(sseEvent(JSON.stringify(error.toBody())));
    return;
  }
  res.writeHead(error.status, { 'content-type': 'application/json; charset=utf-8', ...error.headers });
  res.end(JSON.stringify(error.toBody()));
}

/**
 * Retries a settle after a transient database failure. Settling is idempotent (a hold that is no longer
 * open is left alone), so a retry after an ambiguous failure cannot charge twice. A settle that still
 * fails leaves the hold to the sweeper: the request is then not charged.
 */
async function retrying<T>(work: () => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (attempt >= attempts) throw err;
      await new Promise((resolve) => setTimeout(resolve, 200 * attempt * attempt));
    }
  }
}

/** Tokens to charge: the provider's usage, or Tollgate's own count when it reported none. */
function usageOf(x: Exchange, usage: Usage | undefined, produced: number): { input: number; output: number } {
  const input = usage?.prompt_tokens ?? x.promptTokens ?? countPromptTokens(x.body);
  let output = usage?.completion_tokens ?? produced;
  // Never charge past the bound the hold pays for (the settle caps the amount as well).
  if (x.bound !== undefined && usage?.completion_tokens === undefined)
    output = Math.min(output, x.bound * x.choices);
  return { input, output };
}

/**
 * The field that carries the completion bound upstream: the one the client used, else
 * `max_completion_tokens` for OpenAI's reasoning models (which refuse `max_tokens`), else `max_tokens`.
 */
function boundField(body: ChatRequest, upstreamModel: string): 'max_tokens' | 'max_completion_tokens' {
  if (body.max_completion_tokens != null) return 'max_completion_tokens';
  if (body.max_tokens != null) return 'max_tokens';
  return /^(o\d|gpt-5)/.test(upstreamModel) ? 'max_completion_tokens' : 'max_tokens';
}

/** An upstream failure as the client sees it: OpenAI's error shape, 502/504 (or the provider's 4xx). */
export function toClientError(err: unknown): ApiError {
  if (!(err instanceof UpstreamError)) {
    return new ApiError(500, 'server_error', 'The server had an error while processing your request.', {
      code: 'internal_error',
    });
  }
  switch (err.kind) {
    case 'timeout':
      return new ApiError(504, 'timeout_error', `The model provider timed out: ${err.message}`, {
        code: 'upstream_timeout',
      });
    case 'connection':
      return new ApiError(502, 'upstream_error', err.message, { code: 'upstream_unreachable' });
    case 'malformed':
      return new ApiError(
        502,
        'upstream_error',
        `The model provider sent a malformed response: ${err.message}`,
        {
          code: 'upstream_malformed',
        },
      );
    case 'status':
      break;
  }
  const status = err.upstreamStatus ?? 502;
  const detail = providerMessage(err.body);
  const suffix = detail ? `: ${detail}` : '.';
  if (status === 401 || status === 403) {
    return new ApiError(
      502,
      'upstream_error',
      `The model provider refused the project's provider key${suffix}`,
      {
        code: 'upstream_auth_failed',
      },
    );
  }
  if (status === 429) {
    return new ApiError(429, 'rate_limit_error', `The model provider is rate limiting${suffix}`, {
      code: 'upstream_rate_limited',
      ...(err.retryAfter ? { headers: { 'retry-after': err.retryAfter } } : {}),
    });
  }
  if (status >= 400 && status < 500) {
    return new ApiError(status, 'invalid_request_error', `The model provider rejected the request${suffix}`, {
      code: 'upstream_rejected',
    });
  }
  return new ApiError(502, 'upstream_error', `The model provider failed (status ${status})${suffix}`, {
    code: 'upstream_error',
  });
}

function providerMessage(body: string | undefined): string | undefined {
  if (!body) return undefined;
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown } | string; message?: unknown };
    const message =
      typeof parsed.error === 'string'
        ? parsed.error
        : typeof parsed.error?.message === 'string'
          ? parsed.error.message
          : typeof parsed.message === 'string'
            ? parsed.message
            : undefined;
    if (message) return message.slice(0, 500);
  } catch {}
  return body.slice(0, 200);
}
