import type { PricingFile } from '../models/pricing.ts';
import { ECHO_UPSTREAM } from '../projects/service.ts';
import type { Principal } from './accounts.ts';
import { type AdminServices, applyModels, createOwnedProject, ownedProject, projectView } from './service.ts';

/**
 * A project that starts without a provider key ("try it now, connect your provider later"): its
 * upstream is the built-in echo provider (src/upstream/echo.ts, no network), with a starter price list,
 * so the first API key's snippets are answered at once. Connecting a real provider later (the project
 * page, `PUT /admin/v1/projects/{p}/provider`) replaces the echo provider; the prices stay until changed.
 */

/** The starter model: per token, 1 per million input tokens and 2 per million output tokens. */
export const STARTER_MODEL = 'starter-echo';

export function starterPricing(currency: string): PricingFile {
  return {
    currency,
    models: [
      { id: STARTER_MODEL, pricing: { mode: 'per_token', inputPerMillion: '1', outputPerMillion: '2' } },
    ],
  } as PricingFile;
}

/** Creates the project on the echo provider with the starter price list (both audited). */
export async function createStarterProject(
  ctx: AdminServices,
  principal: Principal,
  input: { name: string; currency?: string | undefined },
) {
  const currency = input.currency ?? 'usd';
  const created = await createOwnedProject(ctx, principal, {
    name: input.name,
    currency,
    upstreamUrl: ECHO_UPSTREAM,
  });
  await applyModels(ctx, principal, created.project.id, starterPricing(currency));
  const project = await ownedProject(ctx, principal, created.project.id);
  return { ...created, project: projectView(project), models: [STARTER_MODEL] };
}
