import type { FastifyReply } from 'fastify';
import { z } from 'zod';
import { testPaymentsAllowed } from '../config/index.ts';
import { formatForCurrency } from '../core/money.ts';
import { routeModule } from '../core/plugins.ts';
import { PRIVATE_HEADERS, sendPage } from '../html/hosted-page.ts';
import { html, raw } from '../html/index.ts';
import { fromMinorUnits } from '../payments/provider.ts';
import type { Checkout } from '../payments/test-provider/account.ts';
import { type Completion, type TEST_CARDS, TestProvider } from '../payments/test-provider/index.ts';
import { CHECKOUT_STYLE } from './links.ts';

/**
 * The checkout page of the test payment provider (src/payments/test-provider), which Tollgate hosts in
 * place of a provider's: `GET /payments/test/checkout/{id}` shows the amount and the test cards — one
 * that succeeds, one that is declined, one that asks for authentication — under a "Test mode" banner;
 * `POST` pays with the chosen card (`card`), and for the authentication card shows the authentication
 * step, whose buttons post `authentication=passed|failed`. A paid checkout goes back to the top-up's
 * done page; its webhook has been delivered by then. Registered only where test payments are allowed.
 */

const CARD_LABELS: Record<keyof typeof TEST_CARDS, string> = {
  '4242424242424242': '4242 4242 4242 4242 — succeeds',
  '4000000000000002': '4000 0000 0000 0002 — declined',
  '4000002760003184': '4000 0027 6000 3184 — asks for authentication',
};

const params = z.object({ id: z.string().regex(/^tcs_[0-9a-f]{24}$/) });
const body = z.object({
  card: z.string().max(32).default(''),
  authentication: z.enum(['passed', 'failed']).optional(),
  cancel: z.string().optional(),
});

const BANNER = html`<p class="test-banner" role="note"><strong>Test mode</strong> — a test checkout: no card is charged and no money moves.</p>`;
const STYLE = raw(
  `<style>.test-banner{background:#fff4d6;color:#5a4500;border:1px solid #e0b84a;border-radius:8px;padding:.5rem .8rem}button.secondary{background:transparent;color:var(--accent);border:1px solid var(--accent);margin-left:.5rem}</style>`,
);

function page(
  reply: FastifyReply,
  checkout: Checkout,
  options: { card?: string; error?: string; status?: number; authenticate?: boolean },
) {
  const amount = `${formatForCurrency(fromMinorUnits(checkout.amountMinor, checkout.currency), checkout.currency)} ${checkout.currency.toUpperCase()}`;
  const chosen = options.card && options.card in CARD_LABELS ? options.card : '4242424242424242';
  if (options.authenticate)
    return sendPage(
      reply,
      200,
      'Test checkout: authentication',
      html`${raw(CHECKOUT_STYLE)}${STYLE}${BANNER}<h1>Authenticate this payment</h1>
<p>Your bank asks you to confirm the payment of <strong>${amount}</strong> (a test authentication).</p>
<form method="post"><input type="hidden" name="card" value="${chosen}">
<button type="submit" name="authentication" value="passed">Complete authentication</button>
<button type="submit" name="authentication" value="failed" class="secondary">Fail authentication</button>
</form>`,
    );
  return sendPage(
    reply,
    options.status ?? 200,
    'Test checkout',
    html`${raw(CHECKOUT_STYLE)}${STYLE}${BANNER}<h1>${checkout.productName}</h1>
${options.error ? html`<p class="error" role="alert">${options.error}</p>` : raw('')}
<dl><dt>Amount</dt><dd><strong>${amount}</strong></dd></dl>
<form method="post">
<fieldset><legend>Test card</legend>
${Object.entries(CARD_LABELS).map(
  ([number, label]) =>
    html`<p><label><input type="radio" name="card" value="${number}"${raw(number === chosen ? ' checked' : '')}> ${label}</label></p>`,
)}
</fieldset>
${checkout.saveCard ? html`<p class="muted">The card is saved for automatic recharges.</p>` : raw('')}
<button type="submit">Pay ${amount} (test)</button>
<button type="submit" name="cancel" value="1" class="secondary">Cancel</button>
</form>`,
  );
}

function attempted(reply: FastifyReply, checkout: Checkout, card: string, completion: Completion) {
  switch (completion.outcome) {
    case 'paid':
      return reply.headers(PRIVATE_HEADERS).redirect(completion.successUrl, 303);
    case 'authenticate':
      return page(reply, checkout, { card, authenticate: true });
    default:
      return page(reply, checkout, { card, error: completion.message, status: 402 });
  }
}

export const testCheckoutRoutes = routeModule((app, ctx) => {
  if (!testPaymentsAllowed(ctx.config)) return;
  const notFound = (reply: FastifyReply) =>
    sendPage(
      reply,
      404,
      'No such checkout',
      html`<h1>No such checkout</h1><p>Go back to the app and top up again.</p>`,
    );
  const open = async (id: string) => {
    const provider = await TestProvider.ofCheckout(ctx, id);
    const checkout = await provider?.checkout(id);
    return provider && checkout ? { provider, checkout } : undefined;
  };

  app.get('/payments/test/checkout/:id', { schema: { params } }, async (request, reply) => {
    const found = await open(request.params.id);
    if (!found) return notFound(reply);
    if (found.checkout.status === 'complete')
      return reply.headers(PRIVATE_HEADERS).redirect(found.checkout.successUrl, 303);
    return page(reply, found.checkout, {});
  });

  app.post('/payments/test/checkout/:id', { schema: { params, body } }, async (request, reply) => {
    const found = await open(request.params.id);
    if (!found) return notFound(reply);
    const { card, authentication, cancel } = request.body;
    if (cancel && found.checkout.status === 'open')
      return reply.headers(PRIVATE_HEADERS).redirect(found.checkout.cancelUrl, 303);
    const completion = await found.provider.complete(request.params.id, card, authentication);
    if (!completion) return notFound(reply);
    return attempted(reply, found.checkout, card, completion);
  });
});
