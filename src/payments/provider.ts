import { currencyDecimals, formatAmount, Money } from '../core/money.ts';

/**
 * The payment provider boundary (Medusa's shape): what Tollgate asks of a provider, on plain inputs,
 * and the provider's webhooks turned into provider-neutral actions. The webhook route only verifies and
 * normalises (`parseWebhook`); ./service.ts applies an action once, with the provider's object id in its
 * movement key. Stripe is ./stripe; a second provider implements the same interface.
 *
 * Issue 25 (saved cards, off-session recharges) adds methods here — e.g. `saveCardAtCheckout` on
 * `CheckoutInput` and `chargeSavedCard(customer, amount, idempotencyKey)` — and an action for the
 * off-session payment's outcome; nothing else in the boundary has to change.
 */
export interface PaymentProvider {
  readonly name: 'stripe';
  /** A live call that proves the key works; throws PaymentProviderError otherwise. */
  verifyKey(): Promise<{ livemode: boolean }>;
  /** Creates the webhook endpoint in the developer's account for the events Tollgate needs. */
  createWebhookEndpoint(url: string): Promise<{ id: string; secret: string }>;
  deleteWebhookEndpoint(id: string): Promise<void>;
  createCheckout(input: CheckoutInput): Promise<{ id: string; url: string }>;
  /** The state of a checkout (to settle an event that arrived before its checkout's completion). */
  retrieveCheckout(id: string): Promise<CheckoutState>;
  /** The reference Tollgate wrote on a payment (to find the top-up of a charge event that came early). */
  paymentReference(paymentIntentId: string): Promise<PaymentReference>;
  /** Asks for a refund; the ledger work is done by the refund's webhook. */
  refund(input: { paymentIntentId: string; amountMinor?: number; idempotencyKey: string }): Promise<{
    id: string;
    status: string;
    amountMinor: number;
  }>;
  /** Verifies the signature (throws WebhookSignatureError) and normalises the event. */
  parseWebhook(rawBody: Buffer, signature: string | undefined, secret: string): WebhookAction;
}

export interface CheckoutInput {
  /** Tollgate's payment id (the top-up id). */
  paymentId: string;
  projectId: string;
  externalId: string;
  productName: string;
  currency: string;
  amountMinor: number;
  successUrl: string;
  cancelUrl: string;
  idempotencyKey: string;
}

export interface CheckoutState {
  id: string;
  paid: boolean;
  amountMinor: number;
  currency: string;
  paymentIntentId: string | null;
  chargeId: string | null;
  receiptUrl: string | null;
  reference: PaymentReference;
}

/** What Tollgate wrote on the checkout: its payment, project and user. */
export interface PaymentReference {
  paymentId: string | undefined;
  projectId: string | undefined;
  externalId: string | undefined;
}

export type WebhookAction =
  | { type: 'checkout_paid'; eventId: string; checkout: CheckoutState }
  | { type: 'checkout_failed'; eventId: string; checkoutId: string; reference: PaymentReference }
  | {
      type: 'refunded';
      eventId: string;
      chargeId: string;
      paymentIntentId: string | null;
      /** Refunded so far on the charge, in total (cumulative: a late event carries a smaller total). */
      refundedMinor: number;
      currency: string;
      receiptUrl: string | null;
      reference: PaymentReference;
    }
  | {
      type: 'dispute_opened' | 'dispute_closed';
      eventId: string;
      disputeId: string;
      chargeId: string | null;
      paymentIntentId: string | null;
      amountMinor: number;
      currency: string;
      /** The provider's dispute status (`won`, `lost`, `needs_response`, …). */
      status: string;
    }
  | { type: 'ignored'; eventId: string; eventType: string };

export class PaymentProviderError extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.status = status;
  }
}

export class WebhookSignatureError extends Error {}

/** An amount in the currency's minor units (cents; yen as they are; 3-decimal currencies ×1000). */
export function toMinorUnits(amount: string, currency: string): number {
  const minor = new Money(amount).times(new Money(10).pow(currencyDecimals(currency)));
  if (!minor.isInteger()) throw new Error(`${amount} ${currency} is finer than the currency's minor unit`);
  return minor.toNumber();
}

export function fromMinorUnits(minor: number, currency: string): string {
  return formatAmount(new Money(minor).div(new Money(10).pow(currencyDecimals(currency))));
}
