import type { AppContext } from '../app/context.ts';
import { ApiError } from '../core/errors.ts';
import { formatForCurrency, Money } from '../core/money.ts';
import type { RateLimit } from '../db/schema.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { chargedSince, fromUnits, periodOf, type SpendCaps, type SpendPeriod, toUnits } from './spend.ts';
import { type CounterStore, MemoryCounterStore, RedisCounterStore } from './store.ts';

/**
 * Rate limits and spend caps of metered requests, checked before the paywall's hold (a refused request
 * never touches money) and corrected when the request ends. Counters live in Redis (atomic Lua scripts,
 * shared by every pod) or in this process without REDIS_URL (store.ts).
 *
 * - Rate limits: requests and tokens per minute per project, API key and end user, in fixed one-minute
 *   windows. Tokens are the prompt tokens estimated at admission, corrected to input + output at the end.
 * - Spend caps: per end user per UTC day and month. The request's hold amount (the most it can cost) is
 *   reserved atomically at admission; the counter is corrected to the amount charged at the end. A missing
 *   counter is seeded from the ledger's charges of the period, so the cap counts what was already spent.
 *
 * A project without limits pays nothing: no counter, no header, no round trip.
 */
export const WINDOW_MS = 60_000;

export type Scope = 'project' | 'key' | 'user';
const SCOPES: Scope[] = ['project', 'key', 'user'];

export interface LimitRequest {
  project: ProjectContext;
  apiKeyId: string;
  externalId: string;
  model: string;
  operation: string;
  /** Prompt tokens estimated (asked only when a tokens-per-minute limit applies). */
  estimateTokens: () => number;
}

export type RateDecision =
  | { ok: true; headers: Record<string, string> }
  | {
      ok: false;
      error: ApiError;
      scope: Scope;
      limit: 'requests' | 'tokens';
      value: number;
      retryAfterSeconds: number;
    };

export type SpendDecision =
  | { ok: true }
  | {
      ok: false;
      period: SpendPeriod;
      cap: string;
      spent: string;
      required: string;
      resetsAt: Date;
    };

interface Ticket {
  tokenKeys: string[];
  tokens: number;
  spendKeys: string[];
  spendUnits: number;
}

export class Limits {
  readonly #ctx: AppContext;
  readonly store: CounterStore;
  readonly #prefix: string;
  readonly #tickets = new WeakMap<object, Ticket>();

  constructor(ctx: AppContext) {
    this.#ctx = ctx;
    this.store = ctx.config.REDIS_URL
      ? new RedisCounterStore(ctx.config.REDIS_URL)
      : new MemoryCounterStore();
    this.#prefix = `${ctx.bus.prefix}lim:`;
  }

  close(): Promise<void> {
    return this.store.close();
  }

  /** True when the project has a rate limit or any spend cap (else the flow skips this module). */
  applies(project: ProjectContext): boolean {
    return project.limits !== undefined || project.spendCaps.size > 0;
  }

  /** Checks and counts the request against every rate limit of its project, key and user. */
  async rate(owner: object, req: LimitRequest): Promise<RateDecision> {
    const limits = req.project.limits;
    if (!limits?.project && !limits?.key && !limits?.user) return { ok: true, headers: {} };
    const now = Date.now();
    const window = Math.floor(now / WINDOW_MS);
    const resetMs = (window + 1) * WINDOW_MS - now;
    const ids: Record<Scope, string> = { project: '-', key: req.apiKeyId, user: req.externalId };
    const keys: string[] = [];
    const caps: number[] = [];
    const costs: number[] = [];
    const kinds: Array<{ scope: Scope; limit: 'requests' | 'tokens' }> = [];
    let tokens: number | undefined;
    for (const scope of SCOPES) {
      const limit: RateLimit | undefined = limits[scope];
      if (!limit) continue;
      const base = `${this.#prefix}{${req.project.id}}:${scope}:${encodeURIComponent(ids[scope])}:${window}`;
      if (limit.rpm !== undefined) {
        keys.push(`${base}:r`);
        caps.push(limit.rpm);
        costs.push(1);
        kinds.push({ scope, limit: 'requests' });
      }
      if (limit.tpm !== undefined) {
        tokens ??= req.estimateTokens();
        keys.push(`${base}:t`);
        caps.push(limit.tpm);
        costs.push(tokens);
        kinds.push({ scope, limit: 'tokens' });
      }
    }
    let result: Awaited<ReturnType<CounterStore['take']>>;
    try {
      result = await this.store.take(
        keys,
        caps,
        costs,
        keys.map(() => WINDOW_MS * 2),
        keys.map(() => 0),
      );
    } catch (err) {
      this.#unavailable(req.project, err);
      return { ok: true, headers: {} };
    }
    const headers = rateHeaders(kinds, caps, result.values, resetMs);
    if (result.denied >= 0) {
      const kind = kinds[result.denied]!;
      const value = caps[result.denied]!;
      const retryAfterSeconds = Math.max(1, Math.ceil(resetMs / 1000));
      const unit = kind.limit === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)';
      const used = result.values[result.denied]!;
      const error = new ApiError(
        429,
        'rate_limit_error',
        `Rate limit reached for the ${kind.scope === 'key' ? 'API key' : kind.scope === 'user' ? 'end user' : 'project'} on ${unit}: Limit ${value}, Used ${used}, Requested ${costs[result.denied]}. Please try again in ${retryAfterSeconds}s.`,
        { code: 'rate_limit_exceeded', headers: { ...headers, 'retry-after': String(retryAfterSeconds) } },
      );
      this.#ctx.metrics.rateLimited.inc({ project: req.project.id, scope: kind.scope, limit: kind.limit });
      return { ok: false, error, scope: kind.scope, limit: kind.limit, value, retryAfterSeconds };
    }
    const tokenKeys = keys.filter((_, i) => kinds[i]!.limit === 'tokens');
    if (tokenKeys.length) this.#ticket(owner).tokenKeys = tokenKeys;
    if (tokens !== undefined) this.#ticket(owner).tokens = tokens;
    return { ok: true, headers };
  }

  /** Reserves the request's most possible cost against the user's spend caps. */
  async reserveSpend(owner: object, req: LimitRequest, amount: string): Promise<SpendDecision> {
    const caps = capsOf(req.project, req.externalId);
    if (!caps || !new Money(amount).gt(0)) return { ok: true };
    const now = new Date();
    const periods: Array<{ period: SpendPeriod; cap: string; id: string; start: Date; end: Date }> = [];
    if (caps.daily !== undefined) periods.push({ period: 'day', cap: caps.daily, ...periodOf('day', now) });
    if (caps.monthly !== undefined)
      periods.push({ period: 'month', cap: caps.monthly, ...periodOf('month', now) });
    if (!periods.length) return { ok: true };
    const units = toUnits(amount);
    const user = encodeURIComponent(req.externalId);
    const keys = periods.map((p) => `${this.#prefix}{${req.project.id}:${user}}:spend:${p.id}`);
    const limits = periods.map((p) => toUnits(p.cap, 'down'));
    const ttl = periods.map((p) => p.end.getTime() - now.getTime() + 86_400_000);
    let result: Awaited<ReturnType<CounterStore['take']>>;
    try {
      result = await this.store.take(
        keys,
        limits,
        keys.map(() => units),
        ttl,
      );
      // First request of the period (or the counter was lost): count what the ledger already charged.
      // A seed is set only where the key is still missing (another pod may have seeded it meanwhile).
      const seeds: Array<number | undefined> = periods.map(() => undefined);
      for (let round = 0; result.needsSeed.length; round++) {
        if (round === 3) throw new Error('spend counters could not be seeded');
        for (const i of result.needsSeed) {
          seeds[i] ??= toUnits(
            await chargedSince(this.#ctx.db, req.project.id, req.externalId, periods[i]!.start),
          );
        }
        result = await this.store.take(
          keys,
          limits,
          keys.map(() => units),
          ttl,
          seeds,
        );
      }
    } catch (err) {
      if (err instanceof ApiError) throw err;
      this.#unavailable(req.project, err);
      return { ok: true };
    }
    if (result.denied >= 0) {
      const p = periods[result.denied]!;
      this.#ctx.metrics.spendCapped.inc({ project: req.project.id, period: p.period });
      return {
        ok: false,
        period: p.period,
        cap: p.cap,
        spent: fromUnits(result.values[result.denied]!),
        required: amount,
        resetsAt: p.end,
      };
    }
    const ticket = this.#ticket(owner);
    ticket.spendKeys = keys;
    ticket.spendUnits = units;
    return { ok: true };
  }

  /** Nothing was served (refused, failed, abandoned): the request uses no tokens and spends nothing. */
  released(owner: object): void {
    this.tokensUsed(owner, 0);
    this.charged(owner, '0');
  }

  /** The request ended: its token estimate becomes the tokens it used (0 when nothing was served). */
  tokensUsed(owner: object, tokens: number): void {
    const ticket = this.#tickets.get(owner);
    if (!ticket?.tokenKeys.length) return;
    const keys = ticket.tokenKeys;
    ticket.tokenKeys = [];
    const delta = tokens - ticket.tokens;
    if (delta !== 0) this.#adjust(keys, delta);
  }

  /** The request ended: its reservation becomes what was charged (`0` when it was released). */
  charged(owner: object, amount: string): void {
    const ticket = this.#tickets.get(owner);
    if (!ticket?.spendKeys.length) return;
    const keys = ticket.spendKeys;
    ticket.spendKeys = [];
    const delta = toUnits(amount) - ticket.spendUnits;
    if (delta !== 0) this.#adjust(keys, delta);
  }

  #adjust(keys: string[], delta: number): void {
    this.store
      .adjust(
        keys,
        keys.map(() => delta),
      )
      .catch((err) => {
        this.#ctx.log.warn({ err }, 'a limit counter correction failed');
      });
  }

  #ticket(owner: object): Ticket {
    let ticket = this.#tickets.get(owner);
    if (!ticket) {
      ticket = { tokenKeys: [], tokens: 0, spendKeys: [], spendUnits: 0 };
      this.#tickets.set(owner, ticket);
    }
    return ticket;
  }

  /** Redis could not be reached: fail open (counted) or closed (503), as LIMITS_FAIL_OPEN says. */
  #unavailable(project: ProjectContext, err: unknown): void {
    const open = this.#ctx.config.LIMITS_FAIL_OPEN;
    this.#ctx.metrics.limitsBackendErrors.inc({ project: project.id, outcome: open ? 'allowed' : 'refused' });
    this.#ctx.log.warn({ err }, `limits: Redis unreachable, failing ${open ? 'open' : 'closed'}`);
    if (!open) {
      throw new ApiError(
        503,
        'service_unavailable',
        'Rate limits cannot be checked right now; the request was not forwarded.',
        { code: 'limits_unavailable', headers: { 'retry-after': '1' } },
      );
    }
  }
}

/** The user's caps: their own (set through the API) over the project's, field by field. */
function capsOf(project: ProjectContext, externalId: string): SpendCaps | undefined {
  const own = project.spendCaps.get(externalId);
  const base = project.limits?.spend;
  if (!own && !base) return undefined;
  return { daily: own?.daily ?? base?.daily, monthly: own?.monthly ?? base?.monthly };
}

/**
 * OpenAI's rate limit headers: for requests and for tokens, the limit whose remaining is lowest, what
 * remains of it and when its window resets (`12s`).
 */
function rateHeaders(
  kinds: Array<{ limit: 'requests' | 'tokens' }>,
  caps: number[],
  values: number[],
  resetMs: number,
): Record<string, string> {
  const headers: Record<string, string> = {};
  const reset = `${Math.max(1, Math.ceil(resetMs / 1000))}s`;
  for (const limit of ['requests', 'tokens'] as const) {
    let best: { cap: number; remaining: number } | undefined;
    kinds.forEach((k, i) => {
      if (k.limit !== limit) return;
      const remaining = Math.max(0, caps[i]! - values[i]!);
      if (!best || remaining < best.remaining) best = { cap: caps[i]!, remaining };
    });
    if (!best) continue;
    const b = best as { cap: number; remaining: number };
    headers[`x-ratelimit-limit-${limit}`] = String(b.cap);
    headers[`x-ratelimit-remaining-${limit}`] = String(b.remaining);
    headers[`x-ratelimit-reset-${limit}`] = reset;
  }
  return headers;
}

/** The assistant message of a user at a spend cap. */
export function spendCapMessage(
  project: ProjectContext,
  refusal: Extract<SpendDecision, { ok: false }>,
): string {
  const cap = formatForCurrency(new Money(refusal.cap), project.currency);
  const spent = formatForCurrency(new Money(refusal.spent), project.currency);
  const when = refusal.resetsAt.toISOString().replace('.000Z', 'Z');
  return `You have reached your ${refusal.period === 'day' ? 'daily' : 'monthly'} spending limit of ${cap} ${project.currency.toUpperCase()} (spent so far: ${spent}). It resets at ${when} (UTC).`;
}

/** The rate limit headers already set on a reply (a stream writes its head itself). */
export function rateLimitHeaders(reply: { getHeaders(): Record<string, unknown> }): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(reply.getHeaders())) {
    if (name.startsWith('x-ratelimit-') && typeof value === 'string') out[name] = value;
  }
  return out;
}
