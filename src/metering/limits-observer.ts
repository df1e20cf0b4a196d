import { type LimitRequest, type Limits, spendCapMessage } from '../limits/index.ts';
import { holdMarginOf } from '../models/hold-margin.ts';
import type { ProjectContext } from '../projects/directory.ts';
import { holdInputTokens } from '../tokens/count.ts';
import type { Exchange } from './api.ts';
import type { TokenUsage } from './cost.ts';
import type { Ending, MeteringObserver, Refusal } from './observer.ts';

/**
 * Rate limits and spend caps (src/limits) in the metered flow: checked before the hold, so a refused
 * request never touches money (`check`, the one step of the admission before it); then the counters are
 * corrected as the request ends — the token estimate becomes the tokens used, the reservation the
 * amount charged, and a request that was served nothing gives both back.
 */
export class LimitsObserver implements MeteringObserver {
  readonly #limits: Limits;

  constructor(limits: Limits) {
    this.#limits = limits;
  }

  close(): Promise<void> {
    return this.#limits.close();
  }

  /** True when the project has a rate limit or a spend cap (else the flow skips `check`: no round trip). */
  applies(project: ProjectContext): boolean {
    return this.#limits.applies(project);
  }

  /**
   * Counts the request against its limits, sets the rate limit headers (on every answer), and says why
   * it is refused (a rate limit: a 429; a spend cap: an assistant message, like the paywall's), if it is.
   */
  async check(
    x: Exchange,
    apiKeyId: string,
    reply: { header(name: string, value: string): unknown },
    amount: string,
  ): Promise<Refusal | undefined> {
    const req: LimitRequest = {
      project: x.project,
      apiKeyId,
      externalId: x.externalId,
      model: x.model.id,
      operation: x.api.name,
      estimateTokens: () => {
        if (x.inputCount !== undefined) return x.inputCount;
        const counted = holdInputTokens(x.api.countInput, x.body, holdMarginOf(x.model).margin);
        return counted.exact ?? counted.bound;
      },
    };
    const decision = await this.#limits.check(x, req, amount);
    for (const [name, value] of Object.entries(decision.headers)) reply.header(name, value);
    if (decision.ok) return undefined;
    const { rate, spend } = decision;
    if (rate) return { ok: false, decision: 'rate_limited', rate };
    const message = spendCapMessage(x.project, spend);
    return {
      ok: false,
      decision: 'spend_cap_reached',
      spend,
      link: { decision: 'spend_cap_reached', url: '', message },
    };
  }

  /**
   * The rate limits of the project, the key and the user named on a request outside the metered flow
   * (`/v1/user/*`: balances, links, keys…): counted as one request, refused with the 429 when over.
   */
  async checkRequest(
    request: { project: ProjectContext; apiKeyId: string; routeOptions: { url?: string | undefined } },
    externalId: string,
    reply: { header(name: string, value: string): unknown },
  ): Promise<void> {
    if (!this.#limits.applies(request.project)) return;
    const req: LimitRequest = {
      project: request.project,
      apiKeyId: request.apiKeyId,
      externalId,
      model: '',
      operation: request.routeOptions.url ?? '',
      estimateTokens: () => 0,
    };
    // (no amount: no spend cap is touched)
    const decision = await this.#limits.check(request, req, '0');
    for (const [name, value] of Object.entries(decision.headers)) reply.header(name, value);
    if (!decision.ok && decision.rate) throw decision.rate.error;
  }

  ended(x: Exchange, _end: Ending, usage: TokenUsage | undefined): void {
    // the estimate becomes the real count (nothing served: `released` gives it back)
    if (usage) this.#limits.tokensUsed(x, usage.input + usage.output);
  }

  released(x: Exchange): void {
    this.#limits.released(x);
  }

  settled(x: Exchange, charged: string): void {
    this.#limits.charged(x, charged);
  }
}
