import type { Logger } from 'pino';
import type { Database } from '../../db/index.ts';
import type { Metrics } from '../../metrics/registry.ts';
import { disableFailingSubscriptions, type EndpointHealthContext } from '../health.ts';
import { expireAbandoned, queueStats, renewOwnership } from '../queue.ts';
import type { SubscriptionSlots } from './subscription-slots.ts';

export interface HousekeepingOptions {
  ctx: EndpointHealthContext & {
    db: Database;
    log: Logger;
    metrics: Pick<Metrics, 'deliveriesPending' | 'oldestPendingAge'>;
  };
  slots: SubscriptionSlots;
  /** This worker's identity in the ownership rows. */
  owner: string;
  ownerLeaseMs: number;
  /** How often the queue gauges are refreshed, abandoned final attempts ended and failing endpoints disabled. */
  statsMs: number;
}

/**
 * A worker's timers besides its loops: the ownership of the subscriptions it holds deliveries of is
 * renewed well within its lease; now and then deliveries whose final attempt was abandoned are ended,
 * failing endpoints disabled (health.ts) and the queue gauges refreshed.
 */
export class Housekeeping {
  readonly #o: HousekeepingOptions;
  readonly #renew: NodeJS.Timeout;
  readonly #stats: NodeJS.Timeout;
  #refreshing = false;
  #stopped = false;

  constructor(options: HousekeepingOptions) {
    this.#o = options;
    const { ctx, owner, ownerLeaseMs } = options;
    this.#renew = setInterval(
      () => {
        renewOwnership(ctx.db, owner, options.slots.busy(), ownerLeaseMs).catch((err) =>
          ctx.log.debug({ err }, 'renewing subscription ownership failed'),
        );
      },
      Math.max(250, Math.floor(ownerLeaseMs / 3)),
    );
    this.#renew.unref();
    this.#stats = setInterval(() => this.refresh(), options.statsMs);
    this.#stats.unref();
  }

  /** Ends abandoned deliveries, disables failing endpoints and refreshes the gauges (one run at a time). */
  async refresh(): Promise<void> {
    if (this.#refreshing || this.#stopped) return;
    const { ctx } = this.#o;
    this.#refreshing = true;
    try {
      const ended = await expireAbandoned(ctx.db);
      if (ended) ctx.log.info({ count: ended }, 'ended deliveries whose final attempt was abandoned');
      await disableFailingSubscriptions(ctx);
      const stats = await queueStats(ctx.db);
      ctx.metrics.deliveriesPending.set(stats.pending);
      ctx.metrics.oldestPendingAge.set(stats.oldestAgeSeconds);
    } catch (err) {
      ctx.log.debug({ err }, 'refreshing webhook queue stats failed');
    } finally {
      this.#refreshing = false;
    }
  }

  stop(): void {
    this.#stopped = true;
    clearInterval(this.#renew);
    clearInterval(this.#stats);
  }
}
