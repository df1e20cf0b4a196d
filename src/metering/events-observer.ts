import type { Database } from '../db/index.ts';
import type { EventType } from '../events/catalog.ts';
import type { EventRecorder } from '../events/outbox.ts';
import { routingReported } from '../routing/router.ts';
import { UpstreamError } from '../upstream/types.ts';
import type { Exchange, UsageAnomaly } from './api.ts';
import type { TokenUsage } from './cost.ts';
import type { Ending, MeteringObserver, Refusal } from './observer.ts';
import type { Pending } from './pending.ts';

type EventData = Record<string, unknown>;

/**
 * The events of metered requests (src/events/catalog.ts), written outside any transaction and off the
 * response path, only when some subscription wants them (most projects subscribe to nothing: asked
 * first, nothing else is made). A request's events are written in order: each waits for its
 * `proxy.request.started` (`x.startedEvent`), as the routing events do. `proxy.request.completed` of a
 * request that held money is written by the settle, in its transaction (`completed`).
 */
export class EventsObserver implements MeteringObserver {
  readonly #events: EventRecorder;
  readonly #db: Database;
  readonly #pending: Pending;

  constructor(ctx: { events: EventRecorder; db: Database }, pending: Pending) {
    this.#events = ctx.events;
    this.#db = ctx.db;
    this.#pending = pending;
  }

  refused(x: Exchange, refusal: Refusal): void {
    const about = { model: x.model.id, operation: x.api.name };
    switch (refusal.decision) {
      case 'rate_limited': {
        const { scope, limit, value, retryAfterSeconds } = refusal.rate;
        this.#event(x, 'limits.rate.exceeded', { ...about, scope, limit, value, retryAfterSeconds });
        return;
      }
      case 'spend_cap_reached': {
        const { period, cap, spent, required, resetsAt } = refusal.spend;
        this.#event(x, 'limits.spend.exceeded', {
          ...about,
          period,
          cap,
          spent,
          required,
          currency: x.project.currency,
          resetsAt: resetsAt.toISOString(),
        });
        return;
      }
      case 'connect_required':
        this.#event(x, 'auth.connection.required', about);
        return;
      case 'topup_required':
        this.#event(x, 'limits.balance.insufficient', {
          ...about,
          required: refusal.link.required,
          available: refusal.link.available,
          currency: x.project.currency,
        });
    }
  }

  admitted(x: Exchange): void {
    x.startedEvent = this.#event(x, 'proxy.request.started', {
      requestId: x.requestId,
      api: x.api.name,
      model: x.model.id,
      stream: x.stream,
      holdAmount: x.hold?.amount ?? '0',
    });
  }

  /** The router's report of a routed request's attempts (its events chain on `startedEvent`). */
  routing(x: Exchange): (type: EventType, data: EventData) => void {
    return (type, data) => {
      x.startedEvent = this.#event(x, type, { requestId: x.requestId, ...data }) ?? x.startedEvent;
    };
  }

  failed(x: Exchange, err: unknown, error: { status: number; code: string | null }): void {
    const list: Array<[EventType, EventData]> = [
      [
        'proxy.request.failed',
        { requestId: x.requestId, model: x.model.id, status: error.status, code: error.code },
      ],
    ];
    // routing: the router already reported each failed attempt of a routed request
    if (!routingReported(err)) {
      list.push([
        'routing.upstream.failed',
        {
          requestId: x.requestId,
          model: x.model.id,
          upstreamStatus: err instanceof UpstreamError ? (err.upstreamStatus ?? null) : null,
          reason: err instanceof UpstreamError ? `${err.kind}: ${err.message}` : 'internal error',
        },
      ]);
    }
    this.#write(x, list);
  }

  anomaly(x: Exchange, anomaly: UsageAnomaly): void {
    this.#event(x, 'usage.anomaly', {
      requestId: x.requestId,
      api: x.api.name,
      model: x.model.id,
      stream: x.stream,
      reportedInputTokens: anomaly.reportedInput,
      reportedOutputTokens: anomaly.reportedOutput,
      inputBound: anomaly.inputBound ?? null,
      outputBound: anomaly.outputBound ?? null,
      excessInputTokens: anomaly.excessInput,
      excessOutputTokens: anomaly.excessOutput,
    });
  }

  /**
   * `proxy.request.completed` of a served request (its data, given the amount charged), or undefined
   * when no subscription wants it. Asked once the `started` event is written.
   */
  completed(x: Exchange, usage: TokenUsage, end: Ending): ((amount: string) => EventData) | undefined {
    if (!this.#events.wants(x.project.id, 'proxy.request.completed')) return undefined;
    return (amount) => ({
      requestId: x.requestId,
      api: x.api.name,
      model: x.model.id,
      stream: x.stream,
      inputTokens: usage.input,
      outputTokens: usage.output,
      amount,
      currency: x.project.currency,
      finishReason: end.finishReason,
      outcome: end.outcome,
      durationMs: Math.round(performance.now() - x.started),
    });
  }

  /** Writes one event now (the caller waits for it). */
  record(x: Exchange, type: EventType, data: EventData) {
    return this.#events.record(this.#db, {
      project: x.project,
      type,
      trigger: x.trigger,
      subject: { type: 'user', id: x.userId, externalId: x.externalId },
      data,
    });
  }

  #event(x: Exchange, type: EventType, data: EventData): Promise<unknown> | undefined {
    if (!this.#events.wants(x.project.id, type)) return undefined;
    return this.#write(x, [[type, data]]);
  }

  /** Writes the wanted ones of several events, in order, after the request's `started` event. */
  #write(x: Exchange, list: Array<[EventType, EventData]>): Promise<unknown> | undefined {
    const wanted = list.filter(([type]) => this.#events.wants(x.project.id, type));
    if (!wanted.length) return undefined;
    const after = x.startedEvent;
    const write = async () => {
      await after;
      for (const [type, data] of wanted) await this.record(x, type, data);
      this.#events.wake();
    };
    return this.#pending.track(write(), x, wanted.map(([type]) => type).join(', '));
  }
}
