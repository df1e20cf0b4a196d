import { type RechargeContext, RechargeService } from './recharge.ts';

/**
 * The payments of a process, built once by the composition root (the application context in src/app): auto-recharge
 * watches every committed debit of the process from the start, and its job (`recharges.scan`, src/app/
 * jobs.ts) has a runner whether or not the HTTP routes are registered. `close` stops watching and waits
 * for the recharges in flight.
 */
export class PaymentsModule {
  readonly recharges: RechargeService;
  readonly #stopWatching: () => void;

  constructor(ctx: RechargeContext) {
    this.recharges = new RechargeService(ctx);
    this.#stopWatching = ctx.billing.onDebit(this.recharges.onDebit);
  }

  async close(): Promise<void> {
    this.#stopWatching();
    await this.recharges.idle();
  }
}
