import { sql } from 'kysely';
import { z } from 'zod';
import { formatForCurrency } from '../core/money.ts';
import { wholeNumberParam } from '../core/validation.ts';
import type { Project } from '../db/schema.ts';
import type { AdminServices } from './service.ts';

/**
 * Reports from the ledger, for the admin API and the dashboard: usage and revenue (`usageReport`), and
 * the reconciliation with the providers' invoices (`reconciliationReport`). Both read the charge
 * entries' metadata, which the metered flow writes with every charge: the tokens it was charged for and
 * where they came from (`usageSource`), and the hold it settled (`holdAmount`).
 */

const daysSchema = wholeNumberParam(366, 30);

export const reportQuerySchema = z.strictObject({
  group: z.enum(['day', 'model', 'user'], { message: "must be 'day', 'model' or 'user'" }).default('day'),
  days: daysSchema,
});
export type ReportQuery = z.infer<typeof reportQuerySchema>;

export interface ReportRow {
  key: string;
  requests: number;
  inputTokens: number;
  outputTokens: number;
  revenue: string;
}

/**
 * Spend and usage from the ledger: the charges of the last `days` days grouped per day, model or user —
 * requests (metered charges), input and output tokens (from the charges' usage metadata) and revenue
 * (the amounts charged; manual charges count as model `(manual)`).
 */
export async function usageReport(
  ctx: Pick<AdminServices, 'db'>,
  project: Pick<Project, 'id' | 'currency'>,
  query: ReportQuery,
) {
  const key =
    query.group === 'day'
      ? sql<string>`to_char(date_trunc('day', l.created_at at time zone 'UTC'), 'YYYY-MM-DD')`
      : query.group === 'model'
        ? sql<string>`coalesce(l.metadata->>'model', '(manual)')`
        : sql<string>`u.external_id`;
  const result = await sql<{
    key: string;
    requests: string;
    input_tokens: string;
    output_tokens: string;
    revenue: string;
  }>`
    SELECT ${key} AS key,
           count(*) FILTER (WHERE l.metadata ? 'requestId')::text AS requests,
           coalesce(sum(CASE WHEN jsonb_typeof(l.metadata->'inputTokens') = 'number'
                             THEN (l.metadata->>'inputTokens')::numeric END), 0)::text AS input_tokens,
           coalesce(sum(CASE WHEN jsonb_typeof(l.metadata->'outputTokens') = 'number'
                             THEN (l.metadata->>'outputTokens')::numeric END), 0)::text AS output_tokens,
           (-sum(l.amount))::text AS revenue
      FROM ledger_entries l JOIN end_users u ON u.id = l.user_id
     WHERE l.project_id = ${project.id}
       AND l.kind = 'charge'
       AND l.created_at >= now() - make_interval(days => ${query.days})
     GROUP BY 1
     ORDER BY 1
  `.execute(ctx.db);
  const data: ReportRow[] = result.rows.map((r) => ({
    key: r.key,
    requests: Number(r.requests),
    inputTokens: Number(r.input_tokens),
    outputTokens: Number(r.output_tokens),
    revenue: formatForCurrency(r.revenue, project.currency),
  }));
  return {
    object: 'report' as const,
    group: query.group,
    days: query.days,
    currency: project.currency,
    data,
  };
}

export const reconciliationQuerySchema = z.strictObject({
  days: daysSchema,
  format: z.enum(['json', 'csv'], { message: "must be 'json' or 'csv'" }).default('json'),
});
export type ReconciliationQuery = z.infer<typeof reconciliationQuerySchema>;

/** One day and model of metered charges, as the ledger has them. */
export interface ReconciliationRow {
  /** UTC day, `YYYY-MM-DD`. */
  day: string;
  model: string;
  /** Metered requests charged. */
  requests: number;
  /** …of which the provider reported the usage (input and output). */
  providerReported: number;
  /** …of which Tollgate counted some or all tokens (the provider sent no usage): estimates. */
  estimated: number;
  /** Tokens charged, all requests. */
  inputTokens: number;
  cachedInputTokens: number;
  outputTokens: number;
  reasoningTokens: number;
  /** Tokens the provider reported (requests whose usage came from it): compare with its invoice. */
  providerInputTokens: number;
  providerOutputTokens: number;
  /** Amount charged, all requests; and the part charged from Tollgate's estimates. */
  amount: string;
  estimatedAmount: string;
  /** What the requests' holds reserved; what was charged above them; what the balances could not cover. */
  held: string;
  overage: string;
  debt: string;
  /**
   * Tokens the provider reported above the requests' bounds (`usage.anomaly`: output above the bound it
   * received, input above the context window), not charged; included in the provider columns.
   */
  anomalousTokens: number;
}

export const RECONCILIATION_COLUMNS = [
  'day',
  'model',
  'requests',
  'providerReported',
  'estimated',
  'inputTokens',
  'cachedInputTokens',
  'outputTokens',
  'reasoningTokens',
  'providerInputTokens',
  'providerOutputTokens',
  'amount',
  'estimatedAmount',
  'held',
  'overage',
  'debt',
  'anomalousTokens',
] as const satisfies ReadonlyArray<keyof ReconciliationRow>;

/**
 * Per day and model, the metered charges of the last `days` days: tokens and amounts charged next to the
 * tokens the providers reported — the numbers a developer compares with a provider's invoice. Charges
 * are exact from the provider's usage, so the two token columns differ only by requests whose provider
 * sent no usage (`estimated`: Tollgate's count, flagged on each entry). Entries written before the usage
 * source was recorded count as provider-reported when they carry token counts.
 */
export async function reconciliationReport(
  ctx: Pick<AdminServices, 'db'>,
  project: Pick<Project, 'id' | 'currency'>,
  query: Pick<ReconciliationQuery, 'days'>,
) {
  const result = await sql<Record<string, string>>`
    WITH c AS (
      SELECT to_char(date_trunc('day', l.created_at at time zone 'UTC'), 'YYYY-MM-DD') AS day,
             l.metadata->>'model' AS model,
             coalesce(l.metadata->>'usageSource', 'provider') = 'provider' AS reported,
             -l.amount AS amount,
             l.balance_after,
             CASE WHEN jsonb_typeof(l.metadata->'holdAmount') = 'string'
                  THEN (l.metadata->>'holdAmount')::numeric END AS held,
             ${tokens('inputTokens')} AS input,
             ${tokens('cachedInputTokens')} AS cached,
             ${tokens('outputTokens')} AS output,
             ${tokens('reasoningTokens')} AS reasoning,
             ${tokens('anomalousInputTokens')} AS excess_input,
             ${tokens('anomalousOutputTokens')} AS excess_output
        FROM ledger_entries l
       WHERE l.project_id = ${project.id}
         AND l.kind = 'charge'
         AND l.metadata ? 'requestId'
         AND l.created_at >= now() - make_interval(days => ${query.days})
    )
    SELECT day, model,
           count(*)::text AS requests,
           count(*) FILTER (WHERE reported)::text AS provider_reported,
           count(*) FILTER (WHERE NOT reported)::text AS estimated,
           sum(input)::text AS input_tokens,
           sum(cached)::text AS cached_input_tokens,
           sum(output)::text AS output_tokens,
           sum(reasoning)::text AS reasoning_tokens,
           coalesce(sum(input + excess_input) FILTER (WHERE reported), 0)::text AS provider_input_tokens,
           coalesce(sum(output + excess_output) FILTER (WHERE reported), 0)::text AS provider_output_tokens,
           sum(excess_input + excess_output)::text AS anomalous_tokens,
           sum(amount)::text AS amount,
           coalesce(sum(amount) FILTER (WHERE NOT reported), 0)::text AS estimated_amount,
           coalesce(sum(held), 0)::text AS held,
           coalesce(sum(greatest(amount - held, 0)), 0)::text AS overage,
           coalesce(sum(CASE WHEN balance_after < 0 THEN least(amount, -balance_after) ELSE 0 END), 0)::text AS debt
      FROM c
     GROUP BY day, model
     ORDER BY day, model
  `.execute(ctx.db);
  const amount = (v: string | undefined) => formatForCurrency(v ?? '0', project.currency);
  const data: ReconciliationRow[] = result.rows.map((r) => ({
    day: r.day!,
    model: r.model ?? '',
    requests: Number(r.requests),
    providerReported: Number(r.provider_reported),
    estimated: Number(r.estimated),
    inputTokens: Number(r.input_tokens),
    cachedInputTokens: Number(r.cached_input_tokens),
    outputTokens: Number(r.output_tokens),
    reasoningTokens: Number(r.reasoning_tokens),
    providerInputTokens: Number(r.provider_input_tokens),
    providerOutputTokens: Number(r.provider_output_tokens),
    amount: amount(r.amount),
    estimatedAmount: amount(r.estimated_amount),
    held: amount(r.held),
    overage: amount(r.overage),
    debt: amount(r.debt),
    anomalousTokens: Number(r.anomalous_tokens),
  }));
  return {
    object: 'report' as const,
    report: 'reconciliation' as const,
    days: query.days,
    currency: project.currency,
    data,
  };
}

/** A token count of a charge's metadata (0 when absent). */
function tokens(field: string) {
  return sql<number>`CASE WHEN jsonb_typeof(l.metadata->${field}) = 'number'
                          THEN (l.metadata->>${field})::numeric ELSE 0 END`;
}

/** The report as CSV (RFC 4180: a header line, CRLF line ends, fields quoted when they need it). */
export function reconciliationCsv(rows: ReconciliationRow[]): string {
  const field = (value: string | number) => {
    const text = String(value);
    return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
  };
  const lines = [RECONCILIATION_COLUMNS.join(',')];
  for (const row of rows) lines.push(RECONCILIATION_COLUMNS.map((c) => field(row[c])).join(','));
  return `${lines.join('\r\n')}\r\n`;
}
