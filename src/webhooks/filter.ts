import type { Bus } from '../bus/index.ts';
import type { Database } from '../db/index.ts';
import type { EventFilter } from '../events/outbox.ts';
import { matchesAny } from './patterns.ts';

export const subscriptionsChangedChannel = 'webhooks.subscriptions.changed';

const REFRESH_MS = 30_000;

/**
 * Writes an event only when some active subscription of its project can match it. Holds an in-memory
 * snapshot of each project's active patterns: loaded at start, reloaded for a project when any process
 * publishes a change on the bus, and fully reloaded periodically (a lost bus message only delays).
 * Until the first load succeeds (tables not migrated yet, database down) it keeps every event, so an
 * event is never dropped for want of knowledge.
 */
export class SubscriptionFilter implements EventFilter {
  readonly #db: Database;
  readonly #bus: Bus;
  #byProject = new Map<string, string[][]>();
  #ready = false;
  #timer: NodeJS.Timeout | undefined;
  #unsubscribe: (() => Promise<void>) | undefined;

  constructor(db: Database, bus: Bus) {
    this.#db = db;
    this.#bus = bus;
  }

  get ready(): boolean {
    return this.#ready;
  }

  wants(projectId: string, type: string): boolean {
    if (!this.#ready) return true;
    const lists = this.#byProject.get(projectId);
    if (!lists) return false;
    for (const patterns of lists) if (matchesAny(patterns, type)) return true;
    return false;
  }

  async start(): Promise<void> {
    this.#unsubscribe = await this.#bus.subscribe(subscriptionsChangedChannel, (projectId) => {
      this.refresh(projectId || undefined).catch(() => {});
    });
    await this.reloadAll().catch(() => {});
    this.#timer = setInterval(() => this.reloadAll().catch(() => {}), REFRESH_MS);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#unsubscribe?.();
  }

  async reloadAll(): Promise<void> {
    const rows = await this.#db
      .selectFrom('webhook_subscriptions')
      .select(['project_id', 'events'])
      .where('is_active', '=', true)
      .execute();
    const next = new Map<string, string[][]>();
    for (const row of rows) {
      const list = next.get(row.project_id) ?? [];
      list.push(row.events);
      next.set(row.project_id, list);
    }
    this.#byProject = next;
    this.#ready = true;
  }

  /** Reloads one project's patterns (all projects before the first successful load). */
  async refresh(projectId?: string): Promise<void> {
    if (!this.#ready || !projectId) return this.reloadAll();
    const rows = await this.#db
      .selectFrom('webhook_subscriptions')
      .select('events')
      .where('project_id', '=', projectId)
      .where('is_active', '=', true)
      .execute();
    if (rows.length)
      this.#byProject.set(
        projectId,
        rows.map((r) => r.events),
      );
    else this.#byProject.delete(projectId);
  }
}
