import { createHmac, randomBytes } from 'node:crypto';
import { safeEqual } from '../../core/crypto.ts';
import type { Database } from '../../db/index.ts';
import {
  type PaymentReference,
  type ProviderEnv,
  type WebhookAction,
  WebhookSignatureError,
} from '../provider.ts';

/**
 * The account of the test provider: what a payment provider keeps on its side — webhook endpoints,
 * checkouts, payments, saved cards, refunds — kept in `test_payment_objects` (one JSON object per row,
 * per account: the connection's key), and its webhooks, signed as Stripe signs them
 * (`t=<seconds>,v1=HMAC-SHA256(secret, "<t>.<body>")`) and POSTed to the account's endpoints.
 */

export const SIGNATURE_HEADER = 'tollgate-test-signature';
const TOLERANCE_SECONDS = 300;

/** The test cards, as Stripe's test mode numbers them: how a payment with each one ends. */
export const TEST_CARDS = {
  '4242424242424242': 'succeed',
  '4000000000000002': 'decline',
  '4000002760003184': 'authenticate',
} as const;

export type CardNumber = keyof typeof TEST_CARDS;

export const isTestCard = (number: string): number is CardNumber => number in TEST_CARDS;

export interface Endpoint {
  url: string;
  secret: string;
}

export interface Checkout {
  amountMinor: number;
  currency: string;
  productName: string;
  reference: PaymentReference;
  successUrl: string;
  cancelUrl: string;
  saveCard: boolean;
  status: 'open' | 'complete';
  intentId: string | null;
  customerId: string | null;
  paymentMethodId: string | null;
  /** The completion event, delivered again when the completion is replayed. */
  event: TestEvent | null;
}

export interface Intent {
  amountMinor: number;
  currency: string;
  reference: PaymentReference;
  status: 'succeeded' | 'requires_payment_method';
  chargeId: string | null;
  customerId: string | null;
  paymentMethodId: string | null;
  refundedMinor: number;
  code: string | null;
  message: string | null;
}

export interface Card {
  customerId: string;
  number: CardNumber;
}

export interface Refund {
  intentId: string;
  amountMinor: number;
}

interface Kinds {
  endpoint: Endpoint;
  checkout: Checkout;
  intent: Intent;
  card: Card;
  refund: Refund;
}

/** An event as the test provider sends it: the provider-neutral action it stands for. */
export interface TestEvent {
  id: string;
  created: number;
  action: DistributiveOmit<WebhookAction, 'eventId'>;
}

type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;

export const testId = (prefix: string) => `${prefix}_${randomBytes(12).toString('hex')}`;

/** The objects of one account, and its webhooks. */
export class TestAccount {
  readonly db: Database;
  readonly key: string;
  readonly env: Pick<ProviderEnv, 'log' | 'publicBaseUrl'>;

  constructor(db: Database, key: string, env: Pick<ProviderEnv, 'log' | 'publicBaseUrl'>) {
    this.db = db;
    this.key = key;
    this.env = env;
  }

  async get<K extends keyof Kinds>(kind: K, id: string): Promise<Kinds[K] | undefined> {
    const row = await this.db
      .selectFrom('test_payment_objects')
      .select('data')
      .where('id', '=', id)
      .where('account', '=', this.key)
      .where('kind', '=', kind)
      .executeTakeFirst();
    return row?.data as unknown as Kinds[K] | undefined;
  }

  async list<K extends keyof Kinds>(kind: K): Promise<Array<{ id: string; data: Kinds[K] }>> {
    const rows = await this.db
      .selectFrom('test_payment_objects')
      .select(['id', 'data'])
      .where('account', '=', this.key)
      .where('kind', '=', kind)
      .orderBy('created_at')
      .execute();
    return rows.map((r) => ({ id: r.id, data: r.data as unknown as Kinds[K] }));
  }

  /**
   * Creates an object; with an idempotency key, a second call with the same key answers the first
   * call's object (as a provider's API replays an idempotent request).
   */
  async create<K extends keyof Kinds>(
    kind: K,
    id: string,
    data: Kinds[K],
    idempotencyKey?: string,
  ): Promise<{ id: string; data: Kinds[K]; created: boolean }> {
    const inserted = await this.db
      .insertInto('test_payment_objects')
      .values({
        id,
        account: this.key,
        kind,
        idempotency_key: idempotencyKey ?? null,
        data: JSON.stringify(data),
      })
      .onConflict((oc) => oc.columns(['account', 'idempotency_key']).doNothing())
      .returning('id')
      .executeTakeFirst();
    if (inserted) return { id, data, created: true };
    const first = await this.db
      .selectFrom('test_payment_objects')
      .select(['id', 'data'])
      .where('account', '=', this.key)
      .where('idempotency_key', '=', idempotencyKey!)
      .executeTakeFirstOrThrow();
    return { id: first.id, data: first.data as unknown as Kinds[K], created: false };
  }

  /**
   * Changes an object under a row lock (concurrent completions of one checkout happen one at a time);
   * `change` writes what else it makes through the account it is given, in the same transaction.
   */
  async update<K extends keyof Kinds, T>(
    kind: K,
    id: string,
    change: (data: Kinds[K], tx: TestAccount) => Promise<{ data?: Kinds[K]; result: T }>,
  ): Promise<T | undefined> {
    return this.db.transaction().execute(async (tx) => {
      const row = await tx
        .selectFrom('test_payment_objects')
        .select('data')
        .where('id', '=', id)
        .where('account', '=', this.key)
        .where('kind', '=', kind)
        .forUpdate()
        .executeTakeFirst();
      if (!row) return undefined;
      const { data, result } = await change(
        row.data as unknown as Kinds[K],
        new TestAccount(tx, this.key, this.env),
      );
      if (data)
        await tx
          .updateTable('test_payment_objects')
          .set({ data: JSON.stringify(data) })
          .where('id', '=', id)
          .execute();
      return result;
    });
  }

  async byIdempotencyKey<K extends keyof Kinds>(kind: K, key: string) {
    const row = await this.db
      .selectFrom('test_payment_objects')
      .select(['id', 'data'])
      .where('account', '=', this.key)
      .where('kind', '=', kind)
      .where('idempotency_key', '=', key)
      .executeTakeFirst();
    return row ? { id: row.id, data: row.data as unknown as Kinds[K] } : undefined;
  }

  async remove(kind: keyof Kinds, id: string): Promise<void> {
    await this.db
      .deleteFrom('test_payment_objects')
      .where('id', '=', id)
      .where('account', '=', this.key)
      .where('kind', '=', kind)
      .execute();
  }

  /**
   * Signs an event with each endpoint's secret and POSTs it there; resolves to the answers' statuses.
   * The test provider runs in this process: it sends to this server's own address (the endpoint's path
   * under the public address), so a dev server started again on another port still gets its webhooks.
   */
  async deliver(event: TestEvent): Promise<number[]> {
    const body = JSON.stringify(event);
    const endpoints = await this.list('endpoint');
    return Promise.all(
      endpoints.map(async ({ data }) => {
        const url = `${this.env.publicBaseUrl}${new URL(data.url).pathname}`;
        try {
          const res = await fetch(url, {
            method: 'POST',
            headers: { 'content-type': 'application/json', [SIGNATURE_HEADER]: sign(body, data.secret) },
            body,
            signal: AbortSignal.timeout(20_000),
          });
          await res.arrayBuffer();
          if (!res.ok)
            this.env.log.warn({ event: event.id, status: res.status }, 'test payment webhook refused');
          return res.status;
        } catch (err) {
          this.env.log.warn({ err, event: event.id, url: data.url }, 'test payment webhook not delivered');
          return 0;
        }
      }),
    );
  }

  /** Delivers after the call that caused the event has answered, as a provider does. */
  deliverLater(event: TestEvent): void {
    setImmediate(() => void this.deliver(event));
  }
}

export function newEvent(action: TestEvent['action']): TestEvent {
  return { id: testId('tevt'), created: Math.floor(Date.now() / 1000), action };
}

export function sign(body: string, secret: string, seconds = Math.floor(Date.now() / 1000)): string {
  const v1 = createHmac('sha256', secret).update(`${seconds}.${body}`).digest('hex');
  return `t=${seconds},v1=${v1}`;
}

/** The event of a signed body; throws WebhookSignatureError when the signature does not hold. */
export function verifiedEvent(rawBody: Buffer, signature: string | undefined, secret: string): TestEvent {
  if (!signature) throw new WebhookSignatureError(`missing ${SIGNATURE_HEADER} header`);
  const parts = Object.fromEntries(signature.split(',').map((p) => p.split('=', 2) as [string, string]));
  const seconds = Number(parts.t);
  if (!Number.isInteger(seconds) || !parts.v1) throw new WebhookSignatureError('malformed signature');
  if (Math.abs(Date.now() / 1000 - seconds) > TOLERANCE_SECONDS)
    throw new WebhookSignatureError('timestamp outside the tolerance');
  const expected = createHmac('sha256', secret).update(`${seconds}.`).update(rawBody).digest('hex');
  if (!safeEqual(expected, parts.v1)) throw new WebhookSignatureError('no signature matches');
  const event = JSON.parse(rawBody.toString('utf8')) as TestEvent;
  if (typeof event?.id !== 'string' || typeof event.action?.type !== 'string')
    throw new WebhookSignatureError('not an event');
  return event;
}
