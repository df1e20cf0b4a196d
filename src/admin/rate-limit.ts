import rateLimit, { normalizeIP } from '@fastify/rate-limit';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../core/errors.ts';

/**
 * The limits of the account endpoints (sign-in and sign-up, in the admin API and the dashboard alike),
 * kept by @fastify/rate-limit: in Redis when REDIS_URL is set (one atomic INCR per attempt, shared by
 * every pod, each key expiring with its window), else in this process.
 *
 * - Sign-in: each attempt is counted before the password is checked, so concurrent guesses cannot
 *   overtake the count. Limits: SIGNIN_MAX_ATTEMPTS per e-mail and client address, and
 *   SIGNIN_MAX_ATTEMPTS_PER_ADDRESS per address, per SIGNIN_WINDOW_SECONDS. There is no lock per e-mail
 *   alone: guesses from elsewhere never lock the owner out, and every limit lifts when its window ends.
 * - Sign-up: SIGNUP_MAX_PER_HOUR per client address.
 *
 * The client address is `request.ip` (an IPv6 address counts as its /64, as the plugin does), which
 * follows X-Forwarded-For only from TOLLGATE_TRUSTED_PROXIES.
 */
export interface AccountLimits {
  /** Counts a sign-in attempt for this e-mail from this request's address; 429 past a limit. */
  signIn(request: FastifyRequest, email: string): Promise<void>;
  /** Counts a sign-up from this request's address; 429 past the limit. */
  signUp(request: FastifyRequest): Promise<void>;
}

declare module 'fastify' {
  interface FastifyInstance {
    accountLimits: AccountLimits;
  }
}

type Limiter = ReturnType<FastifyInstance['createRateLimit']>;

const KEY = Symbol('tollgate.rateLimitKey');
type Keyed = FastifyRequest & { [KEY]?: string };

async function take(limiter: Limiter, request: FastifyRequest, key: string, code: string, message: string) {
  (request as Keyed)[KEY] = key;
  let result: Awaited<ReturnType<Limiter>>;
  try {
    result = await limiter(request);
  } catch (err) {
    // Redis unreachable with LIMITS_FAIL_OPEN=false (with `true` the plugin lets the attempt through).
    request.log.warn({ err }, 'account limits unavailable');
    throw new ApiError(
      503,
      'service_unavailable',
      'Sign-in and sign-up are unavailable for a moment; try again.',
      {
        code: 'limits_unavailable',
        headers: { 'retry-after': '1' },
      },
    );
  }
  if (result.isAllowed || !result.isExceeded) return;
  const retryAfter = Math.max(1, result.ttlInSeconds);
  throw new ApiError(429, 'rate_limit_error', message, {
    code,
    headers: { 'retry-after': String(retryAfter) },
  });
}

export const accountLimits = fp(
  async (app: FastifyInstance) => {
    const { config } = app.ctx;
    await app.register(rateLimit, {
      global: false,
      // Without Redis: this process's memory, an LRU of 100,000 keys (an evicted key starts again).
      ...(app.ctx.bus.redis ? { redis: app.ctx.bus.redis } : { cache: 100_000 }),
      nameSpace: `${app.ctx.bus.prefix}ratelimit:`,
      // Redis unreachable: the same choice as the request limits.
      skipOnError: config.LIMITS_FAIL_OPEN,
    });
    const keyOf = (request: FastifyRequest) => (request as Keyed)[KEY] ?? request.ip;
    const windowMs = config.SIGNIN_WINDOW_SECONDS * 1000;
    const perPair = app.createRateLimit({
      max: config.SIGNIN_MAX_ATTEMPTS,
      timeWindow: windowMs,
      keyGenerator: keyOf,
    });
    const perAddress = app.createRateLimit({
      max: config.SIGNIN_MAX_ATTEMPTS_PER_ADDRESS,
      timeWindow: windowMs,
      keyGenerator: keyOf,
    });
    const signUps = app.createRateLimit({
      max: config.SIGNUP_MAX_PER_HOUR,
      timeWindow: 3600_000,
      keyGenerator: keyOf,
    });
    const tooMany = (what: string) => `Too many ${what} from your address. Try again later.`;
    const address = (request: FastifyRequest) => normalizeIP(request.ip);
    app.decorate('accountLimits', {
      async signIn(request, email) {
        await take(
          perAddress,
          request,
          `signin-address:${address(request)}`,
          'sign_in_rate_limited',
          tooMany('sign-in attempts'),
        );
        await take(
          perPair,
          request,
          `signin:${address(request)}:${email}`,
          'sign_in_rate_limited',
          'Too many sign-in attempts for this account. Try again later.',
        );
      },
      async signUp(request) {
        await take(
          signUps,
          request,
          `signup:${address(request)}`,
          'sign_up_rate_limited',
          tooMany('sign-ups'),
        );
      },
    } satisfies AccountLimits);
  },
  { name: 'tollgate-account-limits' },
);
