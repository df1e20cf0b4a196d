import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions, Logger } from 'pino';

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
