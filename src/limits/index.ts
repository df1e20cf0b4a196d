import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { ApiError } from '../core/errors.ts';
import { formatForCurrency, Money } from '../core/money.ts';
import type { Database } from '../db/index.ts';
import type { RateLimit } from '../db/schema.ts';
import type { Metrics } from '../metrics/registry.ts';
import type { ProjectContext, SpendCaps } from '../projects/directory.ts';
import {
  endReservation,
  fromUnits,
  periodOf,
  reserveInPostgres,
  type SpendPeriod,
  spentAndReserved,
  toUnits,
} from './spend.ts';
import {
  type CounterStore,
  type CounterTake,
  type Guard,
  type Marker,
  MemoryCounterStore,
  RedisCounterStore,
  type TakeResult,
} from './store.ts';

/**
 * Rate limits and spend caps of metered requests, checked before the paywall's hold (a refused request
 * never touches money) and corrected when the request ends. Counters live in Redis (atomic Lua scripts,
 * shared by every pod) or in this process without REDIS_URL (store.ts).
 *
 * - Rate limits: requests and tokens per minute per project, API key and end user, in fixed one-minute
 *   windows. Tokens are the prompt tokens estimated at admission, corrected to input + output at the end.
 * - Spend caps: per end user per UTC day and month. The request's hold amount (the most it can cost) is
 *   reserved atomically at admission; the counter is corrected to the amount charged at the end. A missing
 *   counter is seeded from the ledger's charges of the period, so the cap counts what was already spent,
 *   plus what requests admitted through Postgres reserved; when the store lost its counters lately (the
 *   project's marker is fresh: a FLUSHDB, a Redis restart) or they missed an outage, also the wallet's
 *   open slices, which cover every request in flight whose reservation was lost with them. A counter
 *   keeps its seed's birth, and the correction of a request counted in an earlier birth applies only when
 *   it settled after the seed read the ledger (store.ts `Guard`). A cap is then exceeded by at most one
 *   request's worst case.
 * - Redis unreachable: rate limits fail open (or everything fails closed, LIMITS_FAIL_OPEN=false); spend
 *   caps are checked against Postgres instead (spend.ts `reserveInPostgres`: under the user's advisory
 *   lock, with the request's reservation written in the same transaction), and the counters this pod
 *   could not update are dropped once Redis answers again, to be seeded afresh.
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

/** Why a request is refused: over a rate limit (429), or at a spend cap (an assistant message). */
export interface RateRefusal {
  error: ApiError;
  scope: Scope;
  limit: 'requests' | 'tokens';
  value: number;
  retryAfterSeconds: number;
}

export interface SpendRefusal {
  period: SpendPeriod;
  cap: string;
  spent: string;
  required: string;
  resetsAt: Date;
}

/** `headers`: OpenAI's `x-ratelimit-*` headers for the answer, whatever the decision. */
export type LimitDecision =
  | { ok: true; headers: Record<string, string> }
  | { ok: false; headers: Record<string, string>; rate: RateRefusal; spend?: undefined }
  | { ok: false; headers: Record<string, string>; spend: SpendRefusal; rate?: undefined };

/** Rate counters start at 0 (`seed`); spend counters are seeded from the ledger (undefined until read). */
interface Counter extends CounterTake {
  rate?: { scope: Scope; limit: 'requests' | 'tokens' };
  spend?: { period: SpendPeriod; cap: string; start: Date; end: Date };
}

interface Ticket {
  tokenKeys: string[];
  tokens: number;
  /** A token correction waiting to go with the spend correction (one round trip at the end). */
  tokenDelta: number;
  spendKeys: string[];
  /** The births of the spend counters it was counted in (for the correction's guard). */
  spendBirths: string[];
  spendUnits: number;
  /** The reservation made through Postgres (Redis unreachable), ended when the request is. */
  reservationId?: string | undefined;
}

/** How long a project's marker lives without a take, and how long after its making seeds are cautious. */
const MARKER_TTL_MS = 40 * 86_400_000;
const MARKER_FRESH_MS = 5 * 60_000;

/** What the limits use of the app (the composition root passes its context). */
export interface LimitsContext {
  config: Pick<Config, 'REDIS_URL' | 'LIMITS_FAIL_OPEN'>;
  bus: { prefix: string };
  db: Database;
  metrics: Pick<Metrics, 'rateLimited' | 'spendCapped' | 'limitsBackendErrors'>;
  log: Logger;
}

export class Limits {
  readonly #ctx: LimitsContext;
  readonly store: CounterStore;
  readonly #prefix: string;
  readonly #tickets = new WeakMap<object, Ticket>();
  /** Spend counters this pod checked through Postgres: dropped from Redis once it answers again. */
  readonly #missed = new Set<string>();
  /** Spend counters dropped so: their next seed counts the open slices. */
  readonly #dropped = new Set<string>();

  constructor(ctx: LimitsContext) {
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

  /**
   * Checks the request against every rate limit of its project, key and user and against its user's
   * spend caps, and counts it (1 request, its estimated prompt tokens, its hold `amount`) — all in one
   * atomic step: either everything is counted or nothing is.
   */
  async check(owner: object, req: LimitRequest, amount: string): Promise<LimitDecision> {
    const now = Date.now();
    const window = Math.floor(now / WINDOW_MS);
    const resetMs = (window + 1) * WINDOW_MS - now;
    const rate = this.#rateCounters(req, window);
    const units = toUnits(amount);
    const counters = rate.counters;
    this.#addSpendCounters(counters, req, units, now);
    if (!counters.length) return { ok: true, headers: {} };
    let result: TakeResult;
    try {
      result = await this.#take(req, counters);
    } catch (err) {
      const spend = counters.filter((c) => c.spend);
      this.#unavailable(req.project, err, spend.length > 0);
      return this.#checkInPostgres(owner, req, spend, amount);
    }
    const headers = rateHeaders(counters, result.values, resetMs);
    if (result.denied >= 0) return this.#refusal(req, counters, result, headers, resetMs, amount);
    const ticket: Ticket = {
      tokenKeys: [],
      tokens: rate.tokens ?? 0,
      tokenDelta: 0,
      spendKeys: [],
      spendBirths: [],
      spendUnits: units,
    };
    counters.forEach((c, i) => {
      if (c.rate?.limit === 'tokens') ticket.tokenKeys.push(c.key);
      if (c.spend) {
        ticket.spendKeys.push(c.key);
        ticket.spendBirths.push(result.births[i] ?? '');
      }
    });
    if (ticket.tokenKeys.length || ticket.spendKeys.length) this.#tickets.set(owner, ticket);
    return { ok: true, headers };
  }

  /** The request and token counters of the project's, key's and user's rate limits in this window. */
  #rateCounters(req: LimitRequest, window: number): { counters: Counter[]; tokens: number | undefined } {
    const counters: Counter[] = [];
    let tokens: number | undefined;
    const limits = req.project.limits;
    const ids: Record<Scope, string> = { project: '-', key: req.apiKeyId, user: req.externalId };
    for (const scope of SCOPES) {
      const limit: RateLimit | undefined = limits?.[scope];
      if (!limit) continue;
      const base = `${this.#prefix}{${req.project.id}}:${scope}:${encodeURIComponent(ids[scope])}:${window}`;
      const ttlMs = WINDOW_MS * 2;
      if (limit.rpm !== undefined) {
        counters.push({
          key: `${base}:r`,
          cap: limit.rpm,
          cost: 1,
          ttlMs,
          seed: 0,
          rate: { scope, limit: 'requests' },
        });
      }
      if (limit.tpm !== undefined) {
        tokens ??= req.estimateTokens();
        counters.push({
          key: `${base}:t`,
          cap: limit.tpm,
          cost: tokens,
          ttlMs,
          seed: 0,
          rate: { scope, limit: 'tokens' },
        });
      }
    }
    return { counters, tokens };
  }

  /** Adds the user's spend counters of the day and month, reserving `units` (none when nothing is held). */
  #addSpendCounters(counters: Counter[], req: LimitRequest, units: number, now: number): void {
    const caps = capsOf(req.project, req.externalId);
    if (!caps || units <= 0) return;
    const user = encodeURIComponent(req.externalId);
    const date = new Date(now);
    for (const [period, cap] of [
      ['day', caps.daily],
      ['month', caps.monthly],
    ] as const) {
      if (cap === undefined) continue;
      const p = periodOf(period, date);
      counters.push({
        key: `${this.#prefix}{${req.project.id}}:spend:${user}:${p.id}`,
        cap: toUnits(cap, 'down'),
        cost: units,
        ttlMs: p.end.getTime() - now + 86_400_000,
        seed: undefined,
        birth: '-',
        spend: { period, cap, start: p.start, end: p.end },
      });
    }
  }

  /**
   * Takes every counter in one atomic step. A spend counter's first request of the period (or Redis lost
   * it): seeded where the key is still missing (`#seed`), and taken again. Counters this pod checked
   * through Postgres while Redis was unreachable are dropped first.
   */
  async #take(req: LimitRequest, counters: Counter[]): Promise<TakeResult> {
    if (this.#missed.size) await this.#dropMissed();
    // In this process's memory the counters are lost only with the process, and its requests with them.
    const marker: Marker | undefined =
      this.store.kind === 'redis' && counters.some((c) => c.spend)
        ? {
            key: `${this.#prefix}{${req.project.id}}:alive`,
            ttlMs: MARKER_TTL_MS,
            freshMs: MARKER_FRESH_MS,
            now: Date.now(),
          }
        : undefined;
    let result = await this.store.take(counters, marker);
    const fresh = result.fresh;
    for (let round = 0; result.needsSeed.length; round++) {
      if (round === 3) throw new Error('spend counters could not be seeded');
      for (const i of result.needsSeed) {
        const c = counters[i]!;
        if (c.seed === undefined) {
          c.birth = String(Date.now());
          c.seed = await this.#seed(req, c, fresh || this.#dropped.delete(c.key));
        }
      }
      result = await this.store.take(counters, marker);
    }
    return result;
  }

  /**
   * A spend counter's seed: the ledger's charges of the period and the reservations made through
   * Postgres; with `cautious` (its counters were lost lately) also the wallet's open slices, which cover
   * the requests in flight whose reservations were lost (their corrections subtract them when they end).
   */
  async #seed(req: LimitRequest, c: Counter, cautious: boolean): Promise<number> {
    const used = await spentAndReserved(this.#ctx.db, req.project.id, req.externalId, c.spend!.start, {
      slices: cautious,
    });
    return toUnits(new Money(used.charged).plus(used.reserved).plus(used.held).toFixed());
  }

  /** Redis answers again: the spend counters that missed what was reserved through Postgres are dropped. */
  async #dropMissed(): Promise<void> {
    const keys = [...this.#missed];
    await this.store.forget(keys);
    for (const key of keys) {
      this.#missed.delete(key);
      this.#dropped.add(key);
    }
  }

  /**
   * Redis unreachable: the spend caps checked against Postgres (slower, as strict), the request's
   * reservation written there; rate limits are not counted (fail open).
   */
  async #checkInPostgres(
    owner: object,
    req: LimitRequest,
    spend: Counter[],
    amount: string,
  ): Promise<LimitDecision> {
    if (!spend.length) return { ok: true, headers: {} };
    for (const c of spend) this.#missed.add(c.key);
    const decision = await reserveInPostgres(this.#ctx.db, {
      projectId: req.project.id,
      externalId: req.externalId,
      amount,
      caps: spend.map((c) => ({ period: c.spend!.period, cap: c.spend!.cap, start: c.spend!.start })),
    });
    if (decision.ok) {
      this.#tickets.set(owner, {
        tokenKeys: [],
        tokens: 0,
        tokenDelta: 0,
        spendKeys: [],
        spendBirths: [],
        spendUnits: 0,
        reservationId: decision.reservationId,
      });
      return { ok: true, headers: {} };
    }
    const c = spend.find((s) => s.spend!.period === decision.period)!;
    this.#ctx.metrics.spendCapped.inc({ project: req.project.id, period: decision.period });
    return {
      ok: false,
      headers: {},
      spend: {
        period: decision.period,
        cap: decision.cap,
        spent: decision.spent,
        required: amount,
        resetsAt: c.spend!.end,
      },
    };
  }

  /** The decision of a request a counter refused: over a rate limit (a 429) or at a spend cap. */
  #refusal(
    req: LimitRequest,
    counters: Counter[],
    result: TakeResult,
    headers: Record<string, string>,
    resetMs: number,
    amount: string,
  ): LimitDecision {
    const project = req.project.id;
    const c = counters[result.denied]!;
    if (c.rate) {
      const retryAfterSeconds = Math.max(1, Math.ceil(resetMs / 1000));
      const unit = c.rate.limit === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)';
      const who = c.rate.scope === 'key' ? 'API key' : c.rate.scope === 'user' ? 'end user' : 'project';
      const error = new ApiError(
        429,
        'rate_limit_error',
        `Rate limit reached for the ${who} on ${unit}: Limit ${c.cap}, Used ${result.values[result.denied]}, Requested ${c.cost}. Please try again in ${retryAfterSeconds}s.`,
        { code: 'rate_limit_exceeded', headers: { ...headers, 'retry-after': String(retryAfterSeconds) } },
      );
      this.#ctx.metrics.rateLimited.inc({ project, scope: c.rate.scope, limit: c.rate.limit });
      return {
        ok: false,
        headers,
        rate: { error, scope: c.rate.scope, limit: c.rate.limit, value: c.cap, retryAfterSeconds },
      };
    }
    const spend = c.spend!;
    this.#ctx.metrics.spendCapped.inc({ project, period: spend.period });
    return {
      ok: false,
      headers,
      spend: {
        period: spend.period,
        cap: spend.cap,
        spent: fromUnits(result.values[result.denied]!),
        required: amount,
        resetsAt: spend.end,
      },
    };
  }

  /** Nothing was served (refused, failed, abandoned): the request uses no tokens and spends nothing. */
  released(owner: object): void {
    this.tokensUsed(owner, 0);
    this.charged(owner, '0');
  }

  /**
   * The request ended: its token estimate becomes the tokens it used (0 when nothing was served). With a
   * spend reservation pending, the correction waits to go with it.
   */
  tokensUsed(owner: object, tokens: number): void {
    const ticket = this.#tickets.get(owner);
    if (!ticket?.tokenKeys.length) return;
    const delta = tokens - ticket.tokens;
    if (ticket.spendKeys.length) {
      ticket.tokenDelta = delta;
      return;
    }
    const keys = ticket.tokenKeys;
    ticket.tokenKeys = [];
    if (delta !== 0)
      this.#adjust(
        keys,
        keys.map(() => delta),
      );
  }

  /** The request ended: its reservation becomes what was charged (`0` when it was released). */
  charged(owner: object, amount: string): void {
    const ticket = this.#tickets.get(owner);
    if (ticket?.reservationId) {
      // Its charge is in the ledger now (or nothing was): the reservation counts no more.
      const id = ticket.reservationId;
      ticket.reservationId = undefined;
      endReservation(this.#ctx.db, id).catch((err) => {
        this.#ctx.log.warn({ err }, 'a spend reservation could not be ended; it expires');
      });
    }
    if (!ticket?.spendKeys.length) return;
    const delta = toUnits(amount) - ticket.spendUnits;
    const keys: string[] = [];
    const deltas: number[] = [];
    const guards: Array<Guard | undefined> = [];
    const settledAt = Date.now();
    ticket.spendKeys.forEach((key, i) => {
      keys.push(key);
      deltas.push(delta);
      guards.push({ birth: ticket.spendBirths[i] ?? '', settledAt });
    });
    if (ticket.tokenDelta !== 0) {
      for (const key of ticket.tokenKeys) {
        keys.push(key);
        deltas.push(ticket.tokenDelta);
        guards.push(undefined);
      }
    }
    ticket.spendKeys = [];
    ticket.tokenKeys = [];
    const changed = deltas.some((d) => d !== 0);
    if (changed) this.#adjust(keys, deltas, guards);
  }

  #adjust(keys: string[], deltas: number[], guards?: Array<Guard | undefined>): void {
    this.store.adjust(keys, deltas, guards).catch((err) => {
      this.#ctx.log.warn({ err }, 'a limit counter correction failed');
    });
  }

  /**
   * Redis could not be reached: fail open (rate limits not counted; spend caps checked against Postgres:
   * outcome `postgres`) or closed (503), as LIMITS_FAIL_OPEN says.
   */
  #unavailable(project: ProjectContext, err: unknown, spend: boolean): void {
    const open = this.#ctx.config.LIMITS_FAIL_OPEN;
    const outcome = !open ? 'refused' : spend ? 'postgres' : 'allowed';
    this.#ctx.metrics.limitsBackendErrors.inc({ project: project.id, outcome });
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
function rateHeaders(counters: Counter[], values: number[], resetMs: number): Record<string, string> {
  const headers: Record<string, string> = {};
  const reset = `${Math.max(1, Math.ceil(resetMs / 1000))}s`;
  for (const limit of ['requests', 'tokens'] as const) {
    let best: { cap: number; remaining: number } | undefined;
    counters.forEach((c, i) => {
      if (c.rate?.limit !== limit) return;
      const remaining = Math.max(0, c.cap - values[i]!);
      if (!best || remaining < best.remaining) best = { cap: c.cap, remaining };
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
export function spendCapMessage(project: ProjectContext, refusal: SpendRefusal): string {
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
