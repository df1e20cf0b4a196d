import { createHmac, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/**
 * A loopback stand-in of the parts of Stripe's API that Tollgate calls (written from Stripe's published
 * API reference), for the official `stripe` library pointed at it with STRIPE_API_URL:
 * - `GET /v1/balance` (the key check), `POST /v1/webhook_endpoints`, `POST|DELETE /v1/webhook_endpoints/{id}`
 * - `POST /v1/checkout/sessions`, `GET /v1/checkout/sessions/{id}` (with `expand[]`),
 *   `GET /v1/payment_intents/{id}`
 * - `POST /v1/refunds` (then `charge.refunded` is delivered, as Stripe does)
 * - saved cards: a session with `customer_creation: 'always'` or `payment_intent_data[setup_future_usage]`
 *   creates a customer and a card payment method when paid (`session.customer`, the PaymentIntent's
 *   `customer` and `payment_method`); `POST /v1/payment_intents` with `customer`, `payment_method`,
 *   `off_session` and `confirm` charges it at once: succeeded (then `payment_intent.succeeded`), or, for a
 *   card the test set with `cardOutcome`, a `402` `card_error` (`card_declined` or
 *   `authentication_required`, the PaymentIntent in `error.payment_intent`, status
 *   `requires_payment_method`) then `payment_intent.payment_failed` with its `last_payment_error`
 * Request bodies are form-encoded with bracket keys (`line_items[0][price_data][currency]`), answers are
 * Stripe's object shapes and error shape, `Idempotency-Key` replays the first answer. Events are signed
 * with each endpoint's secret exactly as Stripe does (`Stripe-Signature: t=…,v1=HMAC-SHA256(secret,
 * "t.payload")`) and POSTed to the endpoints subscribed to them.
 * For tests: `pay` completes a session as a customer would (also through the stand-in's own checkout
 * page at the session's `url`), `dispute`/`closeDispute` open and close disputes, `deliver` sends an
 * event (again, or signed with another secret), `events` lists what was sent.
 */

type Obj = Record<string, any>;

export interface StandInEvent {
  id: string;
  object: 'event';
  type: string;
  api_version: string;
  created: number;
  livemode: boolean;
  pending_webhooks: number;
  request: { id: string | null; idempotency_key: string | null };
  data: { object: Obj };
}

export interface StripeStandIn {
  url: string;
  /** Keys the stand-in accepts (add more with `keys.add`). */
  keys: Set<string>;
  endpoints: Map<string, Obj>;
  sessions: Map<string, Obj>;
  charges: Map<string, Obj>;
  refunds: Map<string, Obj>;
  customers: Map<string, Obj>;
  paymentMethods: Map<string, Obj>;
  intents: Map<string, Obj>;
  /** How off-session charges of a saved card end from now on (default `succeed`). */
  cardOutcome(paymentMethodId: string, outcome: 'succeed' | 'decline' | 'authentication_required'): void;
  /** Holds back the webhooks of off-session charges until `release` (to see a recharge in flight). */
  holdIntentEvents(hold: boolean): void;
  /** Delivers the held-back off-session events. */
  releaseIntentEvents(): Promise<void>;
  events: StandInEvent[];
  /** Requests received: method, path, parsed body. */
  requests: Array<{ method: string; path: string; body: Obj; idempotencyKey: string | undefined }>;
  /** Completes a session as paid (a card payment); returns the `checkout.session.completed` event (delivered unless told otherwise). */
  pay(sessionId: string, options?: { deliver?: boolean; asyncPayment?: boolean }): Promise<StandInEvent>;
  dispute(chargeId: string, options?: { amount?: number; deliver?: boolean }): Promise<StandInEvent>;
  closeDispute(
    disputeId: string,
    status: 'won' | 'lost',
    options?: { deliver?: boolean },
  ): Promise<StandInEvent>;
  /** Refunds as Stripe's dashboard would (not through Tollgate). */
  refund(
    paymentIntent: string,
    amount?: number,
    options?: { deliver?: boolean },
  ): Promise<{ refund: Obj; event: StandInEvent }>;
  /** Delivers an event to every endpoint subscribed to it; resolves to the endpoints' status codes. */
  deliver(
    event: StandInEvent,
    options?: { secret?: string; timestamp?: number; signature?: string | null },
  ): Promise<number[]>;
  /** Resolves when every delivery the stand-in started on its own (after a refund) has been answered. */
  idle(): Promise<void>;
  /** The Stripe-Signature header of a payload. */
  sign(payload: string, secret: string, timestamp?: number): string;
  close(): Promise<void>;
}

const id = (prefix: string) => `${prefix}_${randomBytes(12).toString('base64url').replace(/[-_]/g, 'x')}`;
const now = () => Math.floor(Date.now() / 1000);

/** Parses Stripe's form encoding (`a[b][0][c]=v`) into nested objects and arrays. */
export function parseStripeForm(text: string): Obj {
  const root: Obj = {};
  for (const [key, value] of new URLSearchParams(text)) {
    const parts = key.replace(/\]/g, '').split('[');
    let node: Obj = root;
    parts.forEach((part, i) => {
      const last = i === parts.length - 1;
      const nextIsIndex = !last && /^\d+$/.test(parts[i + 1]!);
      const slot = Array.isArray(node) ? Number(part) : part;
      if (last) (node as any)[slot] = value;
      else {
        (node as any)[slot] ??= nextIsIndex ? [] : {};
        node = (node as any)[slot];
      }
    });
  }
  return root;
}

function stripeError(res: ServerResponse, status: number, error: Obj) {
  res.writeHead(status, { 'content-type': 'application/json', 'request-id': id('req') });
  res.end(JSON.stringify({ error }));
}

export async function startStripeStandIn(options: { keys?: string[] } = {}): Promise<StripeStandIn> {
  const keys = new Set(options.keys ?? ['sk_test_standin_4242424242']);
  const endpoints = new Map<string, Obj>();
  const sessions = new Map<string, Obj>();
  const intents = new Map<string, Obj>();
  const charges = new Map<string, Obj>();
  const refunds = new Map<string, Obj>();
  const disputes = new Map<string, Obj>();
  const customers = new Map<string, Obj>();
  const paymentMethods = new Map<string, Obj>();
  const outcomes = new Map<string, 'succeed' | 'decline' | 'authentication_required'>();
  let holdIntents = false;
  const heldIntentEvents: StandInEvent[] = [];
  const events: StandInEvent[] = [];
  const requests: StripeStandIn['requests'] = [];
  const idempotent = new Map<string, { status: number; body: string }>();
  let baseUrl = '';
  const inFlight = new Set<Promise<unknown>>();

  const sign = (payload: string, secret: string, timestamp = now()) =>
    `t=${timestamp},v1=${createHmac('sha256', secret).update(`${timestamp}.${payload}`).digest('hex')}`;

  function event(type: string, object: Obj): StandInEvent {
    const e: StandInEvent = {
      id: id('evt'),
      object: 'event',
      type,
      api_version: '2026-10-28.endive',
      created: now(),
      livemode: false,
      pending_webhooks: 1,
      request: { id: null, idempotency_key: null },
      data: { object: structuredClone(object) },
    };
    events.push(e);
    return e;
  }

  async function deliver(
    e: StandInEvent,
    opts: { secret?: string; timestamp?: number; signature?: string | null } = {},
  ): Promise<number[]> {
    const payload = JSON.stringify(e, null, 2);
    const targets = [...endpoints.values()].filter(
      (ep) => ep.enabled_events.includes('*') || ep.enabled_events.includes(e.type),
    );
    return Promise.all(
      targets.map(async (ep) => {
        const header =
          opts.signature === null
            ? undefined
            : (opts.signature ?? sign(payload, opts.secret ?? ep.secret, opts.timestamp));
        const res = await fetch(ep.url, {
          method: 'POST',
          headers: {
            'content-type': 'application/json; charset=utf-8',
            'user-agent': 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
            ...(header ? { 'stripe-signature': header } : {}),
          },
          body: payload,
        });
        await res.arrayBuffer();
        return res.status;
      }),
    );
  }

  function sessionView(session: Obj, expand: string[]): Obj {
    const view = structuredClone(session);
    if (expand.some((e) => e.startsWith('payment_intent')) && session.payment_intent) {
      const intent = structuredClone(intents.get(session.payment_intent)!);
      if (expand.includes('payment_intent.latest_charge') && intent.latest_charge)
        intent.latest_charge = structuredClone(charges.get(intent.latest_charge)!);
      view.payment_intent = intent;
    }
    return view;
  }

  function pay(sessionId: string, asyncPayment = false): StandInEvent {
    const session = sessions.get(sessionId);
    if (!session) throw new Error(`no session ${sessionId}`);
    if (!session.payment_intent) {
      const intent: Obj = {
        id: id('pi'),
        object: 'payment_intent',
        amount: session.amount_total,
        amount_received: session.amount_total,
        currency: session.currency,
        status: 'succeeded',
        latest_charge: null,
        metadata: { ...(session.payment_intent_metadata ?? {}) },
        livemode: false,
        created: now(),
      };
      const charge: Obj = {
        id: id('ch'),
        object: 'charge',
        amount: session.amount_total,
        amount_captured: session.amount_total,
        amount_refunded: 0,
        captured: true,
        currency: session.currency,
        paid: true,
        refunded: false,
        disputed: false,
        status: 'succeeded',
        payment_intent: intent.id,
        receipt_url: `${baseUrl}/receipts/${id('rcpt')}`,
        // The stand-in leaves a charge's metadata empty: Tollgate must find its top-up without it.
        metadata: {},
        livemode: false,
        created: now(),
      };
      intent.latest_charge = charge.id;
      if (session.save_card) {
        const customer = session.customer ?? id('cus');
        customers.set(customer, { id: customer, object: 'customer', created: now(), livemode: false });
        const pm = {
          id: id('pm'),
          object: 'payment_method',
          type: 'card',
          customer,
          card: { brand: 'visa', last4: '4242', exp_month: 12, exp_year: 2034 },
          created: now(),
          livemode: false,
        };
        paymentMethods.set(pm.id, pm);
        session.customer = customer;
        intent.customer = customer;
        intent.payment_method = pm.id;
        intent.setup_future_usage = 'off_session';
        charge.customer = customer;
        charge.payment_method = pm.id;
      }
      intents.set(intent.id, intent);
      charges.set(charge.id, charge);
      session.payment_intent = intent.id;
    }
    session.status = 'complete';
    session.payment_status = asyncPayment ? 'unpaid' : 'paid';
    session.url = null;
    const completed = event('checkout.session.completed', publicSession(session));
    if (asyncPayment) {
      session.payment_status = 'paid';
      return event('checkout.session.async_payment_succeeded', publicSession(session));
    }
    return completed;
  }

  function publicSession(session: Obj): Obj {
    const { payment_intent_metadata: _hidden, save_card: _saveCard, ...rest } = session;
    return rest;
  }

  /** Delivers in the background, as Stripe does after answering (or holds it back when told). */
  function deliverLater(e: StandInEvent, intentEvent = false) {
    if (intentEvent && holdIntents) {
      heldIntentEvents.push(e);
      return;
    }
    const delivery = new Promise<void>((resolve) => setImmediate(resolve))
      .then(() => deliver(e))
      .catch(() => {})
      .finally(() => inFlight.delete(delivery));
    inFlight.add(delivery);
  }

  /** An off-session PaymentIntent, confirmed at once against a saved card. */
  function offSessionIntent(body: Obj): { status: number; body: Obj; event: StandInEvent } | { error: Obj } {
    const amount = Number(body.amount);
    if (!Number.isInteger(amount) || amount <= 0 || !body.currency)
      return {
        error: { type: 'invalid_request_error', message: 'Missing required param: amount.', param: 'amount' },
      };
    const pm = paymentMethods.get(body.payment_method ?? '');
    if (!pm)
      return {
        error: {
          type: 'invalid_request_error',
          code: 'resource_missing',
          message: `No such PaymentMethod: '${body.payment_method ?? ''}'`,
          param: 'payment_method',
        },
      };
    if (pm.customer !== body.customer)
      return {
        error: {
          type: 'invalid_request_error',
          message: 'The provided PaymentMethod does not belong to the customer.',
          param: 'payment_method',
        },
      };
    if (body.confirm !== 'true' || body.off_session !== 'true')
      return {
        error: { type: 'invalid_request_error', message: 'The stand-in only confirms off-session intents.' },
      };
    const outcome = outcomes.get(pm.id) ?? 'succeed';
    const intent: Obj = {
      id: id('pi'),
      object: 'payment_intent',
      amount,
      amount_received: 0,
      currency: body.currency,
      customer: body.customer,
      payment_method: pm.id,
      description: body.description ?? null,
      status: 'succeeded',
      latest_charge: null,
      last_payment_error: null,
      metadata: body.metadata ?? {},
      livemode: false,
      created: now(),
    };
    intents.set(intent.id, intent);
    if (outcome === 'succeed') {
      const charge: Obj = {
        id: id('ch'),
        object: 'charge',
        amount,
        amount_captured: amount,
        amount_refunded: 0,
        captured: true,
        currency: body.currency,
        customer: body.customer,
        paid: true,
        refunded: false,
        disputed: false,
        status: 'succeeded',
        payment_intent: intent.id,
        payment_method: pm.id,
        receipt_url: `${baseUrl}/receipts/${id('rcpt')}`,
        metadata: {},
        livemode: false,
        created: now(),
      };
      charges.set(charge.id, charge);
      intent.latest_charge = charge.id;
      intent.amount_received = amount;
      return { status: 200, body: intent, event: event('payment_intent.succeeded', intent) };
    }
    const error: Obj =
      outcome === 'decline'
        ? {
            type: 'card_error',
            code: 'card_declined',
            decline_code: 'insufficient_funds',
            message: 'Your card has insufficient funds.',
          }
        : {
            type: 'card_error',
            code: 'authentication_required',
            decline_code: 'authentication_required',
            message: 'Your card was declined. This transaction requires authentication.',
          };
    intent.status = 'requires_payment_method';
    intent.last_payment_error = { ...error, payment_method: pm };
    return {
      status: 402,
      body: { error: { ...error, payment_intent: structuredClone(intent) } },
      event: event('payment_intent.payment_failed', intent),
    };
  }

  function refundCharge(
    intentId: string,
    amount: number | undefined,
  ): { refund: Obj; event: StandInEvent } | undefined {
    const intent = intents.get(intentId);
    if (!intent) return undefined;
    const charge = charges.get(intent.latest_charge)!;
    const left = charge.amount - charge.amount_refunded;
    const value = amount ?? left;
    if (value <= 0 || value > left) throw Object.assign(new Error('amount'), { left });
    const refund: Obj = {
      id: id('re'),
      object: 'refund',
      amount: value,
      charge: charge.id,
      currency: charge.currency,
      payment_intent: intent.id,
      reason: null,
      status: 'succeeded',
      metadata: {},
      created: now(),
    };
    refunds.set(refund.id, refund);
    charge.amount_refunded += value;
    charge.refunded = charge.amount_refunded === charge.amount;
    return { refund, event: event('charge.refunded', charge) };
  }

  async function handle(req: IncomingMessage, res: ServerResponse, text: string) {
    const url = new URL(req.url ?? '/', baseUrl);
    const path = url.pathname;
    const method = req.method ?? 'GET';

    // The stand-in's own checkout page (what `session.url` opens), and receipts.
    let m = /^\/c\/pay\/([^/]+)$/.exec(path);
    if (m) {
      const session = sessions.get(m[1]!);
      if (!session) return stripeError(res, 404, { message: 'No such checkout session' });
      if (method === 'POST') {
        const e = pay(session.id);
        await deliver(e);
        res.writeHead(303, { location: session.success_url.replace('{CHECKOUT_SESSION_ID}', session.id) });
        return res.end();
      }
      const amount = (session.amount_total / (session.currency === 'jpy' ? 1 : 100)).toFixed(
        session.currency === 'jpy' ? 0 : 2,
      );
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      return res.end(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Stripe Checkout (stand-in)</title></head>
<body style="font:16px system-ui;max-width:28rem;margin:3rem auto"><h1>Pay ${amount} ${session.currency.toUpperCase()}</h1>
<p>${session.line_items_summary}</p><p>Card 4242 4242 4242 4242 (test mode stand-in)</p>
<form method="post"><button type="submit" id="pay">Pay</button></form>
<p><a href="${session.cancel_url}" id="cancel">Cancel</a></p></body></html>`);
    }
    if (path.startsWith('/receipts/')) {
      res.writeHead(200, { 'content-type': 'text/html' });
      return res.end('<!doctype html><title>Receipt</title><h1>Receipt</h1>');
    }

    const auth = /^Bearer (.+)$/.exec(String(req.headers.authorization ?? ''))?.[1];
    if (!auth || !keys.has(auth)) {
      return stripeError(res, 401, {
        type: 'invalid_request_error',
        message: `Invalid API Key provided: ${(auth ?? '').slice(0, 8)}********${(auth ?? '').slice(-4)}`,
      });
    }
    const body =
      method === 'GET' || method === 'DELETE' ? parseStripeForm(url.search.slice(1)) : parseStripeForm(text);
    const idempotencyKey = req.headers['idempotency-key'] as string | undefined;
    requests.push({ method, path, body, idempotencyKey });
    const replayKey = idempotencyKey ? `${auth} ${method} ${path} ${idempotencyKey}` : undefined;
    if (replayKey && idempotent.has(replayKey)) {
      const first = idempotent.get(replayKey)!;
      res.writeHead(first.status, { 'content-type': 'application/json', 'idempotent-replayed': 'true' });
      return res.end(first.body);
    }
    const send = (status: number, object: Obj) => {
      const json = JSON.stringify(object);
      if (replayKey && status < 500) idempotent.set(replayKey, { status, body: json });
      res.writeHead(status, { 'content-type': 'application/json', 'request-id': id('req') });
      res.end(json);
    };
    const missing = (what: string, value: string) =>
      stripeError(res, 404, {
        type: 'invalid_request_error',
        code: 'resource_missing',
        message: `No such ${what}: '${value}'`,
        param: 'id',
      });

    if (method === 'GET' && path === '/v1/balance') {
      return send(200, {
        object: 'balance',
        available: [{ amount: 0, currency: 'usd', source_types: { card: 0 } }],
        pending: [{ amount: 0, currency: 'usd', source_types: { card: 0 } }],
        livemode: auth.includes('_live_'),
      });
    }
    if (method === 'POST' && path === '/v1/webhook_endpoints') {
      if (!body.url || !Array.isArray(body.enabled_events))
        return stripeError(res, 400, {
          type: 'invalid_request_error',
          message: 'Missing required param: url.',
        });
      const endpoint = {
        id: id('we'),
        object: 'webhook_endpoint',
        api_version: null,
        application: null,
        created: now(),
        description: body.description ?? null,
        enabled_events: body.enabled_events,
        livemode: false,
        metadata: {},
        secret: `whsec_${randomBytes(24).toString('base64url').replace(/[-_]/g, 'x')}`,
        status: 'enabled',
        url: body.url,
      };
      endpoints.set(endpoint.id, endpoint);
      return send(200, endpoint);
    }
    m = /^\/v1\/webhook_endpoints\/([^/]+)$/.exec(path);
    if (m && method === 'POST') {
      const endpoint = endpoints.get(m[1]!);
      if (!endpoint) return missing('webhook endpoint', m[1]!);
      if (Array.isArray(body.enabled_events)) endpoint.enabled_events = body.enabled_events;
      if (body.url) endpoint.url = body.url;
      const { secret: _secret, ...shown } = endpoint;
      return send(200, shown);
    }
    if (m && method === 'DELETE') {
      if (!endpoints.delete(m[1]!)) return missing('webhook endpoint', m[1]!);
      return send(200, { id: m[1], object: 'webhook_endpoint', deleted: true });
    }
    if (method === 'POST' && path === '/v1/checkout/sessions') {
      const item = body.line_items?.[0];
      const price = item?.price_data;
      if (body.mode !== 'payment' || !price?.currency || !/^\d+$/.test(price.unit_amount ?? ''))
        return stripeError(res, 400, {
          type: 'invalid_request_error',
          message: 'Invalid checkout session parameters.',
          param: 'line_items',
        });
      const amount = Number(price.unit_amount) * Number(item.quantity ?? 1);
      const sessionId = `cs_test_${randomBytes(20).toString('hex')}`;
      const session: Obj = {
        id: sessionId,
        object: 'checkout.session',
        amount_subtotal: amount,
        amount_total: amount,
        cancel_url: body.cancel_url ?? null,
        client_reference_id: body.client_reference_id ?? null,
        created: now(),
        currency: price.currency,
        customer: null,
        expires_at: now() + 24 * 3600,
        livemode: false,
        metadata: body.metadata ?? {},
        mode: 'payment',
        payment_intent: null,
        payment_status: 'unpaid',
        status: 'open',
        success_url: body.success_url,
        url: `${baseUrl}/c/pay/${sessionId}`,
        line_items_summary: price.product_data?.name ?? '',
        payment_intent_metadata: body.payment_intent_data?.metadata ?? {},
        save_card:
          body.customer_creation === 'always' ||
          body.payment_intent_data?.setup_future_usage === 'off_session',
      };
      sessions.set(sessionId, session);
      return send(200, publicSession(session));
    }
    m = /^\/v1\/checkout\/sessions\/([^/]+)$/.exec(path);
    if (m && method === 'GET') {
      const session = sessions.get(m[1]!);
      if (!session) return missing('checkout.session', m[1]!);
      const expand: string[] = Array.isArray(body.expand) ? body.expand : [];
      return send(200, publicSession(sessionView(session, expand)));
    }
    if (method === 'POST' && path === '/v1/payment_intents') {
      const made = offSessionIntent(body);
      if ('error' in made) return stripeError(res, 400, made.error);
      send(made.status, made.body);
      deliverLater(made.event, true);
      return;
    }
    m = /^\/v1\/payment_intents\/([^/]+)$/.exec(path);
    if (m && method === 'GET') {
      const intent = intents.get(m[1]!);
      if (!intent) return missing('payment_intent', m[1]!);
      return send(200, intent);
    }
    if (method === 'POST' && path === '/v1/refunds') {
      let done: ReturnType<typeof refundCharge>;
      try {
        done = refundCharge(body.payment_intent, body.amount ? Number(body.amount) : undefined);
      } catch {
        return stripeError(res, 400, {
          type: 'invalid_request_error',
          code: 'amount_too_large',
          message: 'Refund amount is greater than unrefunded amount on charge.',
          param: 'amount',
        });
      }
      if (!done) return missing('payment_intent', String(body.payment_intent));
      send(200, done.refund);
      // Stripe delivers charge.refunded after answering.
      deliverLater(done.event);
      return;
    }
    return stripeError(res, 404, {
      type: 'invalid_request_error',
      message: `Unrecognized request URL (${method}: ${path}).`,
    });
  }

  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      handle(req, res, Buffer.concat(chunks).toString('utf8')).catch((err) => {
        if (!res.headersSent) stripeError(res, 500, { type: 'api_error', message: String(err) });
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  baseUrl = `http://127.0.0.1:${port}`;

  return {
    url: baseUrl,
    keys,
    endpoints,
    sessions,
    charges,
    refunds,
    customers,
    paymentMethods,
    intents,
    cardOutcome(paymentMethodId, outcome) {
      outcomes.set(paymentMethodId, outcome);
    },
    holdIntentEvents(hold) {
      holdIntents = hold;
    },
    async releaseIntentEvents() {
      const held = heldIntentEvents.splice(0);
      for (const e of held) await deliver(e);
    },
    events,
    requests,
    async pay(sessionId, opts = {}) {
      const e = pay(sessionId, opts.asyncPayment);
      if (opts.deliver !== false) await deliver(e);
      return e;
    },
    async dispute(chargeId, opts = {}) {
      const charge = charges.get(chargeId);
      if (!charge) throw new Error(`no charge ${chargeId}`);
      const dispute: Obj = {
        id: id('du'),
        object: 'dispute',
        amount: opts.amount ?? charge.amount,
        charge: charge.id,
        currency: charge.currency,
        payment_intent: charge.payment_intent,
        reason: 'fraudulent',
        status: 'needs_response',
        is_charge_refundable: false,
        livemode: false,
        metadata: {},
        created: now(),
      };
      disputes.set(dispute.id, dispute);
      charge.disputed = true;
      const e = event('charge.dispute.created', dispute);
      if (opts.deliver !== false) await deliver(e);
      return e;
    },
    async closeDispute(disputeId, status, opts = {}) {
      const dispute = disputes.get(disputeId);
      if (!dispute) throw new Error(`no dispute ${disputeId}`);
      dispute.status = status;
      const e = event('charge.dispute.closed', dispute);
      if (opts.deliver !== false) await deliver(e);
      return e;
    },
    async refund(paymentIntent, amount, opts = {}) {
      const done = refundCharge(paymentIntent, amount);
      if (!done) throw new Error(`no payment intent ${paymentIntent}`);
      if (opts.deliver !== false) await deliver(done.event);
      return done;
    },
    deliver,
    async idle() {
      while (inFlight.size) await Promise.all([...inFlight]);
    },
    sign,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
