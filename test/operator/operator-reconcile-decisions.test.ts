import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/core/errors.ts';
import { classifyServiceError } from '../../src/operator/failure.ts';
import {
  checkSpec,
  createdByOf,
  disabledByHealth,
  managedByOf,
  rowDrift,
  type SubscriptionRow,
  secretNeedsPush,
  secretSourceOf,
  type WebhookSubscription,
} from '../../src/operator/resources/webhook-subscription.ts';
import { WorkQueue } from '../../src/operator/runtime/workqueue.ts';
import { setCondition, statusPatch } from '../../src/operator/status.ts';

const spec: {
  paywallId: string;
  url: string;
  events: string[];
  description: string;
  customHeaders: Record<string, string>;
} = {
  paywallId: 'pw_1',
  url: ' https://hooks.example.com/x ',
  events: ['balance.*'],
  description: '  Billing  ',
  customHeaders: { 'X-Team': 'billing' },
};

const row: SubscriptionRow = {
  id: 'whsub_1',
  paywallId: 'pw_1',
  url: 'https://hooks.example.com/x',
  events: ['balance.*'],
  isActive: true,
  description: 'Billing',
  customHeaders: { 'X-Team': 'billing' },
  secretSuffix: 'abcd',
  consecutiveFailures: 0,
  lastDeliveredAt: null,
  managedBy: 'WebhookSubscription ns/a',
  disabledReason: null,
};

describe('spec checks', () => {
  it('normalizes a valid spec into the service input, active by default', () => {
    const check = checkSpec(spec);
    expect(check).toEqual({
      ok: true,
      paywallId: 'pw_1',
      active: true,
      input: {
        url: 'https://hooks.example.com/x',
        events: ['balance.*'],
        description: 'Billing',
        customHeaders: { 'X-Team': 'billing' },
      },
    });
  });

  it('refuses what the schema would refuse, with a message naming the field', () => {
    expect(checkSpec(undefined)).toEqual({ ok: false, message: 'spec is required' });
    expect(checkSpec({ ...spec, paywallId: '' })).toMatchObject({
      ok: false,
      message: expect.stringContaining('spec.paywallId'),
    });
    expect(checkSpec({ ...spec, events: [] })).toMatchObject({
      ok: false,
      message: expect.stringContaining('spec.events'),
    });
    expect(checkSpec({ ...spec, events: ['*', 'balance.*'] })).toMatchObject({
      ok: false,
      message: expect.stringContaining('"*"'),
    });
    const headers = Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`X-H${i}`, 'v']));
    expect(checkSpec({ ...spec, customHeaders: headers })).toMatchObject({
      ok: false,
      message: expect.stringContaining('at most 10'),
    });
    expect(checkSpec({ ...spec, secretRef: { key: 'k' } })).toMatchObject({
      ok: false,
      message: expect.stringContaining('secretRef.name'),
    });
  });

  it('trims the description to 512 characters and treats an empty one as none', () => {
    const long = checkSpec({ ...spec, description: 'x'.repeat(600) });
    expect(long.ok && long.input.description?.length).toBe(512);
    const empty = checkSpec({ ...spec, description: '   ' });
    expect(empty.ok && empty.input.description).toBeNull();
  });
});

describe('names', () => {
  it('names the creator and the manager after the resource', () => {
    expect(createdByOf('ns', 'a')).toBe('k8s:ns/a');
    expect(managedByOf('ns', 'a')).toBe('WebhookSubscription ns/a');
  });

  it('takes the secret from secretRef, else from the generated Secret', () => {
    expect(secretSourceOf({ metadata: { name: 'a' }, spec: { secretRef: { name: 's', key: 'k' } } })).toEqual(
      {
        name: 's',
        key: 'k',
        generated: false,
      },
    );
    expect(secretSourceOf({ metadata: { name: 'a' }, spec: { secretRef: { name: 's' } } }).key).toBe(
      'secret',
    );
    expect(secretSourceOf({ metadata: { name: 'a' }, spec: {} })).toEqual({
      name: 'a-webhook-secret',
      key: 'secret',
      generated: true,
    });
  });
});

describe('drift', () => {
  const desired = (s: typeof spec & { active?: boolean }) => {
    const c = checkSpec(s);
    if (!c.ok) throw new Error(c.message);
    return [c.input, c.active] as const;
  };

  it('finds nothing to do when the row matches the spec', () => {
    expect(rowDrift(...desired(spec), row)).toEqual([]);
    // Header order does not matter.
    expect(
      rowDrift(...desired({ ...spec, customHeaders: { B: '2', A: '1' } }), {
        ...row,
        customHeaders: { A: '1', B: '2' },
      }),
    ).toEqual([]);
  });

  it('names every field that differs, including a row deactivated out of band', () => {
    expect(rowDrift(...desired(spec), { ...row, url: 'https://other.example.com', isActive: false })).toEqual(
      ['url', 'active'],
    );
    expect(rowDrift(...desired({ ...spec, events: ['*'] }), row)).toEqual(['events']);
    expect(rowDrift(...desired({ ...spec, description: '' }), row)).toEqual(['description']);
    expect(rowDrift(...desired({ ...spec, active: false }), row)).toEqual(['active']);
  });

  it('pushes the secret again when the Secret changed or the suffix does not match', () => {
    const status = { observedSecret: 's/k@5' };
    expect(secretNeedsPush(status, 's/k@5', 'whsec_xxxxabcd', row)).toBe(false);
    expect(secretNeedsPush(status, 's/k@6', 'whsec_xxxxabcd', row)).toBe(true);
    expect(secretNeedsPush(status, 's/k@5', 'whsec_xxxxzzzz', row)).toBe(true);
    expect(secretNeedsPush(undefined, 's/k@5', 'whsec_xxxxabcd', row)).toBe(true);
  });
});

describe('endpoint health', () => {
  const resource = (generation: number, observed: number | undefined) =>
    ({
      metadata: { name: 'a', namespace: 'ns', generation },
      status: observed === undefined ? {} : { observedGeneration: observed },
    }) as WebhookSubscription;
  const disabled = { ...row, isActive: false, disabledReason: 'every delivery attempt failed for 120 hours' };

  it('keeps a row disabled by endpoint health off until the spec changes', () => {
    expect(disabledByHealth(disabled, true, resource(3, 3))).toBe(true);
    // A spec change (a new generation not yet observed) re-enables it.
    expect(disabledByHealth(disabled, true, resource(4, 3))).toBe(false);
    // Paused by the spec, or deactivated out of band without a reason: the usual rules apply.
    expect(disabledByHealth(disabled, false, resource(3, 3))).toBe(false);
    expect(disabledByHealth({ ...disabled, disabledReason: null }, true, resource(3, 3))).toBe(false);
    expect(disabledByHealth(row, true, resource(3, 3))).toBe(false);
  });
});

describe('error classification', () => {
  it('maps a refused input to InvalidSpec without retry, naming the spec field', () => {
    const failure = classifyServiceError(
      new ApiError(400, 'invalid_request_error', "Invalid 'url': must be https", { param: 'url' }),
    );
    expect(failure).toEqual({
      reason: 'InvalidSpec',
      message: "Invalid 'url': must be https (spec.url)",
      retry: false,
    });
  });

  it('maps connection failures to DatabaseUnavailable with retry', () => {
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
    expect(classifyServiceError(refused)).toMatchObject({ reason: 'DatabaseUnavailable', retry: true });
    const shutdown = Object.assign(new Error('terminating connection due to administrator command'), {
      code: '57P01',
    });
    expect(classifyServiceError(shutdown)).toMatchObject({ reason: 'DatabaseUnavailable', retry: true });
  });

  it('maps an unknown paywall to PaywallNotFound', () => {
    const fk = Object.assign(new Error('insert violates foreign key constraint'), { code: '23503' });
    expect(classifyServiceError(fk)).toMatchObject({ reason: 'PaywallNotFound', retry: true });
  });
});

describe('conditions and status patches', () => {
  const t0 = new Date('2026-01-01T00:00:00Z');
  const t1 = new Date('2026-01-01T00:05:00Z');

  it('moves lastTransitionTime only when the status flips', () => {
    const first = setCondition(
      undefined,
      { type: 'Ready', status: 'False', reason: 'SecretNotFound', message: 'm' },
      t0,
    );
    const same = setCondition(
      first,
      { type: 'Ready', status: 'False', reason: 'InvalidSpec', message: 'n' },
      t1,
    );
    expect(same[0]).toMatchObject({ reason: 'InvalidSpec', lastTransitionTime: '2026-01-01T00:00:00Z' });
    const flipped = setCondition(
      same,
      { type: 'Ready', status: 'True', reason: 'Synced', message: 'ok' },
      t1,
    );
    expect(flipped).toHaveLength(1);
    expect(flipped[0]).toMatchObject({ status: 'True', lastTransitionTime: '2026-01-01T00:05:00Z' });
  });

  it('patches only the fields that changed, and nothing when all match', () => {
    const current = {
      subscriptionId: 'whsub_1',
      consecutiveFailures: 0,
      lastDeliveredAt: null,
      observedGeneration: 1,
    };
    expect(statusPatch(current, { ...current })).toBeUndefined();
    expect(statusPatch(current, { ...current, consecutiveFailures: 3, observedGeneration: 2 })).toEqual({
      consecutiveFailures: 3,
      observedGeneration: 2,
    });
    expect(statusPatch({}, { lastDeliveredAt: null })).toBeUndefined();
  });
});

describe('work queue', () => {
  it('holds a key once however often it is added, and never hands it to two workers', async () => {
    const q = new WorkQueue();
    q.add('a');
    q.add('a');
    q.add('b');
    expect(q.length).toBe(2);
    const first = await q.get();
    expect(first).toBe('a');
    q.add('a'); // changed while being processed
    expect(await q.get()).toBe('b');
    expect(q.length).toBe(0); // 'a' waits for its worker to finish
    q.done('a');
    expect(await q.get()).toBe('a');
    q.shutDown();
    expect(await q.get()).toBeUndefined();
  });

  it('backs off exponentially up to the cap, and forgets on success', () => {
    const q = new WorkQueue({ baseDelayMs: 100, maxDelayMs: 1000 });
    expect([1, 2, 3, 4, 5, 6].map((n) => q.backoff(n))).toEqual([100, 200, 400, 800, 1000, 1000]);
    expect(q.addRateLimited('a')).toBe(100);
    expect(q.addRateLimited('a')).toBe(200);
    q.forget('a');
    expect(q.failures('a')).toBe(0);
    q.shutDown();
  });

  it('brings a delayed key back after its delay', async () => {
    const q = new WorkQueue();
    const started = Date.now();
    q.addAfter('a', 30);
    expect(await q.get()).toBe('a');
    expect(Date.now() - started).toBeGreaterThanOrEqual(25);
    q.shutDown();
  });
});
