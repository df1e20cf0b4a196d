import type { AppContext } from '../app/context.ts';
import { releaseHold, settleHold, type Trigger } from '../billing/ledger.ts';
import type { EventType } from '../events/catalog.ts';
import type { ProjectContext } from '../projects/directory.ts';

/**
 * The only place where a metered request's money moves after it was served: its hold is settled at the
 * real cost (capped at the hold; the rest released), or released in full when nothing was served.
 * (The billing service that batches settles plugs in here.)
 */
export interface SettlementInput {
  project: ProjectContext;
  hold: { id: string; amount: string };
  cost: string;
  /** The API (`chat`, `responses`, `embeddings`): the charge's ledger source. */
  source: string;
  trigger: Trigger;
  externalId: string;
  metadata: Record<string, unknown>;
  description: string;
  /** An event to record in the same transaction as the charge, built from the amount charged. */
  completed?: { type: EventType; userId: string; data: (charged: string) => Record<string, unknown> };
}

/** Settles a hold; returns the amount charged. */
export async function settle(ctx: AppContext, input: SettlementInput): Promise<string> {
  ctx.metrics.holdsOpen.dec({ project: input.project.id });
  const run = (db: typeof ctx.db) =>
    settleHold(db, ctx.events, {
      project: input.project,
      hold: input.hold,
      cost: input.cost,
      source: input.source,
      trigger: input.trigger,
      subjectExternalId: input.externalId,
      metadata: input.metadata,
      description: input.description,
    });
  const completed = input.completed;
  if (!completed) return (await retrying(() => run(ctx.db))).charged;
  const charged = await retrying(() =>
    ctx.db.transaction().execute(async (tx) => {
      const settled = await run(tx);
      await ctx.events.record(tx, {
        project: input.project,
        type: completed.type,
        trigger: input.trigger,
        subject: { type: 'user', id: completed.userId, externalId: input.externalId },
        data: completed.data(settled.charged),
      });
      return settled.charged;
    }),
  );
  ctx.events.wake();
  return charged;
}

/** Releases a hold in full (nothing was served, or the provider failed). */
export async function release(ctx: AppContext, project: ProjectContext, hold: { id: string }): Promise<void> {
  ctx.metrics.holdsOpen.dec({ project: project.id });
  await retrying(() => releaseHold(ctx.db, hold.id, 'released'));
}

/**
 * Retries a settle after a transient database failure. Settling is idempotent (a hold that is no longer
 * open is left alone), so a retry after an ambiguous failure cannot charge twice. A settle that still
 * fails leaves the hold to the sweeper: the request is then not charged.
 */
async function retrying<T>(work: () => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (attempt >= attempts) throw err;
      await new Promise((resolve) => setTimeout(resolve, 200 * attempt * attempt));
    }
  }
}
