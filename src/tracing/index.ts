import { AsyncLocalStorage } from 'node:async_hooks';
import {
  type Attributes,
  type Link,
  type Span,
  type SpanContext,
  SpanKind,
  SpanStatusCode,
} from '@opentelemetry/api';
import type { SpanExporter } from '@opentelemetry/sdk-trace';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';

/**
 * Traces (OpenTelemetry), off by default. On when `OTEL_TRACES_EXPORTER=otlp`, or when an OTLP endpoint
 * is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`) and
 * `OTEL_TRACES_EXPORTER` is not `none`. Spans go over OTLP/HTTP (`http/protobuf` or `http/json`) in
 * batches. The tracer provider belongs to the app context (not registered globally); the active span
 * is kept in this module's AsyncLocalStorage, entered only while tracing is on, so the hot path of an
 * untraced process creates no span objects and the log mixin finds nothing. The SDK, the exporters and
 * the W3C propagator (./sdk.ts) are imported only when tracing is on: an untraced process never loads
 * them.
 */

export type { Span };

/** The span of the code running now (only ever set while some context traces; ./sdk.ts enters it). */
export const active = new AsyncLocalStorage<Span>();

/** ./sdk.ts once some context started tracing (spans only exist from then on). */
let sdk: typeof import('./sdk.ts') | undefined;

function loaded(): typeof import('./sdk.ts') {
  if (!sdk) throw new Error('tracing: a span exists but the SDK was never started');
  return sdk;
}

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

export interface TracingOptions {
  /** Replaces the OTLP exporter (tests). */
  exporter?: SpanExporter;
  /** Batch delay (default 1 s). */
  scheduledDelayMillis?: number;
}

/** Starts tracing when the settings turn it on (importing the SDK then); else the no-op tracing. */
export async function startTracing(
  config: Config,
  log?: Logger,
  options: TracingOptions = {},
): Promise<Tracing> {
  if (!tracingEnabled(config)) return off;
  sdk ??= await import('./sdk.ts');
  return sdk.startSdkTracing(config, log, options);
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
  return loaded().traceparentOf(span);
}

/** Headers with the `traceparent` (and `tracestate`) of `span` added; `headers` as is without one. */
export function withTraceHeaders(
  span: Span | undefined,
  headers: Record<string, string> | undefined,
): Record<string, string> | undefined {
  if (!span) return headers;
  return loaded().withTraceHeaders(span, headers);
}

/** A span link to the trace of a stored `traceparent` (an event's), or none when it is unreadable. */
export function linkTo(traceparent: unknown): Link[] {
  if (typeof traceparent !== 'string') return [];
  const context: SpanContext | null = loaded().parseTraceParent(traceparent);
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
