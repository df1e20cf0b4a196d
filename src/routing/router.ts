import type { Agent } from 'undici';
import type { Config } from '../config/index.ts';
import type { ModelRoute, ModelRow } from '../db/schema.ts';
import type { EventType } from '../events/catalog.ts';
import { HOP_HEADER, hopId } from '../net/hop.ts';
import type { ProjectContext, ProviderConfig } from '../projects/directory.ts';
import { DEFAULT_PROVIDER, ECHO_UPSTREAM } from '../projects/service.ts';
import { failed, type Span, SpanKind, type Tracing, withTraceHeaders } from '../tracing/index.ts';
import { ChatOverMessages } from '../upstream/anthropic/chat-over-messages.ts';
import { MessagesOverChat } from '../upstream/anthropic/messages-over-chat.ts';
import { anthropicProvider } from '../upstream/anthropic/provider.ts';
import { EchoProvider } from '../upstream/echo.ts';
import { createUpstreamAgent, OpenAICompatibleProvider } from '../upstream/openai-compatible.ts';
import {
  isAbort,
  type PassthroughAnswer,
  type PassthroughCall,
  type Provider,
  type UpstreamCall,
  UpstreamError,
} from '../upstream/types.ts';
import { CircuitBreakers } from './breaker.ts';

/**
 * Routing: a model's routes (pricing file `routes`; by default the provider `default` with the model's
 * `upstreamModel`) are tried in priority order, routes of equal priority in a random order weighted by
 * `weight`. A connect error, a time-out, a 429 or a 5xx before any byte reached the client moves to the
 * next route, within `ROUTING_MAX_ATTEMPTS` attempts and one `ROUTING_DEADLINE_MS` deadline; a 429's
 * `Retry-After` keeps the route aside until then (waited for when no other route is left and it fits the
 * deadline). Each route has a circuit breaker (breaker.ts).
 *
 * The flow sees one Provider (`Router.provider`): money is untouched here — the hold was placed once
 * before the first attempt and the flow settles once, for the attempt that answered, at the price of the
 * model the client asked for.
 */
export interface RoutingSettings {
  maxAttempts: number;
  deadlineMs: number;
  circuitFailures: number;
  circuitCooldownMs: number;
}

/** What the router reads of the app: its settings and tracing (the app context passes itself). */
export interface RouterHost {
  config: Pick<
    Config,
    | 'ROUTING_MAX_ATTEMPTS'
    | 'ROUTING_DEADLINE_MS'
    | 'ROUTING_CIRCUIT_FAILURES'
    | 'ROUTING_CIRCUIT_COOLDOWN_MS'
    | 'UPSTREAM_RESPONSE_TIMEOUT_MS'
    | 'TOLLGATE_ALLOW_PRIVATE_PROVIDERS'
  >;
  tracing: Tracing;
  /** Signs this deployment's hop id (src/net/hop.ts). */
  sealer: { sign(data: string): string };
}

/** Receives the routing events of one request (the flow writes them after its `started` event). */
export type RoutingReport = (type: EventType, data: Record<string, unknown>) => void;

interface Candidate {
  route: ModelRoute;
  key: string;
}

/** Marks the error of an attempt that was already reported as `routing.upstream.failed`. */
const reported = new WeakSet<object>();

/** True when the router already recorded `routing.upstream.failed` for this error. */
export function routingReported(err: unknown): boolean {
  return typeof err === 'object' && err !== null && reported.has(err);
}

export class Router {
  readonly breakers: CircuitBreakers;
  readonly #settings: RoutingSettings;
  readonly #agent: Agent;
  readonly #responseMs: number;
  readonly #allowPrivate: boolean;
  readonly #agents = new Map<number, Agent>();
  /** The echo provider answers the Messages API through Chat Completions, like any OpenAI-compatible one. */
  readonly #echo = new MessagesOverChat(new EchoProvider());
  readonly #providers = new WeakMap<object, Provider>();
  /** Route key → time before which a 429's Retry-After keeps the route aside. */
  readonly #blocked = new Map<string, number>();
  readonly #tracing: Tracing;
  /** This deployment's hop header, on every provider request (src/net/hop.ts). */
  readonly #hop: Record<string, string>;

  constructor(ctx: RouterHost, agent: Agent) {
    const c = ctx.config;
    this.#tracing = ctx.tracing;
    this.#hop = { [HOP_HEADER]: hopId(ctx.sealer) };
    this.#settings = {
      maxAttempts: c.ROUTING_MAX_ATTEMPTS,
      deadlineMs: c.ROUTING_DEADLINE_MS,
      circuitFailures: c.ROUTING_CIRCUIT_FAILURES,
      circuitCooldownMs: c.ROUTING_CIRCUIT_COOLDOWN_MS,
    };
    this.#agent = agent;
    this.#responseMs = c.UPSTREAM_RESPONSE_TIMEOUT_MS;
    this.#allowPrivate = c.TOLLGATE_ALLOW_PRIVATE_PROVIDERS;
    this.breakers = new CircuitBreakers({
      failures: this.#settings.circuitFailures,
      cooldownMs: this.#settings.circuitCooldownMs,
    });
  }

  async close(): Promise<void> {
    await Promise.all([...this.#agents.values()].map((a) => a.close()));
  }

  /** The provider of one metered request: every call goes through the model's routes. */
  provider(project: ProjectContext, model: ModelRow, report: RoutingReport): Provider {
    return {
      complete: (call) => this.#run(project, model, call, report, (p, c) => p.complete(c)),
      stream: (call) => this.#run(project, model, call, report, (p, c) => p.stream(c)),
      passthrough: (call) => this.passthrough(project, call),
    };
  }

  /** Unmetered calls go to the provider `default` (or the one named: a model's route). */
  passthrough(
    project: ProjectContext,
    call: PassthroughCall,
    provider: string = DEFAULT_PROVIDER,
  ): Promise<PassthroughAnswer> {
    const config = project.providers.get(provider);
    if (!config) throw new UpstreamError('connection', `The project has no provider '${provider}'.`);
    return this.#client(config).passthrough(call);
  }

  /** The routes of a model in the order to try them (weighted shuffle within a priority). */
  order(project: ProjectContext, model: ModelRow): Candidate[] {
    const routes = model.routes?.length
      ? model.routes
      : [{ provider: DEFAULT_PROVIDER, model: model.upstream_model }];
    if (routes.length === 1) return [{ route: routes[0]!, key: routeKey(project.id, routes[0]!) }];
    const keyed = routes.map((route, i) => ({
      route,
      priority: route.priority ?? i,
      // Efraimidis–Spirakis: sorting by u^(1/w) descending draws without replacement in proportion to w.
      draw: Math.random() ** (1 / Math.max(route.weight ?? 1, 1e-9)),
    }));
    keyed.sort((a, b) => a.priority - b.priority || b.draw - a.draw);
    return keyed.map((k) => ({ route: k.route, key: routeKey(project.id, k.route) }));
  }

  async #run<T>(
    project: ProjectContext,
    model: ModelRow,
    call: UpstreamCall,
    report: RoutingReport,
    op: (provider: Provider, call: UpstreamCall) => Promise<T>,
  ): Promise<T> {
    const started = Date.now();
    const deadline = started + this.#settings.deadlineMs;
    const pending = this.order(project, model);
    let attempts = 0;
    let last: unknown;
    let firstRoute: Candidate | undefined;
    while (attempts < this.#settings.maxAttempts) {
      const next = await this.#next(pending, deadline, call.signal);
      if (!next) break;
      const { candidate, probe } = next;
      firstRoute ??= candidate;
      attempts++;
      const config = project.providers.get(candidate.route.provider);
      const attempt = new AbortController();
      const onAbort = () => attempt.abort(call.signal.reason);
      call.signal.addEventListener('abort', onAbort, { once: true });
      let expired = false;
      const timer = setTimeout(() => {
        expired = true;
        attempt.abort();
      }, deadline - Date.now());
      // Tracing: one client span per attempt; its `traceparent` goes to the provider.
      const span = this.#tracing.enabled ? this.#attemptSpan(candidate, attempts) : undefined;
      try {
        if (!config) {
          throw new UpstreamError('connection', `The project has no provider '${candidate.route.provider}'.`);
        }
        const client = this.#client(config);
        const upstreamCall: UpstreamCall = {
          path: call.path,
          // (The flow already named the model's own upstream model: no copy for the usual single route.)
          body:
            call.body.model === candidate.route.model
              ? call.body
              : { ...call.body, model: candidate.route.model },
          signal: attempt.signal,
          headers: withTraceHeaders(span, call.headers),
          onDropped: call.onDropped,
        };
        const answer = await (span
          ? this.#tracing.run(span, () => op(client, upstreamCall))
          : op(client, upstreamCall));
        clearTimeout(timer);
        span?.setAttribute('tollgate.outcome', 'success');
        span?.end();
        this.#answered(model, candidate, attempts, firstRoute, report);
        return answer;
      } catch (caught) {
        clearTimeout(timer);
        call.signal.removeEventListener('abort', onAbort);
        if (span) endFailedAttempt(span, caught, call.signal.aborted);
        let err = caught;
        if (call.signal.aborted) {
          // The client left (or the flow stopped the request): no verdict on the route.
          if (probe) this.breakers.abandon(candidate.key);
          throw err;
        }
        if (expired && (isAbort(err) || err instanceof UpstreamError)) {
          err = new UpstreamError('timeout', 'The routing deadline passed before a provider answered.', {
            cause: caught,
          });
        }
        if (!retriable(err)) {
          if (probe) this.breakers.abandon(candidate.key);
          throw err;
        }
        const upstream = err as UpstreamError;
        if (config && this.breakers.failure(candidate.key)) {
          report('routing.circuit.opened', {
            ...circuitData(model, candidate),
            failures: this.#settings.circuitFailures,
            cooldownMs: this.#settings.circuitCooldownMs,
          });
        }
        const retryAfterMs =
          upstream.upstreamStatus === 429 ? parseRetryAfter(upstream.retryAfter) : undefined;
        if (retryAfterMs !== undefined) this.#blocked.set(candidate.key, Date.now() + retryAfterMs);
        reported.add(upstream);
        report('routing.upstream.failed', {
          model: model.id,
          provider: candidate.route.provider,
          upstreamModel: candidate.route.model,
          attempt: attempts,
          upstreamStatus: upstream.upstreamStatus ?? null,
          reason: `${upstream.kind}: ${upstream.message}`,
        });
        last = upstream;
        if (expired) break;
        // A 429 with Retry-After may be tried again (after the wait) when no other route is left.
        if (retryAfterMs !== undefined && retryAfterMs < deadline - Date.now()) pending.push(candidate);
      }
    }
    if (last) throw last;
    throw new UpstreamError(
      'connection',
      'Every route of this model is failing (its circuit breakers are open); try again later.',
    );
  }

  /** The client span of one attempt. */
  #attemptSpan(candidate: Candidate, attempt: number): Span | undefined {
    return this.#tracing.start(
      'tollgate.provider.attempt',
      {
        'tollgate.provider': candidate.route.provider,
        'gen_ai.request.model': candidate.route.model,
        'tollgate.attempt': attempt,
      },
      { kind: SpanKind.CLIENT },
    );
  }

  /** After a route answered: its circuit closes (reported if it was open), a fallback is reported. */
  #answered(
    model: ModelRow,
    candidate: Candidate,
    attempts: number,
    firstRoute: Candidate,
    report: RoutingReport,
  ): void {
    if (this.breakers.success(candidate.key)) {
      report('routing.circuit.closed', circuitData(model, candidate));
    }
    if (attempts > 1) {
      report('routing.fallback.used', {
        model: model.id,
        provider: candidate.route.provider,
        upstreamModel: candidate.route.model,
        attempts,
        firstProvider: firstRoute.route.provider,
      });
    }
  }

  /**
   * The next route to try: the first pending one whose circuit lets it through and that no Retry-After
   * keeps aside; when only kept-aside ones are left, waits for the earliest if the deadline allows.
   */
  async #next(
    pending: Candidate[],
    deadline: number,
    signal: AbortSignal,
  ): Promise<{ candidate: Candidate; probe: boolean } | undefined> {
    for (;;) {
      const now = Date.now();
      let wait: { index: number; until: number } | undefined;
      for (let i = 0; i < pending.length; i++) {
        const candidate = pending[i]!;
        const until = this.#blocked.get(candidate.key);
        if (until !== undefined && until > now) {
          if (!wait || until < wait.until) wait = { index: i, until };
          continue;
        }
        if (until !== undefined) this.#blocked.delete(candidate.key);
        const pass = this.breakers.pass(candidate.key, now);
        if (pass === 'open') {
          pending.splice(i--, 1);
          continue;
        }
        pending.splice(i, 1);
        return { candidate, probe: pass === 'probe' };
      }
      if (!wait || wait.until >= deadline || signal.aborted) return undefined;
      await sleep(wait.until - now, signal);
    }
  }

  #client(config: ProviderConfig): Provider {
    if (config.baseUrl === ECHO_UPSTREAM) return this.#echo;
    let provider = this.#providers.get(config);
    if (!provider) {
      // By kind: Anthropic's Messages API, which answers Chat Completions requests through Messages
      // (src/upstream/anthropic/chat-over-messages.ts); an OpenAI-compatible API, which answers Messages
      // requests through Chat Completions (src/upstream/anthropic/messages-over-chat.ts).
      const agent = this.#agentFor(config.connectMs);
      provider =
        config.kind === 'anthropic'
          ? new ChatOverMessages(
              anthropicProvider(agent, config.baseUrl, config.apiKey, config.responseMs, this.#hop),
            )
          : new MessagesOverChat(
              new OpenAICompatibleProvider(agent, config.baseUrl, config.apiKey, config.responseMs, {
                headers: this.#hop,
              }),
            );
      this.#providers.set(config, provider);
    }
    return provider;
  }

  #agentFor(connectMs: number | undefined): Agent {
    if (connectMs === undefined) return this.#agent;
    let agent = this.#agents.get(connectMs);
    if (!agent) {
      agent = createUpstreamAgent({
        connectMs,
        responseMs: this.#responseMs,
        allowPrivate: this.#allowPrivate,
      });
      this.#agents.set(connectMs, agent);
    }
    return agent;
  }
}

export function routeKey(projectId: string, route: ModelRoute): string {
  return `${projectId}\u0000${route.provider}\u0000${route.model}`;
}

/** Failures that move to the next route: nothing reached the client yet, and another route may answer. */
function retriable(err: unknown): boolean {
  if (!(err instanceof UpstreamError)) return false;
  if (err.kind === 'connection' || err.kind === 'timeout') return true;
  if (err.kind !== 'status') return false;
  const status = err.upstreamStatus ?? 502;
  return status === 429 || status >= 500;
}

/** Ends the span of an attempt that failed: its outcome, the provider's status, the error. */
function endFailedAttempt(span: Span, caught: unknown, aborted: boolean): void {
  span.setAttribute(
    'tollgate.outcome',
    aborted ? 'aborted' : caught instanceof UpstreamError ? caught.kind : 'error',
  );
  if (caught instanceof UpstreamError && caught.upstreamStatus !== undefined)
    span.setAttribute('http.response.status_code', caught.upstreamStatus);
  failed(span, caught);
  span.end();
}

function circuitData(model: ModelRow, candidate: Candidate) {
  return { model: model.id, provider: candidate.route.provider, upstreamModel: candidate.route.model };
}

/** `Retry-After` in milliseconds (seconds or an HTTP date); undefined when absent or unreadable. */
export function parseRetryAfter(value: string | undefined, now = Date.now()): number | undefined {
  if (!value) return undefined;
  const trimmed = value.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.round(Number(trimmed) * 1000);
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
