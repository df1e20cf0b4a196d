import type { Hold, SettleInput } from '../billing/service.ts';
import type { Exchange, MeteredBody, ReportedUsage, UsageAnomaly } from './api.ts';
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
 * Usage within the request's sanity bounds: output at most the bound the provider received × choices,
 * input at most the model's context window (per-token requests). Anything above is an anomaly — the
 * provider reported more than it can have produced or read — charged up to the bound, the excess
 * returned to be recorded. Within the bounds the usage is returned as it is.
 */
export function withinBounds<B extends MeteredBody>(
  x: Exchange<B>,
  usage: TokenUsage,
): { usage: TokenUsage; anomaly: UsageAnomaly | undefined } {
  if (x.pricing.mode !== 'per_token') return { usage, anomaly: undefined };
  const outputBound = x.bound === undefined ? undefined : x.bound * x.choices;
  const excessOutput = outputBound === undefined ? 0 : Math.max(0, usage.output - outputBound);
  const excessInput = x.inputBound === undefined ? 0 : Math.max(0, usage.input - x.inputBound);
  if (!excessOutput && !excessInput) return { usage, anomaly: undefined };
  const input = usage.input - excessInput;
  const output = usage.output - excessOutput;
  return {
    usage: {
      input,
      cachedInput: Math.min(usage.cachedInput, input),
      output,
      reasoning: Math.min(usage.reasoning, output),
    },
    anomaly: {
      excessInput,
      excessOutput,
      reportedInput: usage.input,
      reportedOutput: usage.output,
      inputBound: x.inputBound,
      outputBound,
    },
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
  anomaly?: UsageAnomaly,
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
      ...(anomaly
        ? { anomalousInputTokens: anomaly.excessInput, anomalousOutputTokens: anomaly.excessOutput }
        : {}),
      ...(pending ? { backgroundResponseId: pending } : {}),
    },
    description: pending
      ? `${x.api.name} ${x.model.id}: background response ${pending}, charged its hold until it completes (the rest goes back then)`
      : `${x.api.name} ${x.model.id}: ${usage.input} input (${usage.cachedInput} cached${usage.cacheWrite ? `, ${usage.cacheWrite} written to the cache${usage.cacheWrite1h ? `, ${usage.cacheWrite1h} for 1 h` : ''}` : ''}) + ${usage.output} output tokens${source === 'provider' ? '' : source === 'tollgate' ? ' (counted by Tollgate: the provider reported no usage)' : ' (partly counted by Tollgate)'}${anomaly ? ` (reported above the bounds, not charged: ${anomaly.excessInput} input, ${anomaly.excessOutput} output tokens)` : ''}`,
    ...(completed ? { completed: { type: 'proxy.request.completed' as const, data: completed } } : {}),
  };
}
