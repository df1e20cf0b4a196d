import { randomBytes } from 'node:crypto';
import { testPaymentsAllowed } from '../../config/index.ts';
import {
  type CheckoutInput,
  type CheckoutState,
  type PaymentProvider,
  PaymentProviderError,
  type PaymentProviderKind,
  type PaymentReference,
  type ProviderEnv,
  type SavedCardCharge,
  type WebhookAction,
} from '../provider.ts';
import {
  type CardNumber,
  type Checkout,
  type Intent,
  isTestCard,
  newEvent,
  SIGNATURE_HEADER,
  TEST_CARDS,
  TestAccount,
  type TestEvent,
  testId,
  verifiedEvent,
} from './account.ts';

/**
 * The `test` payment provider: payments without a provider account or the network, for `tollgate dev`
 * and a setting that turns it on (TOLLGATE_TEST_PAYMENTS; never in a production configuration). Its
 * checkout is a page Tollgate hosts (src/pages/test-checkout.ts) where the payer picks a test card —
 * one that succeeds, one that is declined, one that asks for authentication (passed or failed) — and
 * its outcome reaches Tollgate as Stripe's does: a signed webhook to `/payments/test/{project}/webhook`,
 * applied by the same handlers (./webhooks), once. Saved cards, off-session recharges and refunds work
 * as with Stripe; the card saved decides how a later recharge ends (the authentication card needs its
 * holder, so off session it fails with `authentication_required`).
 */

export { TEST_CARDS } from './account.ts';

/** The test provider in the registry of providers (../providers.ts): only where test payments are allowed. */
export const testProvider: PaymentProviderKind = {
  name: 'test',
  signatureHeader: SIGNATURE_HEADER,
  available: testPaymentsAllowed,
  create: (secretKey, env) => new TestProvider(secretKey, env),
  keyHint: () => 'test',
};

/** A new test account's key: what the connection keeps sealed, as it keeps a Stripe key. */
export const newTestAccountKey = () => `tpk_test_${randomBytes(16).toString('hex')}`;

/** What the checkout page shows, and how a payment attempt on it ended. */
export type Completion =
  | { outcome: 'paid'; successUrl: string }
  | { outcome: 'declined' | 'authentication_failed'; message: string }
  | { outcome: 'authenticate' };

export class TestProvider implements PaymentProvider {
  readonly name = 'test' as const;
  readonly account: TestAccount;
  readonly #env: ProviderEnv;

  constructor(secretKey: string, env: ProviderEnv) {
    if (!testPaymentsAllowed(env.config))
      throw new PaymentProviderError('Test payments are off in this configuration.', 400);
    this.account = new TestAccount(env.db, secretKey, env);
    this.#env = env;
  }

  /** The provider of the account that holds a checkout; undefined for a checkout no account has. */
  static async ofCheckout(env: ProviderEnv, checkoutId: string): Promise<TestProvider | undefined> {
    const row = await env.db
      .selectFrom('test_payment_objects')
      .select('account')
      .where('id', '=', checkoutId)
      .where('kind', '=', 'checkout')
      .executeTakeFirst();
    return row ? new TestProvider(row.account, env) : undefined;
  }

  async verifyKey(): Promise<{ livemode: boolean }> {
    return { livemode: false };
  }

  async createWebhookEndpoint(url: string): Promise<{ id: string; secret: string }> {
    const secret = `whsec_test_${randomBytes(24).toString('hex')}`;
    const { id } = await this.account.create('endpoint', testId('twe'), { url, secret });
    return { id, secret };
  }

  async deleteWebhookEndpoint(id: string): Promise<void> {
    await this.account.remove('endpoint', id);
  }

  async updateWebhookEndpoint(): Promise<void> {
    // Every event goes to every endpoint: nothing to subscribe to.
  }

  async createCheckout(input: CheckoutInput): Promise<{ id: string; url: string }> {
    const checkout: Checkout = {
      amountMinor: input.amountMinor,
      currency: input.currency,
      productName: input.productName,
      reference: { paymentId: input.paymentId, projectId: input.projectId, externalId: input.externalId },
      successUrl: input.successUrl,
      cancelUrl: input.cancelUrl,
      saveCard: input.saveCard ?? false,
      status: 'open',
      intentId: null,
      customerId: null,
      paymentMethodId: null,
      event: null,
    };
    const { id } = await this.account.create('checkout', testId('tcs'), checkout, input.idempotencyKey);
    return { id, url: `${this.#env.publicBaseUrl}/payments/test/checkout/${id}` };
  }

  async checkout(id: string): Promise<Checkout | undefined> {
    return this.account.get('checkout', id);
  }

  async retrieveCheckout(id: string): Promise<CheckoutState> {
    const checkout = await this.account.get('checkout', id);
    if (!checkout) throw new PaymentProviderError(`No such checkout: ${id}`, 404);
    const intent = checkout.intentId ? await this.account.get('intent', checkout.intentId) : undefined;
    return checkoutState(id, checkout, intent);
  }

  async #intent(id: string): Promise<Intent> {
    const intent = await this.account.get('intent', id);
    if (!intent) throw new PaymentProviderError(`No such payment: ${id}`, 404);
    return intent;
  }

  async paymentState(paymentIntentId: string) {
    const intent = await this.#intent(paymentIntentId);
    return { status: intent.status, code: intent.code, message: intent.message };
  }

  async paymentReference(paymentIntentId: string): Promise<PaymentReference> {
    return (await this.#intent(paymentIntentId)).reference;
  }

  /**
   * Pays a checkout with a test card, as the payer on the checkout page: the succeeding card (or the
   * authentication card, authentication passed) completes it and its webhook is delivered before this
   * resolves; a declined card or a failed authentication leaves it open and sends nothing. A checkout
   * completed already is not paid twice: its completion's event is delivered again.
   */
  async complete(
    checkoutId: string,
    card: string,
    authentication?: 'passed' | 'failed',
  ): Promise<Completion | undefined> {
    if (!isTestCard(card)) return { outcome: 'declined', message: 'Use one of the test cards.' };
    type Attempt = Exclude<Completion, { outcome: 'paid' }> | { checkout: Checkout; event: TestEvent };
    const done = await this.account.update<'checkout', Attempt>(
      'checkout',
      checkoutId,
      async (checkout, tx) => {
        if (checkout.status === 'complete' && checkout.event)
          return { result: { checkout, event: checkout.event } };
        const outcome = TEST_CARDS[card];
        if (outcome === 'decline')
          return { result: { outcome: 'declined' as const, message: 'Your card was declined.' } };
        if (outcome === 'authenticate' && authentication === undefined)
          return { result: { outcome: 'authenticate' as const } };
        if (authentication === 'failed')
          return {
            result: {
              outcome: 'authentication_failed' as const,
              message: 'The authentication failed; nothing was charged.',
            },
          };
        const paid = await pay(tx, checkoutId, checkout, card);
        return { data: paid.checkout, result: paid };
      },
    );
    if (!done) return undefined;
    if ('outcome' in done) return done;
    await this.account.deliver(done.event);
    return { outcome: 'paid', successUrl: done.checkout.successUrl };
  }

  async refund(input: { paymentIntentId: string; amountMinor?: number; idempotencyKey: string }) {
    const before = await this.account.byIdempotencyKey('refund', input.idempotencyKey);
    if (before) return { id: before.id, status: 'succeeded', amountMinor: before.data.amountMinor };
    const id = testId('tre');
    const refunded = await this.account.update('intent', input.paymentIntentId, async (intent, tx) => {
      const amountMinor = input.amountMinor ?? intent.amountMinor - intent.refundedMinor;
      if (intent.status !== 'succeeded' || amountMinor <= 0)
        throw new PaymentProviderError('The payment cannot be refunded.', 400);
      if (intent.refundedMinor + amountMinor > intent.amountMinor)
        throw new PaymentProviderError('The refund is more than what is left of the payment.', 400);
      await tx.create('refund', id, { intentId: input.paymentIntentId, amountMinor }, input.idempotencyKey);
      const data = { ...intent, refundedMinor: intent.refundedMinor + amountMinor };
      return { data, result: { intent: data, amountMinor } };
    });
    if (!refunded) throw new PaymentProviderError(`No such payment: ${input.paymentIntentId}`, 404);
    const { intent } = refunded;
    this.account.deliverLater(
      newEvent({
        type: 'refunded',
        chargeId: intent.chargeId ?? input.paymentIntentId,
        paymentIntentId: input.paymentIntentId,
        refundedMinor: intent.refundedMinor,
        currency: intent.currency,
        receiptUrl: null,
        reference: intent.reference,
      }),
    );
    return { id, status: 'succeeded', amountMinor: refunded.amountMinor };
  }

  async chargeSavedCard(input: SavedCardCharge): Promise<{ id: string; status: string }> {
    const card = input.paymentMethodId ? await this.account.get('card', input.paymentMethodId) : undefined;
    const outcome = card?.customerId === input.customerId ? TEST_CARDS[card.number] : 'decline';
    const failure =
      outcome === 'succeed'
        ? null
        : outcome === 'authenticate'
          ? { code: 'authentication_required', message: 'The card needs its holder to authenticate.' }
          : { code: 'card_declined', message: 'Your card was declined.' };
    const intent: Intent = {
      amountMinor: input.amountMinor,
      currency: input.currency,
      reference: { paymentId: input.paymentId, projectId: input.projectId, externalId: input.externalId },
      status: failure ? 'requires_payment_method' : 'succeeded',
      chargeId: failure ? null : testId('tch'),
      customerId: input.customerId,
      paymentMethodId: input.paymentMethodId,
      refundedMinor: 0,
      code: failure?.code ?? null,
      message: failure?.message ?? null,
    };
    const made = await this.account.create('intent', testId('tpi'), intent, input.idempotencyKey);
    if (made.created) this.account.deliverLater(newEvent(intentAction(made.id, made.data)));
    if (made.data.status !== 'succeeded') {
      throw new PaymentProviderError(`Test payments: ${made.data.message}`, 402, {
        code: made.data.code ?? 'card_declined',
        declined: true,
        detail: made.data.message ?? 'Your card was declined.',
      });
    }
    return { id: made.id, status: made.data.status };
  }

  async parseWebhook(rawBody: Buffer, signature: string | undefined, secret: string): Promise<WebhookAction> {
    const event = verifiedEvent(rawBody, signature, secret);
    return { ...event.action, eventId: event.id } as WebhookAction;
  }
}

/** Pays an open checkout: its payment (and, when asked, the customer and the saved card) and its event. */
async function pay(tx: TestAccount, checkoutId: string, checkout: Checkout, card: CardNumber) {
  const customerId = checkout.saveCard ? testId('tcus') : null;
  const paymentMethodId = checkout.saveCard ? testId('tpm') : null;
  if (customerId && paymentMethodId) await tx.create('card', paymentMethodId, { customerId, number: card });
  const intent: Intent = {
    amountMinor: checkout.amountMinor,
    currency: checkout.currency,
    reference: checkout.reference,
    status: 'succeeded',
    chargeId: testId('tch'),
    customerId,
    paymentMethodId,
    refundedMinor: 0,
    code: null,
    message: null,
  };
  const intentId = testId('tpi');
  await tx.create('intent', intentId, intent);
  const completed: Checkout = { ...checkout, status: 'complete', intentId, customerId, paymentMethodId };
  const event = newEvent({ type: 'checkout_paid', checkout: checkoutState(checkoutId, completed, intent) });
  return { checkout: { ...completed, event }, event };
}

function intentAction(id: string, intent: Intent): TestEvent['action'] {
  return intent.status === 'succeeded'
    ? {
        type: 'intent_succeeded',
        paymentIntentId: id,
        amountMinor: intent.amountMinor,
        currency: intent.currency,
        chargeId: intent.chargeId,
        customerId: intent.customerId,
        reference: intent.reference,
      }
    : {
        type: 'intent_failed',
        paymentIntentId: id,
        customerId: intent.customerId,
        code: intent.code,
        message: intent.message ?? 'The payment failed.',
        reference: intent.reference,
      };
}

function checkoutState(id: string, checkout: Checkout, intent: Intent | undefined): CheckoutState {
  return {
    id,
    paid: checkout.status === 'complete',
    amountMinor: checkout.amountMinor,
    currency: checkout.currency,
    paymentIntentId: checkout.intentId,
    chargeId: intent?.chargeId ?? null,
    receiptUrl: null,
    reference: checkout.reference,
    customerId: checkout.customerId,
    paymentMethodId: checkout.paymentMethodId,
  };
}
