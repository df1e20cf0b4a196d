import { ApiError } from '../core/errors.ts';
import { failed, type Span, SpanStatusCode, type Tracing } from '../tracing/index.ts';
import type { Admission } from './admission.ts';
import type { Exchange, MeteredApi, MeteredBody } from './api.ts';
import type { TokenUsage } from './cost.ts';
import {
  type Ending,
  type LinkRefusal,
  type MeteringObserver,
  paywallDecision,
  type Refusal,
} from './observer.ts';

/**
 * The spans of metered requests (src/tracing), when tracing is on: a server span per request continuing
 * the client's `traceparent` (`x.span`), with a `tollgate.admission` child (itself with `tollgate.limits`
 * and `tollgate.hold` children) and a `tollgate.settle` child; the decision, the usage and the amount
 * charged as attributes. Never the end user or the prompt. Tracing off: the flow calls none of the
 * wrappers below (no span, no extra promise), and the hooks find no `x.span`.
 */
export class TracingObserver implements MeteringObserver {
  readonly #tracing: Tracing;

  constructor(tracing: Tracing) {
    this.#tracing = tracing;
  }

  get enabled(): boolean {
    return this.#tracing.enabled;
  }

  /** Runs `handle` in the server span of the request; the answer's status goes on the span. */
  async request<B extends MeteredBody, T>(
    api: MeteredApi<B>,
    body: B,
    client: { project: Exchange['project']; headers: Record<string, unknown> },
    reply: { readonly statusCode: number },
    handle: (span: Span | undefined) => Promise<T>,
  ): Promise<T> {
    const tracing = this.#tracing;
    // (Named by the model only when the project has it: a span name is not for arbitrary client text.)
    const known = client.project.models.has(body.model);
    const span = tracing.startServer(known ? `${api.name} ${body.model}` : api.name, client.headers, {
      'tollgate.api': api.name,
      'tollgate.project.id': client.project.id,
      'gen_ai.request.model': String(body.model).slice(0, 200),
      'tollgate.stream': body.stream === true,
    });
    try {
      const answered = await tracing.run(span, () => handle(span));
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

  /** Runs the admission (limits, then the hold) in a `tollgate.admission` span; the paywall's decision on it. */
  async admission<T extends Admission | LinkRefusal>(amount: string, admit: () => Promise<T>): Promise<T> {
    const tracing = this.#tracing;
    const span = tracing.start('tollgate.admission', { 'tollgate.amount.held': amount });
    try {
      const admission = await tracing.run(span, admit);
      // (A spend cap's refusal is the limits' decision, on the request's span only.)
      if (!('decision' in admission)) {
        span?.setAttribute('tollgate.decision', admission.ok ? 'allowed' : paywallDecision(admission));
      }
      return admission;
    } catch (err) {
      failed(span, err);
      throw err;
    } finally {
      span?.end();
    }
  }

  /** One step of the admission (`tollgate.limits`, `tollgate.hold`) in a child span. */
  step<T>(name: string, run: () => Promise<T>): Promise<T> {
    return this.#tracing.span(name, undefined, run);
  }

  /** The settle in a `tollgate.settle` span; the amount charged on it and on the request's span. */
  settle<T extends { charged: string }>(x: Exchange, run: () => Promise<T>): Promise<T> {
    return this.#tracing.span('tollgate.settle', undefined, async (span) => {
      const settled = await run();
      if (span) {
        const attributes = {
          'tollgate.amount.charged': settled.charged,
          'tollgate.currency': x.project.currency,
        };
        span.setAttributes(attributes);
        x.span?.setAttributes(attributes);
      }
      return settled;
    });
  }

  resolved(x: Exchange): void {
    x.span?.setAttribute('tollgate.request_id', x.requestId);
  }

  refused(x: Exchange, refusal: Refusal): void {
    x.span?.setAttribute('tollgate.decision', refusal.decision);
  }

  admitted(x: Exchange): void {
    x.span?.setAttribute('tollgate.decision', 'allowed');
  }

  ended(x: Exchange, end: Ending, usage: TokenUsage | undefined): void {
    if (!usage) return;
    x.span?.setAttributes({
      'gen_ai.usage.input_tokens': usage.input,
      'gen_ai.usage.output_tokens': usage.output,
      'tollgate.outcome': end.outcome,
      'tollgate.currency': x.project.currency,
    });
  }
}
