import {
  type Context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  ROOT_CONTEXT,
  type Span,
  type SpanContext,
  SpanKind,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { parseTraceParent as parseW3c, W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  TraceIdRatioBasedSampler,
  TracerProvider,
} from '@opentelemetry/sdk-trace';
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { active, failed, type Tracing, type TracingOptions, tracesUrl } from './index.ts';

/**
 * The OpenTelemetry SDK side of ./index.ts, imported by `startTracing` only when tracing is on: the
 * tracer provider, the OTLP exporters, the samplers and the W3C `traceparent` propagator.
 */

const propagator = new W3CTraceContextPropagator();

export function traceparentOf(span: Span): string {
  const carrier: Record<string, string> = {};
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier.traceparent!;
}

export function withTraceHeaders(
  span: Span,
  headers: Record<string, string> | undefined,
): Record<string, string> {
  const carrier: Record<string, string> = { ...headers };
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier;
}

export function parseTraceParent(traceparent: string): SpanContext | null {
  return parseW3c(traceparent);
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

/** Tracing on: an OTLP/HTTP exporter behind a batch processor, the settings' sampler. */
export function startSdkTracing(config: Config, log: Logger | undefined, options: TracingOptions): Tracing {
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
