import { AsyncLocalStorage } from 'node:async_hooks';
import {
  type Attributes,
  type Context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  type Link,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { parseTraceParent, W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  type SpanExporter,
  TraceIdRatioBasedSampler,
  TracerProvider,
} from '@opentelemetry/sdk-trace';
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';

/**
 * Traces (OpenTelemetry), off by default. On when `OTEL_TRACES_EXPORTER=otlp`, or when an OTLP endpoint
 * is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`) and
 * `OTEL_TRACES_EXPORTER` is not `none`. Spans go over OTLP/HTTP (`http/protobuf` or `http/json`) in
 * batches. The tracer provider belongs to the app context (not registered globally); the active span
 * is kept in this module's AsyncLocalStorage, entered only while tracing is on, so the hot path of an
 * untraced process creates no span objects and the log mixin finds nothing.
 */

export type { Span };

/** The span of the code running now (only ever set while some context traces). */
const active = new AsyncLocalStorage<Span>();
const propagator = new W3CTraceContextPropagator();

export interface Tracing {
  readonly enabled: boolean;
  /** A server span for an incoming request, continuing the W3C `traceparent` of its headers. */
  startServer(name: string, headers: Record<string, unknown>, attributes?: Attributes): Span | undefined;
  /** A span, child of the active one (or a root with `links`); not active until passed to `run`. */
  start(
    name: string,
    attributes?: Attributes,
    options?: { kind?: SpanKind; links?: Link[]; root?: boolean },
  ): Span | undefined;
  /** Runs `fn` with `span` active (its children and log lines see it); `fn` as is when undefined. */
  run<T>(span: Span | undefined, fn: () => T): T;
  /** Starts a child span, runs `fn` in it, ends it (an error sets its status and goes on). */
  span<T>(name: string, attributes: Attributes | undefined, fn: (span?: Span) => Promise<T>): Promise<T>;
  /** Sends what is buffered and stops; further spans are dropped. */
  shutdown(): Promise<void>;
  /** Sends what is buffered now (tests). */
  flush(): Promise<void>;
}

const off: Tracing = {
  enabled: false,
  startServer: () => undefined,
  start: () => undefined,
  run: (_span, fn) => fn(),
  span: (_name, _attributes, fn) => fn(undefined),
  shutdown: async () => {},
  flush: async () => {},
};

/** A tracing that does nothing (tracing off). */
export const tracingOff: Tracing = off;

/** Whether the settings turn tracing on (see the rule above). */
export function tracingEnabled(config: Config): boolean {
  if (config.OTEL_TRACES_EXPORTER === 'none' || config.OTEL_SDK_DISABLED) return false;
  if (config.OTEL_TRACES_EXPORTER === 'otlp') return true;
  return Boolean(config.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || config.OTEL_EXPORTER_OTLP_ENDPOINT);
}

/** The URL spans are posted to. */
export function tracesUrl(config: Config): string {
  if (config.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return config.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
  const base = (config.OTEL_EXPORTER_OTLP_ENDPOINT ?? 'http://localhost:4318').replace(/\/+$/, '');
  return `${base}/v1/traces`;
}

function samplerOf(config: Config): Sampler {
  const ratio = config.OTEL_TRACES_SAMPLER_ARG ?? 1;
  switch (config.OTEL_TRACES_SAMPLER) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(ratio);
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
    default:
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
  }
}

export interface TracingOptions {
  /** Replaces the OTLP exporter (tests). */
  exporter?: SpanExporter;
  /** Batch delay (default 1 s). */
  scheduledDelayMillis?: number;
}

/** Starts tracing when the settings turn it on; else the no-op tracing. */
export function startTracing(config: Config, log?: Logger, options: TracingOptions = {}): Tracing {
  if (!tracingEnabled(config)) return off;
  const url = tracesUrl(config);
  // Headers (OTEL_EXPORTER_OTLP_HEADERS, …) are read by the exporter from the environment itself.
  const exporter =
    options.exporter ??
    (config.OTEL_EXPORTER_OTLP_PROTOCOL === 'http/json'
      ? new JsonExporter({ url })
      : new ProtoExporter({ url }));
  const provider = new TracerProvider({
    resource: resourceFromAttributes({
      [ATTR_SERVICE_NAME]: config.OTEL_SERVICE_NAME,
      [ATTR_SERVICE_VERSION]: process.env.npm_package_version ?? '0.1.0',
    }),
    sampler: samplerOf(config),
    spanProcessors: [
      new BatchSpanProcessor({ exporter, scheduledDelayMillis: options.scheduledDelayMillis ?? 1000 }),
    ],
  });
  const tracer: Tracer = provider.getTracer('tollgate');
  // (debug: CLI commands build the same context and print to stdout)
  log?.debug(
    { url, protocol: config.OTEL_EXPORTER_OTLP_PROTOCOL },
    'tracing: exporting spans over OTLP/HTTP',
  );
  const parent = (): Context => {
    const span = active.getStore();
    return span ? trace.setSpan(ROOT_CONTEXT, span) : ROOT_CONTEXT;
  };
  let closed: Promise<void> | undefined;
  const tracing: Tracing = {
    enabled: true,
    startServer(name, headers, attributes) {
      const from = propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
      return tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, from);
    },
    start(name, attributes, opts = {}) {
      return tracer.startSpan(
        name,
        { kind: opts.kind ?? SpanKind.INTERNAL, attributes, links: opts.links },
        opts.root ? ROOT_CONTEXT : parent(),
      );
    },
    run(span, fn) {
      return span ? active.run(span, fn) : fn();
    },
    async span(name, attributes, fn) {
      const span = tracing.start(name, attributes)!;
      try {
        return await active.run(span, () => fn(span));
      } catch (err) {
        failed(span, err);
        throw err;
      } finally {
        span.end();
      }
    },
    shutdown() {
      closed ??= provider.shutdown().catch((err) => log?.warn({ err }, 'tracing: shutdown failed'));
      return closed;
    },
    flush: () => provider.forceFlush(),
  };
  return tracing;
}

/** Marks a span failed with the error's message (never a request body). */
export function failed(span: Span | undefined, err: unknown): void {
  if (!span) return;
  span.setStatus({
    code: SpanStatusCode.ERROR,
    message: err instanceof Error ? err.message : String(err),
  });
}

/** The W3C `traceparent` of the active span, when one is being recorded. */
export function activeTraceparent(): string | undefined {
  const span = active.getStore();
  if (!span?.isRecording()) return undefined;
  return traceparentOf(span);
}

export function traceparentOf(span: Span): string {
  const carrier: Record<string, string> = {};
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier.traceparent!;
}

/** Headers with the `traceparent` (and `tracestate`) of `span` added; `headers` as is without one. */
export function withTraceHeaders(
  span: Span | undefined,
  headers: Record<string, string> | undefined,
): Record<string, string> | undefined {
  if (!span) return headers;
  const carrier: Record<string, string> = { ...headers };
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier;
}

/** A span link to the trace of a stored `traceparent` (an event's), or none when it is unreadable. */
export function linkTo(traceparent: unknown): Link[] {
  if (typeof traceparent !== 'string') return [];
  const context = parseTraceParent(traceparent);
  return context ? [{ context }] : [];
}

/** Trace and span ids for log lines written while a span is active (the pino mixin). */
export function logTraceIds(): Record<string, string> {
  const span = active.getStore();
  if (!span) return {};
  const c = span.spanContext();
  return { traceId: c.traceId, spanId: c.spanId };
}

export { SpanKind, SpanStatusCode };
