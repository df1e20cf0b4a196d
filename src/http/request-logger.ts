import { createHmac, createSecretKey } from 'node:crypto';
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Bindings, ChildLoggerOptions, Logger } from 'pino';
import { countInvalidRequest } from '../metering/metrics-observer.ts';
import { meteredFacts } from '../metering/request-log.ts';
import type { ProjectContext } from '../projects/directory.ts';

type Level = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace';
type LogArgs = Parameters<FastifyBaseLogger['info']>;
/** The logger fastify hands the factory: the app's pino logger (ctx.log) with fastify's serialisers. */
type Parent = FastifyBaseLogger & Pick<Logger, 'isLevelEnabled' | 'bindings'>;

/**
 * `request.log`, made lazily: fastify gives every request a pino child logger bound to its request id,
 * and making one costs more than most of the request's own work (pino serialises the bindings and
 * re-applies the redaction paths each time). Most requests write no line, so the child is made when
 * the first line at an enabled level is written — the same child, with the same bindings, as fastify's
 * default factory makes; what is written is unchanged.
 */
export function requestLogger(
  logger: FastifyBaseLogger,
  bindings: Bindings,
  options: ChildLoggerOptions,
): FastifyBaseLogger {
  const parent = logger as Parent;
  // A route with its own level or serialisers: the child at once (its level decides, not the parent's).
  if (options.level !== undefined || options.serializers !== undefined)
    return parent.child(bindings, options);
  return new RequestLogger(parent, bindings, options) as unknown as FastifyBaseLogger;
}

class RequestLogger {
  readonly #parent: Parent;
  readonly #bindings: Bindings;
  readonly #options: ChildLoggerOptions;
  #child: Parent | undefined;

  constructor(parent: Parent, bindings: Bindings, options: ChildLoggerOptions) {
    this.#parent = parent;
    this.#bindings = bindings;
    this.#options = options;
  }

  #real(): Parent {
    this.#child ??= this.#parent.child(this.#bindings, this.#options) as Parent;
    return this.#child;
  }

  #write(level: Level, args: LogArgs): void {
    if (this.#child === undefined && !this.#parent.isLevelEnabled(level)) return;
    (this.#real()[level] as (...a: LogArgs) => void)(...args);
  }

  get level(): string {
    return this.#child?.level ?? this.#parent.level;
  }

  set level(level: string) {
    this.#real().level = level;
  }

  isLevelEnabled(level: string): boolean {
    return (this.#child ?? this.#parent).isLevelEnabled(level);
  }

  bindings(): Bindings {
    return this.#real().bindings();
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.#real().child(bindings, options);
  }

  fatal(...args: LogArgs): void {
    this.#write('fatal', args);
  }
  error(...args: LogArgs): void {
    this.#write('error', args);
  }
  warn(...args: LogArgs): void {
    this.#write('warn', args);
  }
  info(...args: LogArgs): void {
    this.#write('info', args);
  }
  debug(...args: LogArgs): void {
    this.#write('debug', args);
  }
  trace(...args: LogArgs): void {
    this.#write('trace', args);
  }
  silent(): void {}
}

/** The metered APIs' routes: a 4xx there that the flow never saw is Tollgate's own validation refusing it. */
const METERED_ROUTES = new Set(['/v1/chat/completions', '/v1/responses', '/v1/embeddings', '/v1/messages']);

/**
 * One line per `/v1` request at `info` (the default level), written when its response ends (a stream:
 * after its last byte): `reqId`, `method`, the route template (never the URL's query, never the body),
 * `status`, `ms`, the project and, for a metered request, Tollgate's `requestId`, the `model`, the
 * `decision` (`allowed`, `connect_required`, `topup_required`, `spend_cap_reached`, `rate_limited`,
 * `invalid_request`), the `outcome`, the amount `charged` and its `currency`, and `user`: a keyed hash
 * of the end user (the same user, the same hash, in one deployment; the id itself is never written).
 * Other routes get the one debug line they had. A metered request refused by Tollgate's validation
 * before the flow saw it (its schema, an unknown model) is counted here as `invalid_request`
 * (metrics-observer.ts).
 *
 * Registered on the root instance, before the routes, so it sees every request (unknown `/v1` URLs too).
 */
export function logRequests(app: FastifyInstance): void {
  const { log, sealer, metrics } = app.ctx;
  const userHash = userHasher(sealer.sign('tollgate/log-user'));
  app.addHook('onResponse', (request: FastifyRequest, reply: FastifyReply, done: () => void) => {
    if (!request.url.startsWith('/v1/')) {
      if (log.isLevelEnabled('debug')) {
        request.log.debug(
          {
            method: request.method,
            url: request.url,
            status: reply.statusCode,
            ms: Math.round(reply.elapsedTime),
          },
          'request',
        );
      }
      return done();
    }
    const route = request.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    const project = (request as { project?: ProjectContext | null }).project ?? undefined;
    const facts = meteredFacts(request.body);
    let invalid: string | undefined;
    if (
      !facts &&
      project &&
      status >= 400 &&
      status < 500 &&
      status !== 401 &&
      status !== 403 &&
      status !== 429
    ) {
      if (request.method === 'POST' && METERED_ROUTES.has(route)) {
        invalid = knownModel(request.body, project);
        countInvalidRequest(metrics, project.id, invalid, streamed(request.body));
      }
    }
    if (!log.isLevelEnabled('info')) return done();
    const line: Record<string, unknown> = {
      reqId: request.id,
      method: request.method,
      route,
      status,
      ms: Math.round(reply.elapsedTime),
    };
    if (project) line.project = project.id;
    if (facts) {
      line.requestId = facts.requestId;
      line.model = facts.model;
      line.decision = facts.decision;
      if (facts.outcome) line.outcome = facts.outcome;
      line.charged = facts.charged ?? '0';
      line.currency = facts.currency;
      line.user = userHash(facts.project, facts.externalId);
    } else if (invalid !== undefined) {
      if (invalid) line.model = invalid;
      line.decision = 'invalid_request';
    }
    log.info(line, 'request');
    done();
  });
}

/**
 * A keyed hash of an end user (12 base64url characters of an HMAC-SHA256 under a key derived from the
 * encryption key), kept for the users seen lately: one HMAC per user, not per request.
 */
function userHasher(secret: string): (project: string, user: string) => string {
  const key = createSecretKey(Buffer.from(secret, 'base64url'));
  const seen = new Map<string, string>();
  return (project, user) => {
    const id = `${project}\u0000${user}`;
    let hash = seen.get(id);
    if (hash === undefined) {
      hash = createHmac('sha256', key).update(id).digest('base64url').slice(0, 12);
      if (seen.size >= 10_000) seen.clear();
      seen.set(id, hash);
    }
    return hash;
  };
}

/** The body's model when the project has it ("" otherwise: the metrics' labels stay bounded). */
function knownModel(body: unknown, project: ProjectContext): string {
  const model = typeof body === 'object' && body !== null ? (body as { model?: unknown }).model : undefined;
  return typeof model === 'string' && project.models.has(model) ? model : '';
}

function streamed(body: unknown): boolean {
  return typeof body === 'object' && body !== null && (body as { stream?: unknown }).stream === true;
}
