import type { PaywallRefusal } from '../billing/ledger.ts';
import type { ApiError } from '../core/errors.ts';
import type { RateRefusal, SpendRefusal } from '../limits/index.ts';
import type { LinkReply } from '../paywall/replies.ts';
import type { Exchange, ReportedUsage, UsageAnomaly } from './api.ts';
import type { TokenUsage } from './cost.ts';

/**
 * What the metered flow (flow.ts) tells the modules that watch it — limits (limits-observer.ts), metrics
 * (metrics-observer.ts), events (events-observer.ts) and tracing (tracing-observer.ts) — as fastify hooks
 * or OpenTelemetry instrumentations are told: the flow calls each hook of each observer in a fixed order,
 * synchronously, and an observer never changes the request's course (it may start background work the
 * flow tracks). Every hook is optional.
 *
 * The course of a request, and the hooks on it:
 * - resolved: the model, end user and price are known (`x.requestId` is set);
 * - refused: the limits or the paywall refused it (nothing forwarded, nothing charged);
 * - admitted: the hold (or the subscription) let it in;
 * - responded: the provider's answer (or a stream's first event) is going out;
 * - failed: the provider failed (before anything reached the client, or in the middle of a stream);
 * - ended: what was served is counted (`usage` undefined when nothing was: then `released` follows);
 * - released: nothing was served, or the request was refused: it used and spent nothing;
 * - settled: the charge committed (only requests that held money).
 */
export interface MeteringObserver {
  resolved?(x: Exchange): void;
  refused?(x: Exchange, refusal: Refusal): void;
  admitted?(x: Exchange): void;
  /** `upstreamMs`: the provider's time until its answer (a stream: its first event). */
  responded?(x: Exchange, upstreamMs: number): void;
  /** `error`: the client's answer; `counted`: no `ended` reports this request (nothing reached the client). */
  failed?(x: Exchange, err: unknown, error: ApiError, counted: boolean): void;
  ended?(x: Exchange, end: Ending, usage: TokenUsage | undefined): void;
  released?(x: Exchange): void;
  settled?(x: Exchange, charged: string): void;
  /** The provider reported usage above the request's bounds (told after `ended`; charged up to them). */
  anomaly?(x: Exchange, anomaly: UsageAnomaly): void;
}

/**
 * Why a request was refused before any money moved: a rate limit (a 429), a spend cap, or the paywall
 * (not connected, cannot pay) — the last two answered with a link reply in the API's shape.
 */
export type Refusal = { ok: false } & (
  | { decision: 'rate_limited'; rate: RateRefusal }
  | { decision: 'spend_cap_reached'; link: LinkReply; spend: SpendRefusal }
  | { decision: 'connect_required' | 'topup_required'; link: LinkReply; paywall: PaywallRefusal }
);

/** A refusal answered with a link reply (a spend cap, the paywall). */
export type LinkRefusal = Extract<Refusal, { link: LinkReply }>;

/** The paywall decision of a refused admission, as the metrics and `x-tollgate-paywall` name it. */
export function paywallDecision(refusal: PaywallRefusal): 'connect_required' | 'topup_required' {
  return refusal.reason === 'not_connected' ? 'connect_required' : 'topup_required';
}

/** How a served request ended. */
export interface Ending {
  /** `upstream_error`: the provider failed mid-stream after some of the answer reached the client. */
  outcome: 'success' | 'client_closed' | 'bound_reached' | 'upstream_error';
  usage: ReportedUsage | undefined;
  /** Output tokens counted by Tollgate from what was produced. */
  produced: number;
  finishReason: string | null;
  /** False when nothing reached the client: the hold is released. */
  charge: boolean;
  /**
   * The id of an answer the provider is still working on (a Responses `background` response): the
   * request is charged its hold, and settled when the answer completes (src/responses/background.ts).
   */
  pending?: string | undefined;
}
