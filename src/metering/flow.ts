import type { FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import type { PaywallRefusal } from '../billing/ledger.ts';
import type { BillingService, Hold } from '../billing/service.ts';
import type { Config } from '../config/index.ts';
import { ApiError, badRequest, notFound } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import type { ModelEndpoint } from '../db/schema.ts';
import { rateLimitHeaders } from '../limits/index.ts';
import { endpointsOf } from '../models/pricing.ts';
import type { LinkReply } from '../paywall/replies.ts';
import type { ProjectContext } from '../projects/directory.ts';
import type { Router } from '../routing/router.ts';
import type { Span } from '../tracing/index.ts';
import {
  isAbort,
  type PassthroughAnswer,
  type Provider,
  type SseMessage,
  type UpstreamCall,
  UpstreamError,
} from '../upstream/types.ts';
import { type Admission, admit } from './admission.ts';
import type {
  AnswerReading,
  Exchange,
  MeteredApi,
  MeteredBody,
  MeteredClient,
  PassthroughRequest,
  StreamReader,
  UsageAnomaly,
} from './api.ts';
import type { ResponseChains } from './chains.ts';
import { meteredPricing, type TokenUsage } from './cost.ts';
import { END_USER_HEADER, resolveEndUser } from './end-user.ts';
import type { EventsObserver } from './events-observer.ts';
import type { LimitsObserver } from './limits-observer.ts';
import type { MetricsObserver } from './metrics-observer.ts';
import { type Ending, type LinkRefusal, type MeteringObserver, paywallDecision } from './observer.ts';
import type { Pending } from './pending.ts';
import {
  abandon,
  ClientWatch,
  droppedHints,
  SseSink,
  sendJsonText,
  sendPassthrough,
  sendStream,
  sseMessage,
  streamHead,
} from './relay.ts';
import type { RequestLogObserver } from './request-log.ts';
import { settleInput, usageOf, withinBounds } from './settlement.ts';
import type { TracingObserver } from './tracing-observer.ts';
import { logUnreachable, toClientError, unsupportedEndpoint } from './upstream-errors.ts';
import { chainSize, worstCase } from './worst-case.ts';

/**
 * One metered request, whatever the API (`/v1/chat/completions`, `/v1/responses`, `/v1/embeddings`,
 * `/v1/messages`), in five steps:
 *
 * 1. resolve: the model, the end user, the provider (or a 4xx/503 before anything is counted);
 * 2. price: the most the request can cost, its worst case (worst-case.ts: per request, the price; per
 *    token, the input counted with a margin plus a Responses chain's recorded size, at most the context
 *    window, and the output bound, which is the one bound sent to the provider);
 * 3. admit: the rate limits and spend caps (limits-observer.ts), then the paywall decision
 *    (admission.ts): not connected → the API's connect-link reply; cannot pay → its top-up reply (no
 *    provider call, no charge). Otherwise that most is held (subscriptions: a current period serves
 *    free, else its fee starts a new one);
 * 4. forward: the request goes to the provider (src/routing), the answer is relayed (relay.ts);
 * 5. settle: the billing service settles the hold at the real cost from the provider's `usage` (counted
 *    with gpt-tokenizer when missing), within the request's bounds (usage above them is an anomaly,
 *    recorded and not charged: settlement.ts), and releases the rest; a request that was served nothing
 *    releases its hold. A Responses answer's size is recorded for the chains continuing it.
 *
 * Everything else — limits' counters, metrics, events, spans — happens in the observers (observer.ts),
 * told in order at each step. The route hands the flow plain inputs: the body, the client (project, key,
 * headers) and the reply the answer is written to.
 *
 * Read-your-writes: the settle commits before the end of the response is written (the last byte of a
 * JSON body; a stream's final event and `[DONE]`), so a client that has the whole answer and then reads
 * the balance, or sends its next request, sees the charge. Time to first byte is untouched. A request
 * whose client left is settled in the background; `idle()` waits for those (tests, shutdown).
 */
export class MeteredFlow {
  readonly #ctx: MeteringContext;
  /** The router, the observers the flow asks for more than a notice (limits, events, tracing), … */
  readonly #parts: MeteringParts;
  /** Told at each step, in this order. */
  readonly #observers: readonly MeteringObserver[];

  constructor(ctx: MeteringContext, parts: MeteringParts) {
    this.#ctx = ctx;
    this.#parts = parts;
    this.#observers = [parts.limits, parts.metrics, parts.events, parts.tracing, parts.requestLog];
  }

  /** The rate limits on a request outside the flow (`/v1/user/*`): a 429 when over (limits-observer.ts). */
  readonly limitRequest: LimitsObserver['checkRequest'] = (request, user, reply) =>
    this.#parts.limits.checkRequest(request, user, reply);

  /** Resolves when every settle, release and event write started so far has finished. */
  idle(): Promise<void> {
    return this.#parts.pending.idle();
  }

  handle<B extends MeteredBody>(
    api: MeteredApi<B>,
    body: B,
    client: MeteredClient,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    // Tracing off: straight in, no span and no extra promise.
    if (!this.#parts.tracing.enabled) return this.#handle(api, body, client, reply, undefined);
    return this.#parts.tracing.request(api, body, client, reply, (span) =>
      this.#handle(api, body, client, reply, span),
    );
  }

  async #handle<B extends MeteredBody>(
    api: MeteredApi<B>,
    body: B,
    client: MeteredClient,
    reply: FastifyReply,
    span: Span | undefined,
  ): Promise<FastifyReply> {
    // ---- resolve, price (the worst case: worst-case.ts) ----
    const x = this.#resolve(api, body, client, span);
    const chain = api.chain ? await chainSize(x, this.#parts.chains, this.#ctx.log) : undefined;
    const amount = worstCase(x, this.#ctx.config.DEFAULT_MAX_COMPLETION_TOKENS, chain);
    for (const o of this.#observers) o.resolved?.(x);

    // ---- admit: limits, then the hold (one span with a child for each when tracing) ----
    const admission = await (span
      ? this.#parts.tracing.admission(amount, () => this.#admit(x, client, reply, amount))
      : this.#admit(x, client, reply, amount));
    if (!admission.ok) {
      return this.#refuse(x, 'reason' in admission ? this.#paywalled(x, admission) : admission, reply);
    }
    x.userId = admission.userId;
    x.hold = admission.hold;
    for (const o of this.#observers) o.admitted?.(x);

    // ---- forward (routing: the model's routes, with fallback, behind one Provider) ----
    const upstreamBody = api.upstreamBody(body, x.model, x.bound);
    const provider = this.#parts.router.provider(x.project, x.model, this.#parts.events.routing(x));
    reply.header('x-tollgate-request-id', x.requestId);
    const watch = new ClientWatch(reply);
    const call = {
      path: api.upstreamPath,
      body: upstreamBody,
      signal: watch.abort.signal,
      headers: x.upstreamHeaders,
      onDropped: droppedHints(reply),
    };
    if (x.stream) return this.#stream(x, provider, call, reply, watch);
    return this.#complete(x, provider, call, reply, watch);
  }

  /** The request's model, end user and provider, checked; the exchange the other steps fill in. */
  #resolve<B extends MeteredBody>(
    api: MeteredApi<B>,
    body: B,
    client: MeteredClient,
    span: Span | undefined,
  ): Exchange<B> {
    const started = performance.now();
    const project = client.project;
    const model = project.models.get(body.model);
    if (!model) throw notFound(`The model '${body.model}' does not exist`, 'model_not_found', 'model');
    if (!endpointsOf(model).includes(api.endpoint ?? (api.name as ModelEndpoint))) {
      throw badRequest(
        `The model '${model.id}' is not served by the ${api.title} API (it serves: ${endpointsOf(model).join(', ')}).`,
        'model',
        'unsupported_model',
      );
    }
    const externalId = resolveEndUser({
      key: client.endUser,
      header: client.headers[END_USER_HEADER],
      body: api.endUser ? api.endUser(body, client) : body.user,
    });
    if (!project.upstream && !model.routes?.length) {
      throw new ApiError(
        503,
        'service_unavailable',
        'This project has no model provider configured. Set one with `tollgate project set --project ID --upstream-url URL --upstream-key KEY`.',
        { code: 'no_upstream' },
      );
    }
    return {
      api,
      requestId: newId('req'),
      project,
      model,
      pricing: meteredPricing(model),
      body,
      externalId,
      userId: '',
      stream: body.stream === true && api.streamReader !== undefined,
      trigger: { source: 'api', actorType: 'api_key', actorId: client.apiKeyId },
      started,
      choices: api.choices(body),
      hold: undefined,
      inputCount: undefined,
      bound: undefined,
      inputBound: undefined,
      startedEvent: undefined,
      upstreamHeaders: api.upstreamHeaders?.(client),
      span,
    };
  }

  /** Limits (when the project has any), then the hold: the request is let in, or refused. */
  #admit(
    x: Exchange,
    client: MeteredClient,
    reply: FastifyReply,
    amount: string,
  ): Promise<Admission | LinkRefusal> {
    if (this.#parts.limits.applies(x.project)) return this.#limitedAdmit(x, client, reply, amount);
    return this.#hold(x, amount);
  }

  async #limitedAdmit(
    x: Exchange,
    client: MeteredClient,
    reply: FastifyReply,
    amount: string,
  ): Promise<Admission | LinkRefusal> {
    const check = () => this.#checkLimits(x, client, reply, amount);
    const refusal = await (x.span ? this.#parts.tracing.step('tollgate.limits', check) : check());
    return refusal ?? this.#hold(x, amount);
  }

  /** The limits' decision; a rate limit is answered with its 429 here (in the limits' span). */
  async #checkLimits(
    x: Exchange,
    client: MeteredClient,
    reply: FastifyReply,
    amount: string,
  ): Promise<LinkRefusal | undefined> {
    const refusal = await this.#parts.limits.check(x, client.apiKeyId, reply, amount);
    if (refusal?.decision !== 'rate_limited') return refusal;
    for (const o of this.#observers) o.refused?.(x, refusal);
    throw refusal.rate.error;
  }

  /** The paywall decision, and the hold when it lets the request in. */
  #hold(x: Exchange, amount: string): Promise<Admission> {
    const hold = () =>
      admit(this.#ctx, {
        project: x.project,
        model: x.model,
        pricing: x.pricing,
        externalId: x.externalId,
        amount,
        purpose: x.api.name,
        trigger: x.trigger,
      });
    return (x.span ? this.#parts.tracing.step('tollgate.hold', hold) : hold()).catch((err) => {
      this.#released(x); // a reservation made by the limits goes back
      throw err;
    });
  }

  /** A paywall refusal as the client is answered: the connect or top-up link. */
  #paywalled(x: Exchange, refusal: PaywallRefusal): LinkRefusal {
    x.userId = refusal.wallet?.userId ?? '';
    return {
      ok: false,
      decision: paywallDecision(refusal),
      link: this.#parts.paywall(x.project, x.externalId, refusal),
      paywall: refusal,
    };
  }

  /** Answers a refused request with its link reply in its API's shape; no provider call, no charge. */
  #refuse(x: Exchange, refusal: LinkRefusal, reply: FastifyReply): FastifyReply {
    for (const o of this.#observers) o.refused?.(x, refusal);
    this.#released(x);
    reply.header('x-tollgate-paywall', refusal.decision);
    const answer = x.api.refusal(refusal.link, x);
    if (answer.kind === 'stream') return sendStream(reply, answer.body);
    return reply.code(answer.status).send(answer.body);
  }

  /** Unmetered calls (`GET /v1/responses/{id}`, …) go to the provider (`default` unless named) as received. */
  async passthrough(request: PassthroughRequest, reply: FastifyReply, path: string, observe = same) {
    if (!request.upstreamProvider && !request.project.upstream) {
      throw new ApiError(503, 'service_unavailable', 'This project has no model provider configured.', {
        code: 'no_upstream',
      });
    }
    const watch = new ClientWatch(reply);
    try {
      const body =
        request.body === undefined || request.body === null ? undefined : JSON.stringify(request.body);
      const call = { method: request.method, path, body, signal: watch.abort.signal };
      const answer = await this.#parts.router.passthrough(
        request.project,
        { ...call, headers: request.upstreamHeaders },
        request.upstreamProvider,
      );
      return sendPassthrough(reply, observe(answer));
    } catch (err) {
      if (watch.gone) return abandon(reply);
      logUnreachable(this.#ctx.log, err, request.project.id);
      throw unsupportedEndpoint(err, 'Responses', path) ?? toClientError(err);
    } finally {
      watch.stop();
    }
  }

  /** Forwards a request answered at once, and relays the answer once it is charged. */
  async #complete(
    x: Exchange,
    provider: Provider,
    call: UpstreamCall,
    reply: FastifyReply,
    watch: ClientWatch,
  ): Promise<FastifyReply> {
    let text: string;
    let reading: AnswerReading;
    const upstreamStarted = performance.now();
    try {
      const answer = await provider.complete(call);
      text = answer.text;
      reading = x.api.read(answer.json);
      x.ids = reading.ids;
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
      pending: reading.pending,
    });
    for (const o of this.#observers) o.responded?.(x, upstreamMs);
    sendJsonText(reply, text);
    return reply;
  }

  /**
   * Forwards a streamed request and relays its events as they arrive, up to the output bound the hold
   * pays for; the stream's end is written once it is charged.
   */
  async #stream<B extends MeteredBody>(
    x: Exchange<B>,
    provider: Provider,
    call: UpstreamCall,
    reply: FastifyReply,
    watch: ClientWatch,
  ): Promise<FastifyReply> {
    const upstreamStarted = performance.now();
    let events: AsyncIterable<SseMessage>;
    try {
      events = await provider.stream(call);
    } catch (err) {
      watch.stop();
      if (watch.gone) return this.#abandoned(x, reply);
      throw this.#failed(x, err);
    }
    const reader = x.api.streamReader!(x);
    const sink = new SseSink(
      reply,
      // (Rate limit headers are only ever set when the project has limits.)
      this.#parts.limits.applies(x.project)
        ? { ...rateLimitHeaders(reply), ...streamHead(reply, x.requestId) }
        : streamHead(reply, x.requestId),
      () => {
        const upstreamMs = performance.now() - upstreamStarted;
        for (const o of this.#observers) o.responded?.(x, upstreamMs);
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
    x.ids = reader.ids;
    if (watch.gone || sink.destroyed) {
      this.#finish(x, {
        outcome: 'client_closed',
        usage: reader.usage,
        produced,
        finishReason: reader.finishReason,
        charge: forwarded > 0,
        pending: reader.pending,
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

  /** The client left before anything reached it: nothing is charged, there is no one to answer. */
  #abandoned(x: Exchange, reply: FastifyReply): FastifyReply {
    this.#finish(x, {
      outcome: 'client_closed',
      usage: undefined,
      produced: 0,
      finishReason: null,
      charge: false,
    });
    return abandon(reply);
  }

  /** Records an upstream failure (hold released, nothing charged) and returns the error to answer with. */
  #failed(x: Exchange, err: unknown): ApiError {
    this.#release(x);
    return this.#failure(x, err, true);
  }

  /**
   * A stream that failed after some of it reached the client: what reached it is charged (from the
   * provider's usage when it sent one, else Tollgate's count of the forwarded output, flagged as such),
   * the failure recorded as for any upstream failure. Nothing forwarded: released, as `#failed`.
   */
  #failedAfter(
    x: Exchange,
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
      pending: reader.pending,
    });
    return this.#failure(x, err, false);
  }

  /** The log of an upstream failure, the observers told, and the error to answer with. */
  #failure(x: Exchange, err: unknown, counted: boolean): ApiError {
    const error =
      // (Anthropic answers 404 for an unknown model: for Messages a 404 is the provider's own answer.)
      (x.api.name === 'chat' || x.api.name === 'messages'
        ? undefined
        : unsupportedEndpoint(err, x.api.title, x.api.upstreamPath)) ?? toClientError(err);
    if (!(err instanceof UpstreamError) && !(err instanceof ApiError))
      this.#ctx.log.error({ err, requestId: x.requestId }, `${x.api.name} request failed`);
    else logUnreachable(this.#ctx.log, err, x.project.id);
    for (const o of this.#observers) o.failed?.(x, err, error, counted);
    return error;
  }

  /** Nothing was served: the hold goes back. */
  #release(x: Exchange): void {
    this.#released(x);
    const hold = x.hold;
    if (!hold) return;
    x.hold = undefined;
    this.#parts.pending.track(this.#ctx.billing.release(hold), x, 'release');
  }

  #released(x: Exchange): void {
    for (const o of this.#observers) o.released?.(x);
  }

  /**
   * Counts a served request and charges it. Resolves once the charge committed (or failed and was
   * logged: the hold is then left to the sweeper); never rejects.
   */
  #finish(x: Exchange, end: Ending): Promise<unknown> {
    if (!end.charge) {
      for (const o of this.#observers) o.ended?.(x, end, undefined);
      this.#release(x);
      return Promise.resolve();
    }
    // charged up to the bounds the hold covered; reported usage above them is an anomaly, recorded
    const { usage, anomaly } = withinBounds(x, usageOf(x, end.usage, end.produced));
    for (const o of this.#observers) o.ended?.(x, end, usage);
    if (anomaly) for (const o of this.#observers) o.anomaly?.(x, anomaly);
    const hold = x.hold;
    x.hold = undefined;
    return this.#parts.pending.track(this.#settle(x, hold, usage, end, anomaly), x, 'settle');
  }

  /** After the request's `started` event: the charge, with its `proxy.request.completed` event. */
  async #settle(
    x: Exchange,
    hold: Hold | undefined,
    usage: TokenUsage,
    end: Ending,
    anomaly: UsageAnomaly | undefined,
  ): Promise<void> {
    await x.startedEvent;
    const completed = this.#parts.events.completed(x, usage, end);
    if (!hold) {
      if (completed) await this.#parts.events.record(x, 'proxy.request.completed', completed('0'));
      return;
    }
    const billing = this.#ctx.billing;
    const input = settleInput(x, hold, usage, end, completed, anomaly);
    const { charged } = await (x.span
      ? this.#parts.tracing.settle(x, () => billing.settle(input))
      : billing.settle(input));
    for (const o of this.#observers) o.settled?.(x, charged);
    // the chain's size for a request continuing it (chains.ts): after the charge, off the response path;
    // a background response's output is not known yet: its bound stands for it
    const output = end.pending ? (x.bound ?? 0) * x.choices : usage.output;
    if (x.ids && x.pricing.mode === 'per_token')
      this.#parts.pending.track(
        this.#parts.chains.record(x.project.id, x.ids, usage.input + output),
        x,
        'chain',
      );
    if (end.pending && charged !== '0') await this.onPending?.(x, end.pending, charged);
  }

  /** Records an answer still in the works, charged its hold (src/responses/background.ts). */
  onPending: ((x: Exchange, id: string, charged: string) => Promise<void>) | undefined;

  /** A GET of a provider path for the project, unmetered (background responses' poller). */
  retrieve(project: ProjectContext, path: string, signal: AbortSignal): Promise<PassthroughAnswer> {
    return this.#parts.router.passthrough(project, { method: 'GET', path, body: undefined, signal });
  }
}

/** A passthrough answer as is (`passthrough` may be given an observer of the answer instead). */
const same = (answer: PassthroughAnswer) => answer;

/** What the flow uses of the app (the composition root passes its context). */
export interface MeteringContext {
  config: Pick<Config, 'DEFAULT_MAX_COMPLETION_TOKENS'>;
  billing: Pick<BillingService, 'hold' | 'subscription' | 'settle' | 'release'>;
  log: Logger;
}

/** The flow's collaborators, built once (plugin.ts). */
export interface MeteringParts {
  router: Router;
  /** The connect or top-up link of a refused user (src/paywall/replies.ts). */
  paywall: (project: ProjectContext, externalId: string, refusal: PaywallRefusal) => LinkReply;
  pending: Pending;
  /** The recorded sizes of Responses chains (chains.ts). */
  chains: ResponseChains;
  limits: LimitsObserver;
  metrics: MetricsObserver;
  events: EventsObserver;
  tracing: TracingObserver;
  /** The facts of each request's log line (request-log.ts). */
  requestLog: RequestLogObserver;
}
