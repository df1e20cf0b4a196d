import { UpstreamError } from '../upstream/types.ts';
import type { Exchange } from './api.ts';
import { refusedByTollgate } from './metrics-observer.ts';
import type { Ending, MeteringObserver, Refusal } from './observer.ts';

/**
 * What the metered flow knows of a request, for the request's log line (src/http/request-logger.ts
 * writes it when the response ends): Tollgate's request id, the model, the decision, how it ended and
 * what was charged. Never the prompt.
 */
export interface MeteredFacts {
  /** `x-tollgate-request-id`. */
  requestId: string;
  project: string;
  model: string;
  /** `allowed`, the refusal's decision (`connect_required`, `topup_required`, `spend_cap_reached`,
   * `rate_limited`), or `invalid_request` (Tollgate refused a field it cannot carry). */
  decision: string;
  /** How a served request ended (`success`, `bound_reached`, `client_closed`, `upstream_error`…). */
  outcome: string | undefined;
  /** The end user as the client named them (the log line writes a keyed hash of it, never the id). */
  externalId: string;
  /** The amount charged (a decimal string) once settled; undefined when nothing was. */
  charged: string | undefined;
  currency: string;
}

/** By the request's body (the route hands the flow `request.body` itself). */
const facts = new WeakMap<object, MeteredFacts>();

/** The facts the flow recorded for the request whose body this is, if it got that far. */
export function meteredFacts(body: unknown): MeteredFacts | undefined {
  return typeof body === 'object' && body !== null ? facts.get(body) : undefined;
}

/**
 * Records each metered request's facts as the flow goes (one small object per request, nothing
 * written): the log line is the HTTP layer's, one per request whatever the route.
 */
export class RequestLogObserver implements MeteringObserver {
  resolved(x: Exchange): void {
    facts.set(x.body, {
      requestId: x.requestId,
      project: x.project.id,
      model: x.model.id,
      decision: 'allowed',
      outcome: undefined,
      externalId: x.externalId,
      charged: undefined,
      currency: x.project.currency,
    });
  }

  refused(x: Exchange, refusal: Refusal): void {
    const found = facts.get(x.body);
    if (found) found.decision = refusal.decision;
  }

  failed(x: Exchange, err: unknown, _error: unknown, counted: boolean): void {
    const found = facts.get(x.body);
    if (!found) return;
    if (refusedByTollgate(err)) found.decision = 'invalid_request';
    else if (counted)
      found.outcome =
        err instanceof UpstreamError && err.kind === 'timeout' ? 'upstream_timeout' : 'upstream_error';
  }

  ended(x: Exchange, end: Ending): void {
    const found = facts.get(x.body);
    if (found) found.outcome = end.outcome;
  }

  settled(x: Exchange, charged: string): void {
    const found = facts.get(x.body);
    if (found) found.charged = charged;
  }
}
