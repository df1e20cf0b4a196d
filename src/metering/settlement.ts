import type { Hold, SettleInput } from '../billing/service.ts';
import type { Exchange, MeteredBody, ReportedUsage } from './api.ts';
import { requestCost, type TokenUsage } from './cost.ts';
import type { Ending } from './observer.ts';

/**
 * What a served request is charged: the tokens (the provider's usage, else Tollgate's count), where
 * they came from, and the billing service's settle of its hold — with the ledger entry's metadata and
 * description, and `proxy.request.completed` when some subscription wants it (written in the settle's
 * transaction).
 */

/**
 * Tokens to charge: the provider's usage, exactly as reported, or Tollgate's own count (o200k) of what
 * it did not report — the prompt it forwarded and the output that reached the client.
 */
export function usageOf<B extends MeteredBody>(
  x: Exchange<B>,
  usage: ReportedUsage | undefined,
  produced: number,
): TokenUsage {
  const input = usage?.input ?? x.inputCount ?? x.api.countInput(x.body);
  const cachedInput = Math.min(usage?.cachedInput ?? 0, input);
  const cacheWrite = Math.min(usage?.cacheWrite ?? 0, input - cachedInput);
  return {
    input,
    cachedInput,
    output: usage?.output ?? produced,
    reasoning: usage?.reasoning ?? 0,
    ...(cacheWrite > 0 ? { cacheWrite, cacheWrite1h: Math.min(usage?.cacheWrite1h ?? 0, cacheWrite) } : {}),
  };
}

/**
 * Where a charge's tokens came from: `provider` (its usage had input and output), `tollgate` (it sent
 * none: Tollgate's count, an estimate) or `mixed` (it reported some fields; Tollgate counted the rest).
 */
export type UsageSource = 'provider' | 'tollgate' | 'mixed';

export function usageSourceOf(usage: ReportedUsage | undefined): UsageSource {
  if (usage?.input === undefined && usage?.output === undefined) return 'tollgate';
  if (usage.input !== undefined && usage.output !== undefined) return 'provider';
  return 'mixed';
}

/** The settle of a served request's hold at its real cost. */
export function settleInput(
  x: Exchange,
  hold: Hold,
  usage: TokenUsage,
  end: Ending,
  completed: ((amount: string) => Record<string, unknown>) | undefined,
): SettleInput {
  const source = usageSourceOf(end.usage);
  // An answer still in the works (a background response) is charged its hold until its cost is known.
  const pending = end.pending;
  return {
    project: x.project,
    hold,
    cost: pending ? hold.amount : requestCost(x.pricing, usage),
    source: x.api.name,
    model: x.model.id,
    trigger: x.trigger,
    externalId: x.externalId,
    lowBalanceThreshold: x.project.settings.lowBalanceThreshold,
    metadata: {
      requestId: x.requestId,
      model: x.model.id,
      api: x.api.name,
      inputTokens: usage.input,
      cachedInputTokens: usage.cachedInput,
      ...(usage.cacheWrite
        ? { cacheWriteTokens: usage.cacheWrite, cacheWrite1hTokens: usage.cacheWrite1h ?? 0 }
        : {}),
      outputTokens: usage.output,
      reasoningTokens: usage.reasoning,
      usageSource: source,
      outcome: end.outcome,
      ...(pending ? { backgroundResponseId: pending } : {}),
    },
    description: pending
      ? `${x.api.name} ${x.model.id}: background response ${pending}, charged its hold until it completes (the rest goes back then)`
      : `${x.api.name} ${x.model.id}: ${usage.input} input (${usage.cachedInput} cached${usage.cacheWrite ? `, ${usage.cacheWrite} written to the cache${usage.cacheWrite1h ? `, ${usage.cacheWrite1h} for 1 h` : ''}` : ''}) + ${usage.output} output tokens${source === 'provider' ? '' : source === 'tollgate' ? ' (counted by Tollgate: the provider reported no usage)' : ' (partly counted by Tollgate)'}`,
    ...(completed ? { completed: { type: 'proxy.request.completed' as const, data: completed } } : {}),
  };
}
