import type { Trigger } from '../billing/ledger.ts';
import { formatForCurrency, Money } from '../core/money.ts';
import type { Project } from '../db/schema.ts';
import { type IdempotentResult, requestHash, withIdempotency } from '../idempotency/index.ts';
import {
  chargeFromApi,
  connectUser,
  depositFromApi,
  disconnectUser,
  type GrantRequest,
  getBalance,
  grantFromApi,
  type LinkSettings,
} from '../users/service.ts';
import { actorOf, type Principal } from './accounts.ts';
import { type AdminServices, list } from './service.ts';

/**
 * End users and their money, for the admin API and the dashboard: the project's users, a user's
 * connection, deposits, manual charges and credit grants (once per Idempotency-Key when one is given).
 * Money moves through ../users/service.ts and ../idempotency: no money code here.
 */

export interface UserRow {
  user: string;
  object: 'user';
  connected: boolean;
  balance: string;
  held: string;
  available: string;
  currency: string;
  createdAt: string;
}

export async function searchUsers(
  ctx: Pick<AdminServices, 'db'>,
  project: Project,
  query: { q?: string | undefined; limit: number; startingAfter?: string | undefined },
) {
  let q = ctx.db
    .selectFrom('end_users')
    .select(['external_id', 'connected', 'balance', 'reserved', 'created_at'])
    .where('project_id', '=', project.id)
    .orderBy('external_id')
    .limit(query.limit + 1);
  if (query.q) {
    const pattern = `%${query.q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
    q = q.where('external_id', 'ilike', pattern);
  }
  if (query.startingAfter) q = q.where('external_id', '>', query.startingAfter);
  const rows = await q.execute();
  const money = (v: string) => formatForCurrency(v, project.currency);
  const data: UserRow[] = rows.slice(0, query.limit).map((r) => ({
    user: r.external_id,
    object: 'user',
    connected: r.connected,
    balance: money(r.balance),
    // held: what requests in flight reserved (the pods' slices are not shown)
    held: money(r.reserved),
    available: money(new Money(r.balance).minus(r.reserved).toFixed()),
    currency: project.currency,
    createdAt: r.created_at.toISOString(),
  }));
  return list(data, rows.length > query.limit);
}

export function triggerOf(principal: Principal): Trigger {
  return { source: 'admin', actorType: principal.actorType, actorId: principal.actorId };
}

export async function setUserConnected(
  ctx: AdminServices,
  principal: Principal,
  project: Project,
  user: string,
  connected: boolean,
) {
  const change = await (connected ? connectUser : disconnectUser)(
    ctx.db,
    ctx.events,
    project,
    user,
    triggerOf(principal),
  );
  return { ...(await getBalance(ctx.db, project, user)), changed: change.changed };
}

export interface MoneyInput {
  user: string;
  amount: string;
  metadata?: Record<string, unknown> | undefined;
}

/**
 * A deposit or a manual charge from the admin API or the dashboard, once per Idempotency-Key (scoped to
 * the project and this endpoint) when one is given; the same service functions as `/v1/user/*`.
 */
export async function moveMoney(
  ctx: AdminServices,
  principal: Principal,
  project: Project,
  kind: 'deposit' | 'charge',
  input: MoneyInput,
  idempotencyKey: string | undefined,
): Promise<IdempotentResult> {
  const links: LinkSettings = {
    sealer: ctx.sealer,
    publicBaseUrl: ctx.publicBaseUrl,
    ttlSeconds: ctx.config.LINK_TOKEN_TTL_SECONDS,
  };
  const trigger = triggerOf(principal);
  const actor = actorOf(principal);
  const run = async (tx: Parameters<Parameters<typeof withIdempotency>[2]>[0]) =>
    kind === 'deposit'
      ? { status: 201, body: await depositFromApi(tx, ctx.billing, project, input, trigger, actor) }
      : {
          status: 200,
          body: await chargeFromApi(tx, ctx.billing, ctx.events, project, input, trigger, links, actor),
        };
  // The billing service runs the event wake-up and the money metrics after the commit (not for a replay);
  // withRoom: pods give their slices of the wallet back when they stand in a charge's way (escrow).
  return ctx.billing.withRoom(() =>
    once(ctx, project, `POST /admin/v1/projects/users/${kind}`, input, idempotencyKey, run),
  );
}

/** Runs `run` in a transaction; with an Idempotency-Key, once per key (a repeat answers the first result). */
async function once(
  ctx: AdminServices,
  project: Project,
  endpoint: string,
  input: unknown,
  idempotencyKey: string | undefined,
  run: Parameters<typeof withIdempotency>[2],
): Promise<IdempotentResult> {
  return idempotencyKey === undefined
    ? { ...(await ctx.billing.transaction(run)), replayed: false }
    : withIdempotency(
        ctx,
        { projectId: project.id, endpoint, key: idempotencyKey, requestHash: requestHash(input) },
        run,
      );
}

/** Grants credit to a user (`POST /admin/v1/projects/{p}/users/{u}/credits`), once per Idempotency-Key. */
export async function grantCredit(
  ctx: AdminServices,
  principal: Principal,
  project: Project,
  input: GrantRequest,
  idempotencyKey: string | undefined,
): Promise<IdempotentResult> {
  const trigger = triggerOf(principal);
  const actor = actorOf(principal);
  return once(ctx, project, 'POST /admin/v1/projects/users/credits', input, idempotencyKey, async (tx) => ({
    status: 201,
    body: await grantFromApi(tx, ctx.billing, project, input, 'admin', trigger, actor),
  }));
}
