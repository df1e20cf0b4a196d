import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { currencyDecimals, formatAmount, Money } from '../core/money.ts';
import type { Database } from '../db/index.ts';

/**
 * The payment provider boundary (Medusa's shape): what Tollgate asks of a provider, on plain inputs,
 * and the provider's webhooks turned into provider-neutral actions. The webhook route only verifies and
 * normalises (`parseWebhook`); ./service.ts applies an action once, with the provider's object id in its
 * movement key. Stripe is ./stripe, the test provider (payments offline, never in production)
 * ./test-provider; another provider implements the same interface and is listed in ./providers.ts (the
 * registry keyed by name: the webhook URL, the connection row and the ledger's `source` carry that name).
 *
 * Saved cards and off-session recharges (issue 25): `saveCard` on `CheckoutInput` keeps the card for
 * later (the checkout's customer and payment method come back on `CheckoutState`), `chargeSavedCard`
 * charges it off session, and the payment's outcome arrives as `intent_succeeded` / `intent_failed`.
 */
export interface PaymentProvider {
  readonly name: string;
  /** A live call that proves the key works; throws PaymentProviderError otherwise. */
  verifyKey(): Promise<{ livemode: boolean }>;
  /** Creates the webhook endpoint in the developer's account for the events Tollgate needs. */
  createWebhookEndpoint(url: string): Promise<{ id: string; secret: string }>;
  deleteWebhookEndpoint(id: string): Promise<void>;
  /** Subscribes an endpoint Tollgate created to every event it needs now (one made before auto-recharge). */
  updateWebhookEndpoint(id: string): Promise<void>;
  createCheckout(input: CheckoutInput): Promise<{ id: string; url: string }>;
  /** The state of a checkout (to settle an event that arrived before its checkout's completion). */
  retrieveCheckout(id: string): Promise<CheckoutState>;
  /** The state of a payment (a recharge whose webhook never came): its status and last error. */
  paymentState(
    paymentIntentId: string,
  ): Promise<{ status: string; code: string | null; message: string | null }>;
  /** The reference Tollgate wrote on a payment (to find the top-up of a charge event that came early). */
  paymentReference(paymentIntentId: string): Promise<PaymentReference>;
  /** Asks for a refund; the ledger work is done by the refund's webhook. */
  refund(input: { paymentIntentId: string; amountMinor?: number; idempotencyKey: string }): Promise<{
    id: string;
    status: string;
    amountMinor: number;
  }>;
  /**
   * Charges a saved card off session for a recharge. Resolves with the provider's payment (which is
   * credited only by its webhook); a declined card or one that needs its holder throws a
   * PaymentProviderError with `declined` set.
   */
  chargeSavedCard(input: SavedCardCharge): Promise<{ id: string; status: string }>;
  /** Verifies the signature (throws WebhookSignatureError) and normalises the event. */
  parseWebhook(rawBody: Buffer, signature: string | undefined, secret: string): Promise<WebhookAction>;
}

/** What a provider's client may use of the process: the settings, the database, the log, the address. */
export interface ProviderEnv {
  config: Config;
  db: Database;
  log: Logger;
  /** Public address (read when needed: a server sets it once bound). */
  readonly publicBaseUrl: string;
}

/** A provider as the registry (./providers.ts) knows it: its name, and how to talk to an account. */
export interface PaymentProviderKind {
  readonly name: string;
  /** The request header carrying the webhook's signature (`stripe-signature`). */
  readonly signatureHeader: string;
  /** Whether the configuration allows this provider at all (the test provider: not in production). */
  available?(config: Config): boolean;
  /** The client of one account, from its secret key (the settings may point it at a stand-in: tests). */
  create(secretKey: string, env: ProviderEnv): PaymentProvider;
  /** What may be shown of a key: its kind and last characters, never more. */
  keyHint(secretKey: string): string;
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
  /** Keep the card for off-session recharges (a customer is created for it). */
  saveCard?: boolean;
}

export interface SavedCardCharge {
  /** Tollgate's payment id of the recharge. */
  paymentId: string;
  projectId: string;
  externalId: string;
  customerId: string;
  paymentMethodId: string | null;
  currency: string;
  amountMinor: number;
  description: string;
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
  /** The customer the checkout created or used (a saved card's owner), when any. */
  customerId: string | null;
  /** The card paid with (known when the payment was read expanded). */
  paymentMethodId: string | null;
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
  | {
      type: 'intent_succeeded';
      eventId: string;
      paymentIntentId: string;
      amountMinor: number;
      currency: string;
      chargeId: string | null;
      /** The customer charged (a recharge charges the saved card's customer). */
      customerId: string | null;
      reference: PaymentReference;
    }
  | {
      type: 'intent_failed';
      eventId: string;
      paymentIntentId: string;
      customerId: string | null;
      /** The provider's code (`card_declined`, `authentication_required`, …). */
      code: string | null;
      message: string;
      reference: PaymentReference;
    }
  | { type: 'ignored'; eventId: string; eventType: string };

export class PaymentProviderError extends Error {
  readonly status: number | undefined;
  /** The provider's error code (`card_declined`, `authentication_required`, …). */
  readonly code: string | undefined;
  /** The card was declined or needs its holder: retrying off session will not help. */
  readonly declined: boolean;
  /** The provider's own words, without the provider's name (what a user is shown). */
  readonly detail: string;
  constructor(
    message: string,
    status?: number,
    extra: { code?: string; declined?: boolean; detail?: string } = {},
  ) {
    super(message);
    this.status = status;
    this.code = extra.code;
    this.declined = extra.declined ?? false;
    this.detail = extra.detail ?? message;
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
