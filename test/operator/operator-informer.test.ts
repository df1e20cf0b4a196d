import { EventEmitter } from 'node:events';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import type { WebhookSubscription } from '../../src/operator/resources/webhook-subscription.ts';
import { Informer, type InformerEvent } from '../../src/operator/runtime/informer.ts';
import { type KubeClients, makeClients } from '../../src/operator/runtime/kube.ts';
import { type KubeTarget, kubeTarget, realCluster } from '../helpers/fake-kube-apiserver.ts';
import { createWebhookSubscription } from './fixture.ts';

/**
 * The informer's list-then-watch against the fake API server: every change arrives once the cache has
 * synced, a watch the server ends is resumed from the last resourceVersion (no relist, nothing lost), a
 * failing list is retried with backoff, and 410 Gone makes it list again.
 */

let target: KubeTarget;
let kube: KubeClients;
const log = pino({ level: 'silent' });

beforeAll(async () => {
  target = await kubeTarget('tg-informer');
  kube = makeClients(target.kubeConfig);
});
afterAll(async () => {
  await target?.close();
});

const create = (name: string) =>
  createWebhookSubscription(kube, target.namespace, name, {
    paywallId: 'pw_1',
    url: 'https://hooks.example.com',
    events: ['*'],
  });

const running = new Set<Informer<WebhookSubscription>>();
afterEach(async () => {
  await Promise.all([...running].map((i) => i.stop()));
  running.clear();
});

/** Resolves when check() holds: re-checked on every informer event and every API write. */
function until(check: () => unknown, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const attempt = () => {
      if (!check()) return;
      clearTimeout(timer);
      informerEvents.off('event', attempt);
      off();
      resolve();
    };
    const timer = setTimeout(() => {
      informerEvents.off('event', attempt);
      off();
      reject(new Error(`timed out waiting for ${what}`));
    }, 10_000);
    informerEvents.on('event', attempt);
    const off = target.fake!.onChange(attempt);
    attempt();
  });
}

const informerEvents = new EventEmitter();

function informer(scope: 'namespace' | 'cluster') {
  const seen: Array<[InformerEvent, string]> = [];
  const ns = target.namespace;
  const inf = new Informer<WebhookSubscription>({
    name: 'test',
    kubeConfig: target.kubeConfig,
    log,
    backoffMs: 20,
    watchPath:
      scope === 'namespace'
        ? `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`
        : `/apis/${GROUP}/${VERSION}/${PLURAL}`,
    list: async () =>
      (scope === 'namespace'
        ? await kube.custom.listNamespacedCustomObject({
            group: GROUP,
            version: VERSION,
            namespace: ns,
            plural: PLURAL,
          })
        : await kube.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL })) as {
        items: WebhookSubscription[];
      },
    onEvent: (event, object) => {
      seen.push([event, object.metadata.name]);
      informerEvents.emit('event');
    },
  });
  running.add(inf);
  return { inf, seen };
}

/** An informer started, synced, and with its watch open on the fake API server. */
async function watchingInformer(scope: 'namespace' | 'cluster') {
  const started = informer(scope);
  started.inf.start();
  await started.inf.waitForSync();
  await until(() => target.fake!.openWatches > 0, 'the watch');
  return started;
}

const lists = () =>
  target.fake!.requests.filter((r) => r.method === 'GET' && r.path.endsWith(`/${PLURAL}`) && !r.query.watch)
    .length;

describe.skipIf(realCluster)('informer', () => {
  it('retries a failing list with backoff, then syncs and follows changes', async () => {
    await create('before');
    target.fake!.failNext('GET', new RegExp(`/${PLURAL}$`), 500, 2);
    const { inf, seen } = informer('namespace');
    const listsBefore = lists();
    inf.start();
    await inf.waitForSync();
    expect(lists() - listsBefore).toBe(3);
    expect(seen).toEqual([['add', 'before']]);
    await create('after');
    await until(() => inf.get(`${target.namespace}/after`), 'the new object in the cache');
    await kube.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: target.namespace,
      plural: PLURAL,
      name: 'before',
    });
    await until(() => !inf.get(`${target.namespace}/before`), 'the deletion');
    expect(seen).toEqual([
      ['add', 'before'],
      ['add', 'after'],
      ['delete', 'before'],
    ]);
    await inf.stop();
  });

  it('resumes a watch the server ended from the last resourceVersion, without listing again', async () => {
    const { inf, seen } = await watchingInformer('cluster');
    const listsBefore = lists();
    const watchesBefore = target.fake!.requests.filter((r) => r.query.watch).length;
    target.fake!.closeWatches();
    await until(
      () =>
        target.fake!.requests.filter((r) => r.query.watch).length > watchesBefore &&
        target.fake!.openWatches > 0,
      'the watch to be resumed',
    );
    const resumed = target.fake!.requests.filter((r) => r.query.watch).at(-1)!;
    expect(resumed.query.resourceVersion).toBeTruthy();
    expect(resumed.path).toBe(`/apis/${GROUP}/${VERSION}/${PLURAL}`);
    await create('while-resumed');
    await until(() => inf.get(`${target.namespace}/while-resumed`), 'the change after the resume');
    expect(lists()).toBe(listsBefore);
    expect(seen.filter(([, name]) => name === 'while-resumed')).toEqual([['add', 'while-resumed']]);
    await inf.stop();
  });

  it('lists again after 410 Gone and reports what changed meanwhile, deletions included', async () => {
    const { inf, seen } = await watchingInformer('namespace');
    target.fake!.muteWatches();
    await create('missed');
    await kube.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: target.namespace,
      plural: PLURAL,
      name: 'after',
    });
    target.fake!.compact();
    const listsBefore = lists();
    target.fake!.closeWatches();
    await until(() => inf.get(`${target.namespace}/missed`), 'the missed object');
    expect(lists()).toBe(listsBefore + 1);
    expect(inf.get(`${target.namespace}/after`)).toBeUndefined();
    expect(seen).toContainEqual(['delete', 'after']);
    await inf.stop();
    // Stopping closes the watch connection.
    await until(() => target.fake!.openWatches === 0, 'the watch to close');
  });
});
