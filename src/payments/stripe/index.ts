import type Stripe from 'stripe';
import { z } from 'zod';
import {
  type CheckoutInput,
  type CheckoutState,
  type PaymentProvider,
  PaymentProviderError,
  type PaymentProviderKind,
  type PaymentReference,
  type SavedCardCharge,
  type WebhookAction,
  WebhookSignatureError,
} from '../provider.ts';

/**
 * Stripe behind the payment provider boundary, through the official `stripe` library: Checkout Sessions
 * (mode `payment`), webhook endpoints, refunds, and webhook signatures (`constructEvent`, 5-minute
 * tolerance). `apiBase` (the setting STRIPE_API_URL, tests only) points the library's host, port and
 * protocol at a stand-in of Stripe's API.
 */

/** The events the webhook endpoint Tollgate creates subscribes to. */
export const STRIPE_EVENTS = [
  'checkout.session.completed',
  'checkout.session.async_payment_succeeded',
  'checkout.session.async_payment_failed',
  'checkout.session.expired',
  'charge.refunded',
  'charge.dispute.created',
  'charge.dispute.closed',
  'payment_intent.succeeded',
  'payment_intent.payment_failed',
] as const;

export const WEBHOOK_TOLERANCE_SECONDS = 300;

/**
 * The `stripe` library, imported when a project with payments first needs it: a process whose projects
 * take no payments never loads it (some 6 MB of heap).
 */
let library: Promise<typeof Stripe> | undefined;

function stripeLibrary(): Promise<typeof Stripe> {
  library ??= import('stripe').then((m) => m.default);
  return library;
}

export async function stripeClient(secretKey: string, apiBase?: string): Promise<Stripe> {
  const base = apiBase ? new URL(apiBase) : undefined;
  const Stripe = await stripeLibrary();
  return new Stripe(secretKey, {
    maxNetworkRetries: 2,
    timeout: 20_000,
    appInfo: { name: 'Tollgate' },
    ...(base
      ? {
          host: base.hostname,
          port: base.port || (base.protocol === 'http:' ? 80 : 443),
          protocol: base.protocol === 'http:' ? 'http' : 'https',
        }
      : {}),
  });
}

/** `sk_test_…abcd`: the kind of key and its last four characters, never more. */
export function keyHint(key: string): string {
  const prefix = /^(sk|rk)_(test|live)_/.exec(key)?.[0] ?? `${key.slice(0, 3)}`;
  return `${prefix}…${key.slice(-4)}`;
}

/** What a connection takes: a secret key (sk_…) or restricted key (rk_…). */
export const stripeKeySchema = z
  .string()
  .trim()
  .regex(/^(sk|rk)_(test|live)_[A-Za-z0-9_]{8,}$/, {
    message: 'must be a Stripe secret key (sk_…) or restricted key (rk_…)',
  });

/** A webhook signing secret pasted by hand (whsec_…), for an endpoint made in Stripe's dashboard. */
export const stripeWebhookSecretSchema = z
  .string()
  .trim()
  .regex(/^whsec_[A-Za-z0-9_+/=]{8,}$/, { message: 'must be a webhook signing secret (whsec_…)' });

/** Stripe in the registry of providers (../providers.ts). */
export const stripe: PaymentProviderKind = {
  name: 'stripe',
  signatureHeader: 'stripe-signature',
  create: (secretKey, env) => new StripeProvider(secretKey, env.config.STRIPE_API_URL),
  keyHint,
};

function reference(metadata: Record<string, string> | null | undefined, clientRef?: string | null) {
  return {
    paymentId: metadata?.tollgate_payment ?? clientRef ?? undefined,
    projectId: metadata?.tollgate_project,
    externalId: metadata?.tollgate_user,
  } satisfies PaymentReference;
}

/** Tollgate's reference on a checkout or a payment: its payment, project and user. */
function tollgateMetadata(input: { paymentId: string; projectId: string; externalId: string }) {
  return {
    tollgate_payment: input.paymentId,
    tollgate_project: input.projectId,
    tollgate_user: input.externalId,
  };
}

function idOf(value: string | { id: string } | null | undefined): string | null {
  if (!value) return null;
  return typeof value === 'string' ? value : value.id;
}

function providerError(err: unknown): PaymentProviderError {
  const e = err as { message?: string; statusCode?: number; type?: string; code?: string };
  const detail = e.message ?? String(err);
  return new PaymentProviderError(`Stripe: ${detail}`, e.statusCode, {
    ...(e.code ? { code: e.code } : {}),
    detail,
    // StripeCardError: declined, or authentication_required off session.
    declined: e.type === 'StripeCardError' || e.type === 'card_error' || e.code === 'authentication_required',
  });
}

export class StripeProvider implements PaymentProvider {
  readonly name = 'stripe' as const;
  readonly #secretKey: string;
  readonly #apiBase: string | undefined;
  #client: Promise<Stripe> | undefined;

  constructor(secretKey: string, apiBase?: string) {
    this.#secretKey = secretKey;
    this.#apiBase = apiBase;
  }

  /** The client, made on first use. */
  #stripe(): Promise<Stripe> {
    this.#client ??= stripeClient(this.#secretKey, this.#apiBase);
    return this.#client;
  }

  /** One call to Stripe; its failure becomes a PaymentProviderError. */
  async #call<T>(fn: (stripe: Stripe) => Promise<T>): Promise<T> {
    try {
      return await fn(await this.#stripe());
    } catch (err) {
      throw providerError(err);
    }
  }

  async verifyKey(): Promise<{ livemode: boolean }> {
    const balance = await this.#call((stripe) => stripe.balance.retrieve());
    return { livemode: Boolean(balance.livemode) };
  }

  async createWebhookEndpoint(url: string): Promise<{ id: string; secret: string }> {
    return this.#call(async (stripe) => {
      const endpoint = await stripe.webhookEndpoints.create({
        url,
        enabled_events: [...STRIPE_EVENTS],
        // Events in the shapes of the library's own API version, whatever the account's default is.
        api_version: (await stripeLibrary()).API_VERSION as Stripe.WebhookEndpointCreateParams.ApiVersion,
        description: 'Tollgate: top-ups, refunds and disputes',
      });
      if (!endpoint.secret) throw new Error('the new webhook endpoint has no secret');
      return { id: endpoint.id, secret: endpoint.secret };
    });
  }

  async deleteWebhookEndpoint(id: string): Promise<void> {
    try {
      const stripe = await this.#stripe();
      await stripe.webhookEndpoints.del(id);
    } catch (err) {
      // Already gone in the developer's account: nothing left to delete.
      if ((err as { statusCode?: number }).statusCode === 404) return;
      throw providerError(err);
    }
  }

  async updateWebhookEndpoint(id: string): Promise<void> {
    await this.#call((stripe) => stripe.webhookEndpoints.update(id, { enabled_events: [...STRIPE_EVENTS] }));
  }

  async createCheckout(input: CheckoutInput): Promise<{ id: string; url: string }> {
    const metadata = tollgateMetadata(input);
    const session = await this.#call((stripe) =>
      stripe.checkout.sessions.create(
        {
          mode: 'payment',
          line_items: [
            {
              quantity: 1,
              price_data: {
                currency: input.currency,
                unit_amount: input.amountMinor,
                product_data: { name: input.productName },
              },
            },
          ],
          client_reference_id: input.paymentId,
          metadata,
          payment_intent_data: {
            metadata,
            ...(input.saveCard ? { setup_future_usage: 'off_session' as const } : {}),
          },
          ...(input.saveCard ? { customer_creation: 'always' as const } : {}),
          success_url: input.successUrl,
          cancel_url: input.cancelUrl,
        },
        { idempotencyKey: input.idempotencyKey },
      ),
    );
    if (!session.url) throw providerError(new Error('the checkout session has no URL'));
    return { id: session.id, url: session.url };
  }

  async retrieveCheckout(id: string): Promise<CheckoutState> {
    const session = await this.#call((stripe) =>
      stripe.checkout.sessions.retrieve(id, { expand: ['payment_intent.latest_charge'] }),
    );
    return checkoutState(session);
  }

  async paymentState(paymentIntentId: string) {
    const intent = await this.#call((stripe) => stripe.paymentIntents.retrieve(paymentIntentId));
    const error = intent.last_payment_error;
    return {
      status: intent.status,
      code: error?.code ?? error?.decline_code ?? null,
      message: error?.message ?? null,
    };
  }

  async paymentReference(paymentIntentId: string): Promise<PaymentReference> {
    const intent = await this.#call((stripe) => stripe.paymentIntents.retrieve(paymentIntentId));
    return reference(intent.metadata);
  }

  async refund(input: { paymentIntentId: string; amountMinor?: number; idempotencyKey: string }) {
    const refund = await this.#call((stripe) =>
      stripe.refunds.create(
        {
          payment_intent: input.paymentIntentId,
          ...(input.amountMinor !== undefined ? { amount: input.amountMinor } : {}),
        },
        { idempotencyKey: input.idempotencyKey },
      ),
    );
    return { id: refund.id, status: refund.status ?? 'pending', amountMinor: refund.amount };
  }

  async chargeSavedCard(input: SavedCardCharge): Promise<{ id: string; status: string }> {
    const intent = await this.#call((stripe) =>
      stripe.paymentIntents.create(
        {
          amount: input.amountMinor,
          currency: input.currency,
          customer: input.customerId,
          ...(input.paymentMethodId ? { payment_method: input.paymentMethodId } : {}),
          off_session: true,
          confirm: true,
          description: input.description,
          metadata: { ...tollgateMetadata(input), tollgate_recharge: 'true' },
        },
        { idempotencyKey: input.idempotencyKey },
      ),
    );
    return { id: intent.id, status: intent.status };
  }

  async parseWebhook(rawBody: Buffer, signature: string | undefined, secret: string): Promise<WebhookAction> {
    if (!signature) throw new WebhookSignatureError('missing Stripe-Signature header');
    const stripe = await this.#stripe();
    let event: Stripe.Event;
    try {
      event = stripe.webhooks.constructEvent(rawBody, signature, secret, WEBHOOK_TOLERANCE_SECONDS);
    } catch (err) {
      throw new WebhookSignatureError((err as Error).message);
    }
    const eventId = event.id;
    switch (event.type) {
      case 'checkout.session.completed':
      case 'checkout.session.async_payment_succeeded': {
        const session = event.data.object as Stripe.Checkout.Session;
        // A delayed payment method completes the session unpaid; its async_payment_succeeded credits it.
        if (session.payment_status !== 'paid' && session.payment_status !== 'no_payment_required')
          return { type: 'ignored', eventId, eventType: `${event.type} (${session.payment_status})` };
        return { type: 'checkout_paid', eventId, checkout: checkoutState(session) };
      }
      case 'checkout.session.async_payment_failed':
      case 'checkout.session.expired': {
        const session = event.data.object as Stripe.Checkout.Session;
        return {
          type: 'checkout_failed',
          eventId,
          checkoutId: session.id,
          reference: reference(session.metadata, session.client_reference_id),
        };
      }
      case 'charge.refunded': {
        const charge = event.data.object as Stripe.Charge;
        return {
          type: 'refunded',
          eventId,
          chargeId: charge.id,
          paymentIntentId: idOf(charge.payment_intent),
          refundedMinor: charge.amount_refunded,
          currency: charge.currency,
          receiptUrl: charge.receipt_url ?? null,
          reference: reference(charge.metadata),
        };
      }
      case 'charge.dispute.created':
      case 'charge.dispute.closed': {
        const dispute = event.data.object as Stripe.Dispute;
        return {
          type: event.type === 'charge.dispute.created' ? 'dispute_opened' : 'dispute_closed',
          eventId,
          disputeId: dispute.id,
          chargeId: idOf(dispute.charge),
          paymentIntentId: idOf(dispute.payment_intent),
          amountMinor: dispute.amount,
          currency: dispute.currency,
          status: dispute.status,
        };
      }
      case 'payment_intent.succeeded': {
        const intent = event.data.object as Stripe.PaymentIntent;
        return {
          type: 'intent_succeeded',
          eventId,
          paymentIntentId: intent.id,
          amountMinor: intent.amount_received || intent.amount,
          currency: intent.currency,
          chargeId: idOf(intent.latest_charge),
          customerId: idOf(intent.customer),
          reference: reference(intent.metadata),
        };
      }
      case 'payment_intent.payment_failed': {
        const intent = event.data.object as Stripe.PaymentIntent;
        const error = intent.last_payment_error;
        return {
          type: 'intent_failed',
          eventId,
          paymentIntentId: intent.id,
          customerId: idOf(intent.customer),
          code: error?.code ?? error?.decline_code ?? null,
          message: error?.message ?? 'The payment failed.',
          reference: reference(intent.metadata),
        };
      }
      default:
        return { type: 'ignored', eventId, eventType: event.type };
    }
  }
}

function checkoutState(session: Stripe.Checkout.Session): CheckoutState {
  const intent = session.payment_intent;
  const charge =
    intent && typeof intent === 'object' && intent.latest_charge && typeof intent.latest_charge === 'object'
      ? intent.latest_charge
      : undefined;
  return {
    id: session.id,
    paid: session.payment_status === 'paid' || session.payment_status === 'no_payment_required',
    amountMinor: session.amount_total ?? 0,
    currency: session.currency ?? '',
    paymentIntentId: idOf(intent),
    chargeId: charge?.id ?? idOf(intent && typeof intent === 'object' ? intent.latest_charge : null),
    receiptUrl: charge?.receipt_url ?? null,
    reference: reference(session.metadata, session.client_reference_id),
    customerId: idOf(session.customer),
    paymentMethodId: intent && typeof intent === 'object' ? idOf(intent.payment_method) : null,
  };
}
