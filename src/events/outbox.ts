import type { Kysely } from 'kysely';
import { type Bus, channels } from '../bus/index.ts';
import { newId } from '../core/ids.ts';
import type { DB } from '../db/schema.ts';
import { activeTraceparent } from '../tracing/index.ts';
import { type EventType, eventCatalog } from './catalog.ts';

/** The spec's Event object. `status` is `pending` in every delivery payload. */
export interface EventEnvelope {
  id: string;
  paywallId: string;
  ownerUserId: string;
  type: string;
  version: string;
  status: 'pending';
  createdAt: string;
  trigger: { source: string; actorType: string; actorId: string };
  subject: { type: string; id: string; externalId: string };
  data: Record<string, unknown>;
  metadata: Record<string, unknown>;
}

export interface EventInput {
  project: { id: string; owner_user_id: string };
  type: EventType;
  trigger: EventEnvelope['trigger'];
  subject: EventEnvelope['subject'];
  data: Record<string, unknown>;
  metadata?: Record<string, unknown> | undefined;
}

/**
 * Decides whether an event is worth writing: only when some active subscription of the project can
 * match it, so a project without subscriptions pays nothing for events on the hot path.
 */
export interface EventFilter {
  wants(projectId: string, type: string): boolean;
}

export const recordEverything: EventFilter = { wants: () => true };

/**
 * Writes events to the outbox inside the caller's transaction, so an event exists exactly when the
 * change it describes was committed. After the transaction commits, call `wake()` so the fan-out runs
 * at once instead of at its next poll.
 */
export class EventRecorder {
  filter: EventFilter;
  readonly #bus: Bus | undefined;

  constructor(filter: EventFilter = recordEverything, bus?: Bus) {
    this.filter = filter;
    this.#bus = bus;
  }

  /**
   * An event written while a traced request runs carries that trace's W3C `traceparent` in
   * `metadata.traceparent`: its webhook delivery spans link to the request's trace (src/tracing).
   */
  build(input: EventInput, now = new Date()): EventEnvelope {
    const info = eventCatalog[input.type];
    const traceparent = activeTraceparent();
    return {
      id: newId('evt'),
      paywallId: input.project.id,
      ownerUserId: input.project.owner_user_id,
      type: input.type,
      version: info.version,
      status: 'pending',
      createdAt: now.toISOString(),
      trigger: input.trigger,
      subject: input.subject,
      data: input.data,
      metadata: traceparent ? { ...input.metadata, traceparent } : (input.metadata ?? {}),
    };
  }

  wants(projectId: string, type: EventType): boolean {
    return this.filter.wants(projectId, type);
  }

  /** Inserts the event when the filter wants it; returns the envelope written, or undefined. */
  async record(tx: Kysely<DB>, input: EventInput): Promise<EventEnvelope | undefined> {
    if (!this.filter.wants(input.project.id, input.type)) return undefined;
    const envelope = this.build(input);
    await tx
      .insertInto('events')
      .values({
        id: envelope.id,
        project_id: input.project.id,
        type: envelope.type,
        version: envelope.version,
        envelope: JSON.stringify(envelope),
        created_at: envelope.createdAt,
      })
      .execute();
    return envelope;
  }

  /** Tells the fan-out that new events are committed. Best effort: the fan-out also polls. */
  wake(): void {
    this.#bus?.publish(channels.eventsWritten, '').catch(() => {});
  }
}
