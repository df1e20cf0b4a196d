import type { Logger } from 'pino';
import type { PaywallRefusal, Trigger } from '../billing/ledger.ts';
import type { BillingService, Hold } from '../billing/service.ts';
import { ApiError, DATABASE_RETRY_AFTER_SECONDS } from '../core/errors.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import type { MeteredPricing } from './cost.ts';

/**
 * The paywall decision of a metered request: a subscription model checks (or renews) the user's period;
 * a metered model holds the most the request can cost (its worst case). Both go to the billing service,
 * which refuses a user who is not connected or cannot pay: whose worst case exceeds their available
 * balance plus the project's `debtLimit` (default 0). A database that cannot answer is a 503: nothing is forwarded
 * unpaid.
 */
export interface AdmissionInput {
  project: ProjectContext;
  model: ModelRow;
  pricing: MeteredPricing;
  externalId: string;
  /** The hold amount (metered pricing); ignored for subscriptions. */
  amount: string;
  /** The API (`chat`, `responses`, `embeddings`): the hold's purpose. */
  purpose: string;
  trigger: Trigger;
}

export type Admission = { ok: true; userId: string; hold: Hold | undefined } | PaywallRefusal;

/** What the admission uses of the app. */
export interface AdmissionContext {
  billing: Pick<BillingService, 'hold' | 'subscription'>;
  log: Logger;
}

export async function admit(ctx: AdmissionContext, input: AdmissionInput): Promise<Admission> {
  const { project, model, pricing, externalId } = input;
  try {
    if (pricing.mode === 'subscription') {
      const access = await ctx.billing.subscription({
        project,
        model,
        externalId,
        pricing,
        trigger: input.trigger,
      });
      if (!access.ok) return access;
      return { ok: true, userId: access.userId, hold: undefined };
    }
    const held = await ctx.billing.hold({
      project,
      externalId,
      amount: input.amount,
      purpose: input.purpose,
      ...(project.settings.debtLimit ? { debtLimit: project.settings.debtLimit } : {}),
    });
    if (!held.ok) return held;
    return { ok: true, userId: held.hold.userId, hold: held.hold };
  } catch (err) {
    if (err instanceof ApiError) throw err;
    ctx.log.error({ err }, 'the paywall decision failed');
    throw new ApiError(
      503,
      'service_unavailable',
      'The billing database is unavailable; the request was not forwarded.',
      { code: 'database_unavailable', headers: { 'retry-after': String(DATABASE_RETRY_AFTER_SECONDS) } },
    );
  }
}
