import type { AppContext } from '../app/context.ts';
import { type PaywallRefusal, placeHold, type Trigger } from '../billing/ledger.ts';
import { subscriptionAccess } from '../chat/paywall.ts';
import { ApiError, DATABASE_RETRY_AFTER_SECONDS } from '../core/errors.ts';
import type { ModelRow } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import type { MeteredPricing } from './cost.ts';

/**
 * The paywall decision of a metered request, and the only place where one reserves money: a
 * subscription model checks (or renews) the user's period; a metered model places a hold of the most the
 * request can cost, in one conditional statement that refuses a user who is not connected or cannot pay.
 * (The billing service that batches holds plugs in here.)
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

export type Admission =
  | { ok: true; userId: string; hold: { id: string; amount: string } | undefined }
  | PaywallRefusal;

export async function admit(ctx: AppContext, input: AdmissionInput): Promise<Admission> {
  const { project, model, pricing } = input;
  try {
    if (pricing.mode === 'subscription') {
      const access = await subscriptionAccess(ctx, project, model, input.externalId, pricing, input.trigger);
      if (!access.ok) return access;
      if (access.renewal?.entryId) {
        ctx.metrics.charged.inc(
          { project: project.id, model: model.id, currency: project.currency, source: 'subscription' },
          Number(access.renewal.charged),
        );
      }
      return { ok: true, userId: access.userId, hold: undefined };
    }
    const held = await placeHold(ctx.db, {
      projectId: project.id,
      externalId: input.externalId,
      amount: input.amount,
      purpose: input.purpose,
      ttlSeconds: ctx.config.HOLD_TTL_SECONDS,
    });
    if (!held.ok) return held;
    ctx.metrics.holdsOpen.inc({ project: project.id });
    return { ok: true, userId: held.hold.userId, hold: { id: held.hold.id, amount: held.hold.amount } };
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
