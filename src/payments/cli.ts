import type { AppContext } from '../app/context.ts';
import { CLI_ACTOR } from '../audit/index.ts';
import type { Output } from '../cli/output.ts';
import { UsageError } from '../cli/output.ts';
import type { AdminClient } from '../cli/remote.ts';
import { optional, required, type Values } from '../cli/values.ts';
import { getProject } from '../projects/service.ts';
import {
  connectPayments,
  disconnectPayments,
  listPayments,
  refundPayment,
  showPayments,
  updatePaymentSettings,
} from './service.ts';

/**
 * `tollgate payments connect|show|auto-recharge|disconnect|list|refund`: on the database directly, or over the admin
 * API when TOLLGATE_URL and TOLLGATE_ADMIN_TOKEN are set (the same operations either way).
 */

// biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
type Json = any;

export interface PaymentsApi {
  connect(projectId: string, body: Record<string, unknown>): Promise<Json>;
  show(projectId: string): Promise<Json>;
  settings(projectId: string, body: Record<string, unknown>): Promise<Json>;
  disconnect(projectId: string): Promise<Json>;
  list(projectId: string, user: string | undefined): Promise<Json>;
  refund(projectId: string, paymentId: string, amount: string | undefined): Promise<Json>;
}

export function localPaymentsApi(ctx: AppContext): PaymentsApi {
  return {
    async connect(projectId, body) {
      await getProject(ctx.db, projectId);
      return connectPayments(ctx, projectId, body as Parameters<typeof connectPayments>[2], CLI_ACTOR);
    },
    show: (projectId) => showPayments(ctx, projectId),
    settings: (projectId, body) =>
      updatePaymentSettings(ctx, projectId, body as Parameters<typeof updatePaymentSettings>[2], CLI_ACTOR),
    disconnect: (projectId) => disconnectPayments(ctx, projectId, CLI_ACTOR),
    list: (projectId, user) => listPayments(ctx, projectId, { user, limit: 100 }),
    refund: (projectId, paymentId, amount) => refundPayment(ctx, projectId, paymentId, { amount }, CLI_ACTOR),
  };
}

export function remotePaymentsApi(client: AdminClient): PaymentsApi {
  const base = (projectId: string) => `/projects/${encodeURIComponent(projectId)}/payments`;
  return {
    connect: (projectId, body) => client.call('PUT', base(projectId), body),
    show: (projectId) => client.call('GET', base(projectId)),
    settings: (projectId, body) => client.call('PATCH', base(projectId), body),
    disconnect: (projectId) => client.call('DELETE', base(projectId)),
    list: (projectId, user) =>
      client.call(
        'GET',
        `${base(projectId)}/list?limit=100${user ? `&user=${encodeURIComponent(user)}` : ''}`,
      ),
    refund: (projectId, paymentId, amount) =>
      client.call(
        'POST',
        `${base(projectId)}/${encodeURIComponent(paymentId)}/refund`,
        amount ? { amount } : {},
      ),
  };
}

function describe(view: Json): string[] {
  if (!view.connected) return [`Payments: not connected (${view.projectId})`];
  return [
    `Payments: ${view.provider} connected to ${view.projectId} (${view.livemode ? 'live' : 'test'} mode)`,
    `  key: ${view.keyHint} (sealed; never shown again)`,
    `  webhook: ${view.webhook.url} (${view.webhook.managed ? `endpoint ${view.webhook.endpointId}` : 'endpoint made by hand'})`,
    `  top-ups: presets ${view.settings.presets?.join(', ')}; minimum ${view.settings.minimum}; maximum ${view.settings.maximum}`,
    view.settings.autoRecharge?.offered
      ? `  auto-recharge: offered; below ${view.settings.autoRecharge.threshold}, ${view.settings.autoRecharge.amount} at a time, at most ${view.settings.autoRecharge.monthlyCap} a month per user`
      : '  auto-recharge: not offered',
  ];
}

export async function paymentsCommand(
  api: PaymentsApi,
  sub: string | undefined,
  values: Values,
  out: Output,
) {
  const projectId = required(values, 'project');
  switch (sub) {
    case 'connect': {
      const presets = optional(values, 'presets');
      const minimum = optional(values, 'minimum');
      const maximum = optional(values, 'maximum');
      const webhookSecret = optional(values, 'webhook-secret');
      const settings = {
        ...(presets ? { presets: presets.split(',').map((p) => p.trim()) } : {}),
        ...(minimum ? { minimum } : {}),
        ...(maximum ? { maximum } : {}),
      };
      const view = await api.connect(projectId, {
        stripeKey: required(values, 'stripe-key'),
        ...(webhookSecret ? { webhookSecret } : {}),
        ...(Object.keys(settings).length ? { settings } : {}),
      });
      return out.result(view, describe(view));
    }
    case 'show': {
      const view = await api.show(projectId);
      return out.result(view, describe(view));
    }
    case 'auto-recharge': {
      const offered = required(values, 'offered');
      if (offered !== 'on' && offered !== 'off') throw new UsageError('--offered must be on or off');
      const threshold = optional(values, 'threshold');
      const amount = optional(values, 'amount');
      const monthlyCap = optional(values, 'monthly-cap');
      const view = await api.settings(projectId, {
        autoRecharge: {
          offered: offered === 'on',
          ...(threshold ? { threshold } : {}),
          ...(amount ? { amount } : {}),
          ...(monthlyCap ? { monthlyCap } : {}),
        },
      });
      return out.result(view, describe(view));
    }
    case 'disconnect': {
      const result = await api.disconnect(projectId);
      return out.result(
        result,
        result.deleted
          ? `Disconnected payments from ${projectId}${result.webhookEndpointDeleted ? ' (webhook endpoint deleted)' : ''}`
          : `${projectId} had no payments connected`,
      );
    }
    case 'list': {
      const page = await api.list(projectId, optional(values, 'user'));
      return out.result(
        page.data,
        page.data.length
          ? page.data.map(
              (p: Json) =>
                `${p.id}  ${p.user}  ${p.amount} ${p.currency}  ${p.status}${p.refunded !== '0.00' && p.refunded !== '0' ? ` (refunded ${p.refunded})` : ''}`,
            )
          : ['no payments'],
      );
    }
    case 'refund': {
      const refund = await api.refund(projectId, required(values, 'payment'), optional(values, 'amount'));
      return out.result(
        refund,
        `Refund ${refund.id} of ${refund.amount} ${refund.currency} (${refund.status}); the balance is debited when Stripe confirms it`,
      );
    }
    default:
      throw new UsageError(`unknown command: payments ${sub ?? ''}`.trim());
  }
}
