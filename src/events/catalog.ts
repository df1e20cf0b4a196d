/**
 * The event catalog: every event type Tollgate emits, its schema version and what its `data` holds.
 * The event table of docs/webhooks.md is written from this list; add new types here first.
 */
export interface EventTypeInfo {
  version: string;
  description: string;
  /** Field name → meaning, for the documentation. */
  data: Record<string, string>;
}

/** The fields that open every wallet event: whose wallet, in which project. */
const walletFields = {
  paywallId: 'project id',
  ownerUserId: 'project owner id',
  walletUserId: 'Tollgate user id of the wallet',
  externalUserId: 'the developer’s user id',
};

/** The fields that open every metered-request event. */
const requestFields = {
  requestId: 'request id',
  api: '`chat`, `responses`, `embeddings` or `messages`',
  model: 'model id',
  stream: 'boolean',
};

export const eventCatalog = {
  'proxy.request.started': {
    version: '1.0',
    description:
      'A metered request (chat completion, response or embeddings) passed the paywall and is being forwarded to the provider.',
    data: {
      ...requestFields,
      holdAmount: 'decimal string held',
    },
  },
  'proxy.request.completed': {
    version: '1.0',
    description: 'A forwarded metered request finished and was charged.',
    data: {
      ...requestFields,
      inputTokens: 'integer',
      outputTokens: 'integer',
      amount: 'decimal string charged',
      currency: 'currency code',
      finishReason: 'string or null',
      outcome:
        '`success`, `client_closed` (the client left mid-stream: charged for what was produced), `bound_reached` (the stream was stopped at the completion bound) or `upstream_error` (the provider failed mid-stream: charged for what reached the client)',
      durationMs: 'integer',
    },
  },
  'proxy.request.failed': {
    version: '1.0',
    description: 'A forwarded metered request failed upstream; the hold was released and nothing charged.',
    data: { requestId: 'request id', model: 'model id', status: 'HTTP status returned', code: 'error code' },
  },
  'auth.connection.required': {
    version: '1.0',
    description: 'A request came from a user who is not connected; the reply carried a connect link.',
    data: { model: 'model id or null', operation: '`chat`, `responses`, `embeddings` or `charge`' },
  },
  'limits.balance.insufficient': {
    version: '1.0',
    description: 'A request needed more than the user’s available balance; the reply carried a top-up link.',
    data: {
      model: 'model id or null',
      operation: '`chat`, `responses`, `embeddings` or `charge`',
      required: 'decimal string',
      available: 'decimal string',
      currency: 'currency code',
    },
  },
  'usage.anomaly': {
    version: '1.0',
    description:
      'The provider reported usage above the request’s bounds — more output than the bound it received (× `n`), or more input than the model’s context window. The request was charged up to the bounds; the excess was not charged (and shows in the reconciliation report).',
    data: {
      ...requestFields,
      reportedInputTokens: 'integer: input tokens the provider reported',
      reportedOutputTokens: 'integer: output tokens the provider reported',
      inputBound: 'integer or null: the model’s context window',
      outputBound: 'integer or null: the output bound the provider received × choices',
      excessInputTokens: 'integer: input tokens above the bound, not charged',
      excessOutputTokens: 'integer: output tokens above the bound, not charged',
    },
  },
  'routing.upstream.failed': {
    version: '1.0',
    description:
      'An attempt failed: the provider answered with an error, timed out, could not be reached or sent a malformed response (one event per failed attempt of a routed request).',
    data: {
      requestId: 'request id',
      model: 'model id',
      provider: 'provider name (routed attempts)',
      upstreamModel: 'the model name sent to the provider (routed attempts)',
      attempt: 'attempt number, from 1 (routed attempts)',
      upstreamStatus: 'integer or null',
      reason: 'string',
    },
  },
  'routing.fallback.used': {
    version: '1.0',
    description: 'A route other than the first one tried answered the request.',
    data: {
      requestId: 'request id',
      model: 'model id',
      provider: 'provider that answered',
      upstreamModel: 'the model name sent to it',
      attempts: 'attempts made, the answering one included',
      firstProvider: 'the provider tried first',
    },
  },
  'routing.circuit.opened': {
    version: '1.0',
    description:
      'A route failed `ROUTING_CIRCUIT_FAILURES` times in a row (or its probe failed): it is skipped for `ROUTING_CIRCUIT_COOLDOWN_MS` (per pod).',
    data: {
      requestId: 'request id of the failing request',
      model: 'model id',
      provider: 'provider name',
      upstreamModel: 'the model name sent to the provider',
      failures: 'consecutive failures that open a circuit',
      cooldownMs: 'cool-down before one probe',
    },
  },
  'routing.circuit.closed': {
    version: '1.0',
    description: 'The probe through an open circuit succeeded: the route is used again.',
    data: {
      requestId: 'request id of the probe',
      model: 'model id',
      provider: 'provider name',
      upstreamModel: 'the model name sent to the provider',
    },
  },
  'limits.rate.exceeded': {
    version: '1.0',
    description: 'A request went over a rate limit of the project, its API key or its end user, and got 429.',
    data: {
      model: 'model id',
      operation: '`chat`, `responses`, `embeddings` or `messages`',
      scope: '`project`, `key` or `user`',
      limit: '`requests` or `tokens` (per minute)',
      value: 'the limit',
      retryAfterSeconds: 'integer',
    },
  },
  'limits.spend.exceeded': {
    version: '1.0',
    description:
      'A request would take an end user past a spend cap (per day or per month); the reply said so, with the time it resets.',
    data: {
      model: 'model id',
      operation: '`chat`, `responses`, `embeddings` or `messages`',
      period: '`day` or `month`',
      cap: 'decimal string',
      spent: 'decimal string spent and reserved in the period',
      required: 'decimal string the request could cost',
      currency: 'currency code',
      resetsAt: 'ISO 8601 time the period ends',
    },
  },
  'balance.deposit.created': {
    version: '1.0',
    description: 'A deposit credited a user’s wallet.',
    data: {
      ...walletFields,
      amount: 'decimal string',
      currency: 'lowercase currency code',
      source: 'payment origin (`api`, `cli`, `stripe`, …)',
      activityId: 'ledger entry id',
    },
  },
  'balance.charge.created': {
    version: '1.0',
    description: 'A charge debited a user’s wallet (metered chat, subscription fee or manual charge).',
    data: {
      ...walletFields,
      amount: 'decimal string',
      currency: 'lowercase currency code',
      source: '`chat`, `subscription`, `api`, or `stripe` (a refund or dispute taken back)',
      activityId: 'ledger entry id',
      balance: 'decimal string after the charge',
    },
  },
  'balance.debt.created': {
    version: '1.0',
    description:
      'A charge left the wallet below zero: a metered charge (the provider’s usage × the price) larger than its hold and the balance, or a refund or dispute of a top-up larger than the balance. The user is refused with a top-up link for the debt plus the next request until a deposit covers it.',
    data: {
      ...walletFields,
      amount: 'decimal string: the part of this charge the balance did not cover',
      charged: 'decimal string: the whole charge',
      holdAmount: 'decimal string: what the request’s hold had reserved',
      debt: 'decimal string: the wallet’s whole debt after the charge (−balance)',
      balance: 'decimal string after the charge (negative)',
      currency: 'lowercase currency code',
      source: '`chat`, `responses`, `embeddings`, `messages`, or `stripe` (a refund or dispute)',
      activityId: 'ledger entry id of the charge',
    },
  },
  'balance.debt.cleared': {
    version: '1.0',
    description: 'A deposit brought a wallet that was below zero back to zero or above.',
    data: {
      ...walletFields,
      amount: 'decimal string: the debt the deposit paid off',
      currency: 'lowercase currency code',
      source: 'payment origin of the deposit',
      activityId: 'ledger entry id of the deposit',
      balance: 'decimal string after the deposit',
    },
  },
  'balance.credit.granted': {
    version: '1.0',
    description:
      'A credit grant (promotional, trial, goodwill: not money) was added to a wallet; charges spend grants before paid balance.',
    data: {
      ...walletFields,
      amount: 'decimal string granted',
      currency: 'lowercase currency code',
      source: '`api`, `admin`, `cli`, `trial`, …',
      activityId: 'ledger entry id (kind `grant`)',
      grantId: 'the grant',
      reason: '`promo`, `trial`, `goodwill`, …',
      priority: 'integer: higher is spent first',
      expiresAt: 'ISO 8601 time, or null (never)',
      balance: 'decimal string after the grant',
    },
  },
  'balance.credit.expired': {
    version: '1.0',
    description: 'A credit grant expired: its unspent rest left the wallet as its own ledger entry.',
    data: {
      ...walletFields,
      amount: 'decimal string: the unspent rest that expired',
      currency: 'lowercase currency code',
      source: '`expiry`',
      activityId: 'ledger entry id (kind `grant_expiry`)',
      grantId: 'the grant',
      reason: 'the grant’s reason',
      balance: 'decimal string after the expiry',
    },
  },
  'balance.low': {
    version: '1.0',
    description:
      'A charge took the wallet’s balance below the low-balance threshold (the user’s own, else the project’s `lowBalanceThreshold`): once per crossing, not on every charge below it.',
    data: {
      ...walletFields,
      balance: 'decimal string after the charge',
      available: 'decimal string: balance − held',
      threshold: 'decimal string',
      currency: 'lowercase currency code',
    },
  },
  'balance.depleted': {
    version: '1.0',
    description: 'A charge took the wallet’s balance from above zero to zero or below.',
    data: {
      ...walletFields,
      balance: 'decimal string after the charge',
      available: 'decimal string: balance − held',
      currency: 'lowercase currency code',
    },
  },
  'payment.succeeded': {
    version: '1.0',
    description:
      'A top-up paid through the project’s payment provider (Stripe Checkout, or an automatic recharge of a saved card) was credited; the deposit’s own `balance.deposit.created` (source `stripe`) comes with it.',
    data: {
      paymentId: 'Tollgate payment id (`pay_…`)',
      externalUserId: 'the developer’s user id',
      amount: 'decimal string credited',
      currency: 'lowercase currency code',
      provider: '`stripe`',
      providerPaymentId:
        'the provider’s payment id (Checkout Session `cs_…`; PaymentIntent `pi_…` for a recharge)',
      activityId: 'ledger entry id of the deposit',
    },
  },
  'payment.refunded': {
    version: '1.0',
    description:
      'The provider refunded (part of) a top-up; the refunded amount was debited from the wallet as a reversal.',
    data: {
      paymentId: 'Tollgate payment id',
      externalUserId: 'the developer’s user id',
      amount: 'decimal string refunded by this change',
      refunded: 'decimal string refunded in total',
      uncollected: 'always `0`: a reversal is debited whole, into debt when the balance cannot cover it',
      currency: 'lowercase currency code',
      activityId: 'ledger entry id of the reversal, or null when nothing could be debited',
    },
  },
  'payment.disputed': {
    version: '1.0',
    description: 'A top-up was disputed (a chargeback); the disputed amount was debited as a reversal.',
    data: {
      paymentId: 'Tollgate payment id',
      externalUserId: 'the developer’s user id',
      disputeId: 'the provider’s dispute id',
      amount: 'decimal string disputed',
      uncollected: 'always `0`: a reversal is debited whole, into debt when the balance cannot cover it',
      currency: 'lowercase currency code',
      activityId: 'ledger entry id of the reversal, or null',
    },
  },
  'payment.dispute.closed': {
    version: '1.0',
    description:
      'A dispute of a top-up closed; when it was won, the amount debited for it was credited back.',
    data: {
      paymentId: 'Tollgate payment id',
      externalUserId: 'the developer’s user id',
      disputeId: 'the provider’s dispute id',
      status: '`won` or `lost` (the provider’s dispute status)',
      amount: 'decimal string credited back (0 when lost)',
      currency: 'lowercase currency code',
      activityId: 'ledger entry id of the credit, or null',
    },
  },
  'payment.recharge.succeeded': {
    version: '1.0',
    description:
      'An automatic recharge of the user’s saved card (charged off session when the available balance fell below their threshold) was paid and credited, by the PaymentIntent’s webhook, once; `payment.succeeded` and `balance.deposit.created` come with it.',
    data: {
      paymentId: 'Tollgate payment id of the recharge (`pay_…`)',
      externalUserId: 'the developer’s user id',
      amount: 'decimal string credited',
      currency: 'lowercase currency code',
      providerPaymentId: 'the provider’s payment id (PaymentIntent `pi_…`)',
      activityId: 'ledger entry id of the deposit',
      rechargedThisMonth: 'decimal string recharged this calendar month (UTC), what the monthly cap counts',
    },
  },
  'payment.recharge.failed': {
    version: '1.0',
    description:
      'An automatic recharge failed: the saved card was declined or needs its holder (`authentication_required`). Auto-recharge is turned off for the user (their portal says why) until they turn it on again.',
    data: {
      paymentId: 'Tollgate payment id of the recharge',
      externalUserId: 'the developer’s user id',
      amount: 'decimal string that was to be charged',
      currency: 'lowercase currency code',
      providerPaymentId: 'the PaymentIntent `pi_…`, or null when none was created',
      code: 'the provider’s code: `card_declined` (or its decline code), `authentication_required`, …',
      reason: 'the provider’s message, as the portal shows it',
      autoRecharge: 'always `off`',
    },
  },
  'user.connected': {
    version: '1.0',
    description: 'A user connected to the paywall.',
    data: { walletUserId: 'Tollgate user id', externalUserId: 'the developer’s user id' },
  },
  'user.disconnected': {
    version: '1.0',
    description: 'A user was disconnected from the paywall.',
    data: { walletUserId: 'Tollgate user id', externalUserId: 'the developer’s user id' },
  },
  'webhook.subscription.disabled': {
    version: '1.0',
    description:
      'A subscription was disabled because every delivery attempt to its endpoint failed for `WEBHOOK_DISABLE_AFTER_HOURS`; re-enable it (`isActive: true`, or a spec change of its resource) once the endpoint works.',
    data: {
      subscriptionId: 'the subscription disabled',
      url: 'its endpoint',
      reason: 'why, in words',
      failingSince: 'ISO time of the first failure after the last success',
      consecutiveFailures: 'integer',
    },
  },
  'webhook.test': {
    version: '1.0',
    description:
      'A test ping (`POST /v1/webhooks/subscriptions/{id}/test`), sent only to that subscription whatever its patterns.',
    data: { subscriptionId: 'the subscription pinged', message: 'string' },
  },
} as const satisfies Record<string, EventTypeInfo>;

export type EventType = keyof typeof eventCatalog;
export const eventTypes = Object.keys(eventCatalog) as EventType[];
