import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Agent } from 'undici';
import type { AppContext } from '../app/context.ts';
import type { PaywallRefusal } from '../billing/ledger.ts';
import { ApiError, badRequest, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { formatAmount } from '../core/money.ts';
import type { ModelEndpoint } from '../db/schema.ts';
import type { EventType } from '../events/catalog.ts';
import { type LimitRequest, Limits, rateLimitHeaders, spendCapMessage } from '../limits/index.ts';
import { holdMarginOf } from '../models/hold-margin.ts';
import { endpointsOf } from '../models/pricing.ts';
import { linkReply } from '../paywall/replies.ts';
import { Router, routingReported } from '../routing/router.ts';
import { holdInputTokens } from '../tokens/count.ts';
import { failed, type Span, SpanStatusCode } from '../tracing/index.ts';
import { createUpstreamAgent } from '../upstream/openai-compatible.ts';
import { isAbort, type Provider, type SseMessage, UpstreamError } from '../upstream/types.ts';
import { admit } from './admission.ts';
import type { Exchange, MeteredApi, MeteredBody, ReportedUsage, StreamReader } from './api.ts';
import { meteredPricing, requestCost, type TokenUsage, tokenHold } from './cost.ts';
import { END_USER_HEADER, resolveEndUser } from './end-user.ts';
import {
  abandon,
  ClientWatch,
  SseSink,
  sendJsonText,
  sendPassthrough,
  sendStream,
  sseMessage,
} from './relay.ts';
import { requestMetricsOf } from './request-metrics.ts';
import { toClientError, unsupportedEndpoint } from './upstream-errors.ts';

/**
 * One metered request, whatever the API (`/v1/chat/completions`, `/v1/responses`, `/v1/embeddings`):
 *
 * 1. admission (admission.ts): not connected → the API's connect-link reply; cannot pay → its top-up
 *    reply (no provider call, no charge). Both come out of the single conditional hold statement.
 * 2. Otherwise the most the request can cost is held (per request: the price; per token: the input
 *    counted with a margin plus the output bound, which is also sent to the provider), the request is
 *    forwarded, and the answer relayed (relay.ts).
 * 3. settlement: the billing service settles the hold at the real cost from the provider's `usage`
 *    (counted with gpt-tokenizer when missing) and releases the rest.
 * Subscription models need no hold: a current period serves free, else its fee starts a new one.
 *
 * Read-your-writes: the settle commits before the end of the response is written (the last byte of a
 * JSON body; a stream's final event and `[DONE]`), so a client that has the whole answer and then reads
 * the balance, or sends its next request, sees the charge. Time to first byte is untouched. A request
 * whose client left is settled in the background; `idle()` waits for those (tests, shutdown).
 */
export class MeteredFlow {
  readonly #ctx: AppContext;
  readonly #agent: Agent;
  readonly #pending = new Set<Promise<unknown>>();
  /** Routing with fallback (src/routing) and rate limits / spend caps (src/limits). */
  readonly #router: Router;
  readonly #limits: Limits;
  #closed: Promise<void> | undefined;

  constructor(ctx: AppContext) {
    this.#ctx = ctx;
    this.#agent = createUpstreamAgent({
      connectMs: ctx.config.UPSTREAM_CONNECT_TIMEOUT_MS,
      responseMs: ctx.config.UPSTREAM_RESPONSE_TIMEOUT_MS,
      allowPrivate: ctx.config.TOLLGATE_ALLOW_PRIVATE_PROVIDERS,
    });
    this.#router = new Router(ctx, this.#agent);
    this.#limits = new Limits(ctx);
  }

  /** Resolves when every settle, release and event write started so far has finished. */
  async idle(): Promise<void> {
    while (this.#pending.size) await Promise.allSettled([...this.#pending]);
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      await this.idle();
      await Promise.all([this.#agent.close(), this.#router.close(), this.#limits.close()]);
    })();
    return this.#closed;
  }

  handle<B extends MeteredBody>(
    api: MeteredApi<B>,
    request: FastifyRequest,
    reply: FastifyReply,
    body: B,
  ): Promise<FastifyReply> {
    // Tracing off: straight in, no span and no extra promise.
    if (!this.#ctx.tracing.enabled) return this.#handle(api, request, reply, body, undefined);
    return this.#traced(api, request, reply, body);
  }

  async #traced<B extends MeteredBody>(
    api: MeteredApi<B>,
    request: FastifyRequest,
    reply: FastifyReply,
    body: B,
  ): Promise<FastifyReply> {
    const tracing = this.#ctx.tracing;
    // A server span per metered request, continuing the client's `traceparent`; never the end user or
    // the prompt in its attributes.
    // (Named by the model only when the project has it: a span name is not for arbitrary client text.)
    const known = request.project.models.has(body.model);
    const span = tracing.startServer(known ? `${api.name} ${body.model}` : api.name, request.headers, {
      'tollgate.api': api.name,
      'tollgate.project.id': request.project.id,
      'gen_ai.request.model': String(body.model).slice(0, 200),
      'tollgate.stream': body.stream === true,
    });
    try {
      const answered = await tracing.run(span, () => this.#handle(api, request, reply, body, span));
      if (reply.statusCode >= 500) span?.setStatus({ code: SpanStatusCode.ERROR });
      span?.setAttribute('http.response.status_code', reply.statusCode);
      return answered;
    } catch (err) {
      failed(span, err);
      if (err instanceof ApiError) span?.setAttribute('http.response.status_code', err.status);
      throw err;
    } finally {
      span?.end();
    }
  }

  async #handle<B extends MeteredBody>(
    api: MeteredApi<B>,
    request: FastifyRequest,
    reply: FastifyReply,
    body: B,
    span: Span | undefined,
  ): Promise<FastifyReply> {
    const started = performance.now();
    const ctx = this.#ctx;
    const project = request.project;
    const model = project.models.get(body.model);
    if (!model) throw notFound(`The model '${body.model}' does not exist`, 'model_not_found', 'model');
    if (!endpointsOf(model).includes(api.endpoint ?? (api.name as ModelEndpoint))) {
      throw badRequest(
        `The model '${model.id}' is not served by the ${api.title} API (it serves: ${endpointsOf(model).join(', ')}).`,
        'model',
        'unsupported_model',
      );
    }
    const externalId = resolveEndUser(
      api.endUser ? { user: api.endUser(body, request) } : body,
      request.headers[END_USER_HEADER],
    );
    const upstream = project.upstream;
    if (!upstream && !model.routes?.length) {
      throw new ApiError(
        503,
        'service_unavailable',
        'This project has no model provider configured. Set one with `tollgate project set --project ID --upstream-url URL --upstream-key KEY`.',
        { code: 'no_upstream' },
      );
    }
    const stream = body.stream === true && api.streamReader !== undefined;
    const pricing = meteredPricing(model);
    const x: Exchange<B> = {
      api,
      requestId: newId('req'),
      project,
      model,
      pricing,
      body,
      externalId,
      userId: '',
      stream,
      trigger: { source: 'api', actorType: 'api_key', actorId: request.apiKeyId },
      started,
      choices: api.choices(body),
      hold: undefined,
      inputCount: undefined,
      bound: undefined,
      startedEvent: undefined,
      upstreamHeaders: api.upstreamHeaders?.(request),
      span,
    };
    span?.setAttribute('tollgate.request_id', x.requestId);

    // ---- the paywall decision ----
    let amount = '0';
    if (pricing.mode === 'per_token') {
      // Counted cheaply (exact up to a budget, bounded by bytes beyond): a huge prompt never stalls the pod;
      // times the model's hold margin for its provider's tokenizer (src/models/hold-margin.ts).
      const input = holdInputTokens(api.countInput, body, holdMarginOf(model).margin);
      x.inputCount = input.exact;
      x.bound =
        api.requestedBound(body) ??
        project.settings.maxCompletionTokens ??
        ctx.config.DEFAULT_MAX_COMPLETION_TOKENS;
      const margin = api.inputMargin ?? 1;
      amount = tokenHold(pricing, Math.ceil(input.bound * margin), x.bound * x.choices);
    } else if (pricing.mode === 'per_request') {
      amount = formatAmount(pricing.perRequest);
    }
    // ---- admission: limits, then the hold (one span with a child for each when tracing) ----
    const tracing = ctx.tracing;
    const admissionSpan = span
      ? tracing.start('tollgate.admission', { 'tollgate.amount.held': amount })
      : undefined;
    let admission: Awaited<ReturnType<typeof admit>>;
    try {
      // ---- limits (src/limits): rate limits and spend caps, checked before any money moves ----
      if (this.#limits.applies(project)) {
        const check = () => this.#checkLimits(x, request, reply, amount);
        const limited = await (admissionSpan
          ? tracing.run(admissionSpan, () => tracing.span('tollgate.limits', undefined, check))
          : check());
        if (limited) return limited.answered;
      }
      const hold = () =>
        admit(ctx, {
          project,
          model,
          pricing,
          externalId,
          amount,
          purpose: api.name,
          trigger: x.trigger,
        });
      admission = await (admissionSpan
        ? tracing.run(admissionSpan, () => tracing.span('tollgate.hold', undefined, hold))
        : hold()
      ).catch((err) => {
        this.#limits.released(x); // limits: give the reservation back
        throw err;
      });
      if (span) {
        const decision = admission.ok ? 'allowed' : linkDecision(admission);
        span.setAttribute('tollgate.decision', decision);
        admissionSpan?.setAttribute('tollgate.decision', decision);
      }
    } catch (err) {
      failed(admissionSpan, err);
      throw err;
    } finally {
      admissionSpan?.end();
    }
    if (!admission.ok) {
      this.#limits.released(x); // limits: a refused request uses and spends nothing
      return this.#refuse(x, admission, reply);
    }
    x.userId = admission.userId;
    x.hold = admission.hold;
    x.startedEvent = this.#event(x, 'proxy.request.started', {
      requestId: x.requestId,
      api: api.name,
      model: model.id,
      stream,
      holdAmount: x.hold?.amount ?? '0',
    });

    // ---- forward ----
    const upstreamBody = api.upstreamBody(body, model, x.bound);
    // routing (src/routing): the model's routes, with fallback, behind one Provider
    // (its events chain on `startedEvent`, so they are written in order, before the request's own)
    const provider = this.#router.provider(project, model, (type, data) => {
      x.startedEvent = this.#event(x, type, { requestId: x.requestId, ...data }) ?? x.startedEvent;
    });
    reply.header('x-tollgate-request-id', x.requestId);
    if (stream) return this.#stream(x, provider, upstreamBody, reply);
    return this.#complete(x, provider, upstreamBody, reply);
  }

  /** Unmetered calls (`GET /v1/responses/{id}`, …) go to the provider as received. */
  async passthrough(request: FastifyRequest, reply: FastifyReply, path: string): Promise<FastifyReply> {
    if (!request.project.upstream) {
      throw new ApiError(503, 'service_unavailable', 'This project has no model provider configured.', {
        code: 'no_upstream',
      });
    }
    const watch = new ClientWatch(reply);
    try {
      const answer = await this.#router.passthrough(request.project, {
        method: request.method,
        path,
        body: request.body === undefined || request.body === null ? undefined : JSON.stringify(request.body),
        signal: watch.abort.signal,
      });
      return sendPassthrough(reply, answer);
    } catch (err) {
      if (watch.gone) return abandon(reply);
      logUnreachable(this.#ctx, err, request.project.id);
      throw unsupportedEndpoint(err, 'Responses', path) ?? toClientError(err);
    } finally {
      watch.stop();
    }
  }

  async #complete<B extends MeteredBody>(
    x: Exchange<B>,
    provider: Provider,
    upstreamBody: Record<string, unknown>,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    const watch = new ClientWatch(reply);
    const upstreamStarted = performance.now();
    let text: string;
    let reading: ReturnType<MeteredApi<B>['read']>;
    try {
      const answer = await provider.complete({
        path: x.api.upstreamPath,
        body: upstreamBody,
        signal: watch.abort.signal,
        headers: x.upstreamHeaders,
      });
      text = answer.text;
      reading = x.api.read(answer.json);
    } catch (err) {
      // The client left before the answer.
      if (watch.gone) return this.#abandoned(x, reply);
      throw this.#failed(x, err);
    } finally {
      watch.stop();
    }
    const upstreamMs = performance.now() - upstreamStarted;
    await this.#finish(x, {
      outcome: 'success',
      usage: reading.usage,
      produced: reading.produced,
      finishReason: reading.finishReason,
      charge: true,
    });
    this.#observe(x, upstreamMs);
    sendJsonText(reply, text);
    return reply;
  }

  async #stream<B extends MeteredBody>(
    x: Exchange<B>,
    provider: Provider,
    upstreamBody: Record<string, unknown>,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    const watch = new ClientWatch(reply);
    const upstreamStarted = performance.now();
    let events: AsyncIterable<SseMessage>;
    try {
      events = await provider.stream({
        path: x.api.upstreamPath,
        body: upstreamBody,
        signal: watch.abort.signal,
        headers: x.upstreamHeaders,
      });
    } catch (err) {
      watch.stop();
      if (watch.gone) return this.#abandoned(x, reply);
      throw this.#failed(x, err);
    }
    const reader = x.api.streamReader!(x);
    const sink = new SseSink(
      reply,
      // (Rate limit headers are only ever set when the project has limits.)
      this.#limits.applies(x.project)
        ? { ...rateLimitHeaders(reply), 'x-tollgate-request-id': x.requestId }
        : { 'x-tollgate-request-id': x.requestId },
      () => {
        requestMetricsOf(this.#ctx.metrics, x.project.id, x.model).firstToken(
          (performance.now() - x.started) / 1000,
        );
        this.#observe(x, performance.now() - upstreamStarted, true);
      },
    );
    const limit = x.bound === undefined || !reader.canCut ? undefined : x.bound * x.choices;
    let produced = 0;
    let forwarded = 0;
    let cut = false;
    try {
      for await (const message of events) {
        const step = reader.next(message);
        if (step.action === 'end') break;
        if (step.action === 'skip') continue;
        if (limit !== undefined && produced + step.tokens > limit) {
          // The provider went past the bound the hold pays for: stop it here, without this event.
          cut = true;
          watch.abort.abort();
          break;
        }
        produced += step.tokens;
        forwarded++;
        await sink.write(sseMessage(message));
        if (watch.gone) break;
      }
    } catch (err) {
      if (!watch.gone && !isAbort(err)) {
        watch.stop();
        sink.fail(this.#failedAfter(x, err, forwarded, reader, produced), x.api.renderError);
        return reply;
      }
    }
    watch.stop();
    if (watch.gone || sink.destroyed) {
      this.#finish(x, {
        outcome: 'client_closed',
        usage: reader.usage,
        produced,
        finishReason: reader.finishReason,
        charge: forwarded > 0,
      });
      return reply;
    }
    if (!reader.finished && !cut) {
      const truncated = new UpstreamError('malformed', 'The provider ended the stream before it finished.');
      sink.fail(this.#failedAfter(x, truncated, forwarded, reader, produced), x.api.renderError);
      return reply;
    }
    const usage = cut ? undefined : reader.usage;
    await this.#finish(x, {
      outcome: cut ? 'bound_reached' : 'success',
      usage,
      produced,
      finishReason: cut ? 'length' : reader.finishReason,
      charge: true,
    });
    sink.end(reader.tail(cut, usageOf(x, usage, produced)));
    return reply;
  }

  /**
   * Rate limits (429 in OpenAI's shape) and spend caps (an assistant message, like the paywall's) of a
   * request, before its hold; the rate limit headers go on every answer. Undefined: go on. (The reply
   * is wrapped: a FastifyReply is a thenable, awaiting it would wait for the response.)
   */
  async #checkLimits<B extends MeteredBody>(
    x: Exchange<B>,
    request: FastifyRequest,
    reply: FastifyReply,
    amount: string,
  ): Promise<{ answered: FastifyReply } | undefined> {
    const ctx = this.#ctx;
    const req: LimitRequest = {
      project: x.project,
      apiKeyId: request.apiKeyId,
      externalId: x.externalId,
      model: x.model.id,
      operation: x.api.name,
      estimateTokens: () => {
        if (x.inputCount !== undefined) return x.inputCount;
        const counted = holdInputTokens(x.api.countInput, x.body, holdMarginOf(x.model).margin);
        return counted.exact ?? counted.bound;
      },
    };
    const decision = await this.#limits.check(x, req, amount);
    for (const [name, value] of Object.entries(decision.headers)) reply.header(name, value);
    if (decision.ok) return undefined;
    const { rate, spend } = decision;
    x.span?.setAttribute('tollgate.decision', rate ? 'rate_limited' : 'spend_cap_reached');
    if (rate) {
      ctx.metrics.requests.inc({
        project: x.project.id,
        model: x.model.id,
        decision: 'rate_limited',
        outcome: 'refused',
        stream: String(x.stream),
      });
      this.#event(x, 'limits.rate.exceeded', {
        model: x.model.id,
        operation: x.api.name,
        scope: rate.scope,
        limit: rate.limit,
        value: rate.value,
        retryAfterSeconds: rate.retryAfterSeconds,
      });
      throw rate.error;
    }
    ctx.metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: 'spend_cap_reached',
      outcome: 'link',
      stream: String(x.stream),
    });
    this.#event(x, 'limits.spend.exceeded', {
      model: x.model.id,
      operation: x.api.name,
      period: spend.period,
      cap: spend.cap,
      spent: spend.spent,
      required: spend.required,
      currency: x.project.currency,
      resetsAt: spend.resetsAt.toISOString(),
    });
    reply.header('x-tollgate-paywall', 'spend_cap_reached');
    const answer = x.api.refusal(
      { decision: 'spend_cap_reached', url: '', message: spendCapMessage(x.project, spend) },
      x,
    );
    if (answer.kind === 'stream') return { answered: sendStream(reply, answer.body) };
    return { answered: reply.code(answer.status).send(answer.body) };
  }

  /** The client left before anything reached it: nothing is charged, there is no one to answer. */
  #abandoned<B extends MeteredBody>(x: Exchange<B>, reply: FastifyReply): FastifyReply {
    this.#finish(x, {
      outcome: 'client_closed',
      usage: undefined,
      produced: 0,
      finishReason: null,
      charge: false,
    });
    return abandon(reply);
  }

  /** Answers a refused request in its API's shape; no provider call, no charge. */
  #refuse<B extends MeteredBody>(x: Exchange<B>, refusal: PaywallRefusal, reply: FastifyReply): FastifyReply {
    const ctx = this.#ctx;
    const link = linkReply(ctx, x.project, x.externalId, refusal);
    ctx.metrics.requests.inc({
      project: x.project.id,
      model: x.model.id,
      decision: link.decision,
      outcome: 'link',
      stream: String(x.stream),
    });
    x.userId = refusal.wallet?.userId ?? '';
    if (link.decision === 'connect_required') {
      this.#event(x, 'auth.connection.required', { model: x.model.id, operation: x.api.name });
    } else {
      this.#event(x, 'limits.balance.insufficient', {
        model: x.model.id,
        operation: x.api.name,
        required: link.required,
        available: link.available,
        currency: x.project.currency,
      });
    }
    reply.header('x-tollgate-paywall', link.decision);
    const answer = x.api.refusal(link, x);
    if (answer.kind === 'stream') return sendStream(reply, answer.body);
    return reply.code(answer.status).send(answer.body);
  }

  /** Records an upstream failure (hold released, nothing charged) and returns the error to answer with. */
  #failed<B extends MeteredBody>(x: Exchange<B>, err: unknown): ApiError {
    this.#release(x);
    return this.#failure(x, err, true);
  }

  /** The metrics, log and events of an upstream failure, and the error to answer with. */
  #failure<B extends MeteredBody>(x: Exchange<B>, err: unknown, countRequest: boolean): ApiError {
    const ctx = this.#ctx;
    const error =
      // (Anthropic answers 404 for an unknown model: for Messages a 404 is the provider's own answer.)
      (x.api.name === 'chat' || x.api.name === 'messages'
        ? undefined
        : unsupportedEndpoint(err, x.api.title, x.api.upstreamPath)) ?? toClientError(err);
    const reason = err instanceof UpstreamError ? err.kind : 'internal';
    if (!(err instanceof UpstreamError) && !(err instanceof ApiError))
      ctx.log.error({ err, requestId: x.requestId }, `${x.api.name} request failed`);
    else logUnreachable(ctx, err, x.project.id);
    ctx.metrics.upstreamErrors.inc({ project: x.project.id, model: x.model.id, reason });
    if (countRequest) {
      ctx.metrics.requests.inc({
        project: x.project.id,
        model: x.model.id,
        decision: 'allowed',
        outcome:
          err instanceof UpstreamError && err.kind === 'timeout' ? 'upstream_timeout' : 'upstream_error',
        stream: String(x.stream),
      });
    }
    this.#events(x, [
      [
        'proxy.request.failed',
        { requestId: x.requestId, model: x.model.id, status: error.status, code: error.code },
      ],
      // routing: the router already reported each failed attempt of a routed request
      ...(routingReported(err)
        ? []
        : [
            [
              'routing.upstream.failed',
              {
                requestId: x.requestId,
                model: x.model.id,
                upstreamStatus: err instanceof UpstreamError ? (err.upstreamStatus ?? null) : null,
                reason: err instanceof UpstreamError ? `${err.kind}: ${err.message}` : 'internal error',
              },
            ] as [EventType, Record<string, unknown>],
          ]),
    ]);
    return error;
  }

  /**
   * A stream that failed after some of it reached the client: what reached it is charged (from the
   * provider's usage when it sent one, else Tollgate's count of the forwarded output, flagged as such),
   * the failure recorded as for any upstream failure. Nothing forwarded: released, as `#failed`.
   */
  #failedAfter<B extends MeteredBody>(
    x: Exchange<B>,
    err: unknown,
    forwarded: number,
    reader: StreamReader,
    produced: number,
  ): ApiError {
    if (forwarded === 0) return this.#failed(x, err);
    this.#finish(x, {
      outcome: 'upstream_error',
      usage: reader.usage,
      produced,
      finishReason: reader.finishReason,
      charge: true,
    });
    return this.#failure(x, err, false);
  }

  #release<B extends MeteredBody>(x: Exchange<B>): void {
    this.#limits.released(x); // limits: nothing was served
    const hold = x.hold;
    if (!hold) return;
    x.hold = undefined;
    this.#track(this.#ctx.billing.release(hold), x, 'release');
  }

  /**
   * Charges a served request and records its metrics and completion event. Resolves once the charge
   * committed (or failed and was logged: the hold is then left to the sweeper); never rejects.
   */
  #finish<B extends MeteredBody>(x: Exchange<B>, end: Ending): Promise<unknown> {
    const ctx = this.#ctx;
    const metrics = requestMetricsOf(ctx.metrics, x.project.id, x.model);
    metrics.allowed(end.outcome, x.stream);
    if (!end.charge) {
      this.#release(x);
      return Promise.resolve();
    }
    const usage = usageOf(x, end.usage, end.produced);
    const source = usageSourceOf(end.usage);
    metrics.tokens(usage.input, usage.output);
    const cost = requestCost(x.pricing, usage);
    x.span?.setAttributes({
      'gen_ai.usage.input_tokens': usage.input,
      'gen_ai.usage.output_tokens': usage.output,
      'tollgate.outcome': end.outcome,
      'tollgate.currency': x.project.currency,
    });
    this.#limits.tokensUsed(x, usage.input + usage.output); // limits: the estimate becomes the real count
    const hold = x.hold;
    x.hold = undefined;
    const completed = (amount: string) => ({
      requestId: x.requestId,
      api: x.api.name,
      model: x.model.id,
      stream: x.stream,
      inputTokens: usage.input,
      outputTokens: usage.output,
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
      const { charged } = await ctx.tracing.span('tollgate.settle', undefined, async (settleSpan) => {
        const settled = await this.#settle(x, hold, cost, usage, source, end, wantsCompleted, completed);
        if (settleSpan) {
          const attributes = {
            'tollgate.amount.charged': settled.charged,
            'tollgate.currency': x.project.currency,
          };
          settleSpan.setAttributes(attributes);
          x.span?.setAttributes(attributes);
        }
        return settled;
      });
      this.#limits.charged(x, charged); // limits: the reservation becomes the charge
    };
    return this.#track(work(), x, 'settle');
  }

  #settle<B extends MeteredBody>(
    x: Exchange<B>,
    hold: NonNullable<Exchange<B>['hold']>,
    cost: string,
    usage: TokenUsage,
    source: UsageSource,
    end: Ending,
    wantsCompleted: boolean,
    completed: (amount: string) => Record<string, unknown>,
  ) {
    return this.#ctx.billing.settle({
      project: x.project,
      hold,
      cost,
      source: x.api.name,
      model: x.model.id,
      trigger: x.trigger,
      externalId: x.externalId,
      lowBalanceThreshold: x.project.settings.lowBalanceThreshold,
      metadata: {
        requestId: x.requestId,
        model: x.model.id,
        api: x.api.name,
        inputTokens: usage.input,
        cachedInputTokens: usage.cachedInput,
        outputTokens: usage.output,
        reasoningTokens: usage.reasoning,
        usageSource: source,
        outcome: end.outcome,
      },
      description: `${x.api.name} ${x.model.id}: ${usage.input} input (${usage.cachedInput} cached) + ${usage.output} output tokens${source === 'provider' ? '' : source === 'tollgate' ? ' (counted by Tollgate: the provider reported no usage)' : ' (partly counted by Tollgate)'}`,
      ...(wantsCompleted ? { completed: { type: 'proxy.request.completed' as const, data: completed } } : {}),
    });
  }

  #observe<B extends MeteredBody>(x: Exchange<B>, upstreamMs: number, stream = false): void {
    requestMetricsOf(this.#ctx.metrics, x.project.id, x.model).latency(
      upstreamMs / 1000,
      Math.max(0, performance.now() - x.started - upstreamMs) / 1000,
      stream,
    );
  }

  /** Writes an event outside a transaction when some subscription wants it (off the response path). */
  #event<B extends MeteredBody>(
    x: Exchange<B>,
    type: EventType,
    data: Record<string, unknown>,
  ): Promise<unknown> | undefined {
    // (Most projects subscribe to nothing: asked first, nothing else is made.)
    if (!this.#ctx.events.wants(x.project.id, type)) return undefined;
    return this.#events(x, [[type, data]]);
  }

  /** Writes the wanted ones of several events, in order, after the request's `started` event. */
  #events<B extends MeteredBody>(
    x: Exchange<B>,
    list: Array<[EventType, Record<string, unknown>]>,
  ): Promise<unknown> | undefined {
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

  #record<B extends MeteredBody>(x: Exchange<B>, type: EventType, data: Record<string, unknown>) {
    return this.#ctx.events.record(this.#ctx.db, {
      project: x.project,
      type,
      trigger: x.trigger,
      subject: { type: 'user', id: x.userId, externalId: x.externalId },
      data,
    });
  }

  #track(
    work: Promise<unknown>,
    x: { requestId: string; api: { name: string } },
    what: string,
  ): Promise<unknown> {
    const tracked = work
      .catch((err) => {
        this.#ctx.log.error({ err, requestId: x.requestId, what }, `${x.api.name} ${what} failed`);
      })
      .finally(() => this.#pending.delete(tracked));
    this.#pending.add(tracked);
    return tracked;
  }
}

interface Ending {
  /** `upstream_error`: the provider failed mid-stream after some of the answer reached the client. */
  outcome: 'success' | 'client_closed' | 'bound_reached' | 'upstream_error';
  usage: ReportedUsage | undefined;
  /** Output tokens counted by Tollgate from what was produced. */
  produced: number;
  finishReason: string | null;
  /** False when nothing reached the client: the hold is released. */
  charge: boolean;
}

/**
 * Tokens to charge: the provider's usage, exactly as reported, or Tollgate's own count (o200k) of what
 * it did not report — the prompt it forwarded and the output that reached the client.
 */
export function usageOf<B extends MeteredBody>(
  x: Exchange<B>,
  usage: ReportedUsage | undefined,
  produced: number,
): TokenUsage {
  const input = usage?.input ?? x.inputCount ?? x.api.countInput(x.body);
  return {
    input,
    cachedInput: Math.min(usage?.cachedInput ?? 0, input),
    output: usage?.output ?? produced,
    reasoning: usage?.reasoning ?? 0,
  };
}

/**
 * Where a charge's tokens came from: `provider` (its usage had input and output), `tollgate` (it sent
 * none: Tollgate's count, an estimate) or `mixed` (it reported some fields; Tollgate counted the rest).
 */
export type UsageSource = 'provider' | 'tollgate' | 'mixed';

export function usageSourceOf(usage: ReportedUsage | undefined): UsageSource {
  if (usage?.input === undefined && usage?.output === undefined) return 'tollgate';
  if (usage.input !== undefined && usage.output !== undefined) return 'provider';
  return 'mixed';
}

/** The paywall decision of a refused admission, as the metrics and `x-tollgate-paywall` name it. */
function linkDecision(refusal: PaywallRefusal): string {
  return refusal.reason === 'not_connected' ? 'connect_required' : 'topup_required';
}

/** The metered flow of an app context, shared by every metered API's routes. */
const flows = new WeakMap<AppContext, MeteredFlow>();

export function meteredFlowOf(ctx: AppContext): MeteredFlow {
  let flow = flows.get(ctx);
  if (!flow) {
    flow = new MeteredFlow(ctx);
    flows.set(ctx, flow);
  }
  return flow;
}

/** The flow serving a context, if any route created it (tests wait on `idle()` for settles). */
export function existingFlowOf(ctx: AppContext): MeteredFlow | undefined {
  return flows.get(ctx);
}

/**
 * The client sees one fixed message when a provider cannot be reached (no port scanning); the pod's log
 * keeps the cause (ECONNREFUSED, EPRIVATEADDRESS, a parser error…) for the operator.
 */
function logUnreachable(ctx: AppContext, err: unknown, projectId: string): void {
  if (!(err instanceof UpstreamError) || err.kind !== 'connection' || err.cause === undefined) return;
  const cause = err.cause as { code?: string; message?: string };
  ctx.log.warn({ project: projectId, cause: cause.code ?? cause.message }, err.message);
}
