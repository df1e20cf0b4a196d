import type { FastifyReply } from 'fastify';
import { z } from 'zod';
import { amountSchema } from '../../core/money.ts';
import { parseInput, storableText, textInput, wholeNumberParam } from '../../core/validation.ts';
import type { IdempotentResult } from '../../idempotency/index.ts';
import { userIdSchema } from '../../users/schema.ts';

/** The request schemas the admin API's route modules share, and the ways they answer. */

export const limitSchema = wholeNumberParam(100, 20);
export const pageQuery = z.strictObject({ limit: limitSchema, starting_after: textInput(255).optional() });
export const projectParams = z.object({ project: textInput(255, 'a project id') });
export const projectItemParams = projectParams.extend({ id: textInput(255, 'an id') });
export const userParams = projectParams.extend({ user: userIdSchema });
export const nameBody = z.strictObject({ name: storableText(200).default('default') });

/** An amount checked in the project's currency. */
export function amountIn(currency: string, amount: string): string {
  return parseInput(z.object({ amount: amountSchema(currency) }), { amount }).amount;
}

/** The answer of an operation run once per Idempotency-Key (a replay says so in a header). */
export function sendIdempotent(reply: FastifyReply, result: IdempotentResult) {
  if (result.replayed) reply.header('idempotent-replayed', 'true');
  if (result.raw !== undefined)
    return reply.status(result.status).type('application/json; charset=utf-8').send(result.raw);
  return reply.status(result.status).send(result.body);
}

/** A CSV export, downloaded as `filename`. */
export function sendCsv(reply: FastifyReply, filename: string, csv: string) {
  return reply
    .type('text/csv; charset=utf-8')
    .header('content-disposition', `attachment; filename="${filename}"`)
    .send(csv);
}
