import { type OpenConnection, openConnection, type PaymentsContext } from '../connection.ts';
import { type WebhookAction, WebhookSignatureError } from '../provider.ts';
import { checkoutFailed, checkoutPaid } from './checkout.ts';
import { dispute } from './dispute.ts';
import type { WebhookScope } from './movement.ts';
import { rechargeFailed, rechargePaid } from './recharge.ts';
import { refunded } from './refund.ts';

/**
 * A provider's webhooks applied to the ledger exactly once: the route (../routes.ts) hands over the raw
 * body and the signature; the provider verifies and normalises the event into a `WebhookAction`, and
 * one handler per action applies it (./checkout.ts, ./refund.ts, ./dispute.ts, ./recharge.ts), each
 * through the shared step of ./movement.ts.
 */

export type WebhookOutcome =
  | { status: 200; body: { received: true; outcome: string } }
  | { status: 400; body: { error: { message: string; type: string; code: string } } };

const ack = (outcome: string): WebhookOutcome => ({ status: 200, body: { received: true, outcome } });

type Handlers = {
  [T in WebhookAction['type']]: (
    scope: WebhookScope,
    action: Extract<WebhookAction, { type: T }>,
  ) => Promise<string>;
};

const handlers: Handlers = {
  checkout_paid: checkoutPaid,
  checkout_failed: checkoutFailed,
  refunded,
  dispute_opened: dispute,
  dispute_closed: dispute,
  intent_succeeded: rechargePaid,
  intent_failed: rechargeFailed,
  ignored: async (_scope, action) => `ignored:${action.eventType}`,
};

/**
 * Handles one webhook delivery of a provider for a project: verifies the signature against the
 * project's sealed signing secret (400 and nothing written when it fails), then applies the action. An
 * event for an unknown project, payment or user is acknowledged (200) and logged: retrying would not help.
 */
export async function handleWebhook(
  ctx: PaymentsContext,
  provider: string,
  projectId: string,
  rawBody: Buffer,
  signature: string | undefined,
): Promise<WebhookOutcome> {
  const connected = await openConnection(ctx, projectId);
  if (!connected || connected.connection.provider !== provider) {
    ctx.log.warn({ projectId }, 'payment webhook for a project without payments; acknowledged');
    return ack('not_connected');
  }
  const action = await verified(connected, rawBody, signature);
  if (!('type' in action)) return action;
  const project = await ctx.projects.get(projectId);
  if (!project) return ack('unknown_project');
  const scope: WebhookScope = { ctx, project, provider: connected.provider };
  const handle = handlers[action.type] as (scope: WebhookScope, action: WebhookAction) => Promise<string>;
  const outcome = await handle(scope, action);
  if (outcome !== 'applied' && outcome !== 'duplicate')
    ctx.log.info({ projectId, eventId: action.eventId, outcome }, 'payment webhook acknowledged');
  return ack(outcome);
}

/** The event, verified and normalised; the 400 answer when its signature does not hold. */
async function verified(
  connected: OpenConnection,
  rawBody: Buffer,
  signature: string | undefined,
): Promise<WebhookAction | WebhookOutcome> {
  try {
    return await connected.provider.parseWebhook(rawBody, signature, connected.webhookSecret());
  } catch (err) {
    if (!(err instanceof WebhookSignatureError)) throw err;
    return {
      status: 400,
      body: {
        error: {
          message: `Webhook signature verification failed: ${err.message}`,
          type: 'invalid_request_error',
          code: 'invalid_signature',
        },
      },
    };
  }
}
