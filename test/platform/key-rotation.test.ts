import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rotateKeys, SEALED_COLUMNS } from '../../src/app/key-rotation.ts';
import { Sealer } from '../../src/core/crypto.ts';
import { HOP_HEADER, hopId } from '../../src/net/hop.ts';
import { getProject } from '../../src/projects/service.ts';
import { upsertProvider } from '../../src/routing/providers.ts';
import { connectUser } from '../../src/users/service.ts';
import { createSubscription } from '../../src/webhooks/subscriptions.ts';
import { createTestContext, newTestId, realPostgres, TEST_ENCRYPTION_KEY } from '../helpers/context.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { api, seedProject, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Online key rotation: every process runs the ring (new key first, old key after it), `tollgate keys
 * rotate` re-seals every secret with the new key while requests are served, links signed with the old
 * key keep working, and afterwards the old key can leave the ring — while a process with only the old
 * key is refused at start.
 */
const KEY_A = TEST_ENCRYPTION_KEY;
const KEY_B = 'b'.repeat(64);
const ring = `${KEY_B},${KEY_A}`;
const idOf = (key: string) => new Sealer(Buffer.from(key, 'hex')).activeKeyId;
const trigger = { source: 'test', actorType: 'test', actorId: 'test' };
const withoutKeys = (env: NodeJS.ProcessEnv) => {
  const { TOLLGATE_ENCRYPTION_KEY: _key, TOLLGATE_ENCRYPTION_KEYS: _keys, ...rest } = env;
  return rest;
};

describe('the sealer', () => {
  it('seals with the active key, opens v1 and v2 values of any key of the ring, verifies old signatures', () => {
    const oldOnly = new Sealer(Buffer.from(KEY_A, 'hex'));
    const both = new Sealer([Buffer.from(KEY_B, 'hex'), Buffer.from(KEY_A, 'hex')]);
    const sealedOld = oldOnly.seal('provider key');
    expect(sealedOld.startsWith(`v2.${idOf(KEY_A)}.`)).toBe(true);
    expect(both.open(sealedOld)).toBe('provider key');
    const sealedNew = both.seal('provider key');
    expect(sealedNew.startsWith(`v2.${idOf(KEY_B)}.`)).toBe(true);
    expect(() => oldOnly.open(sealedNew)).toThrow(/not in the key ring/);
    // a value from before the ring (v1: no key id) opens with whichever key authenticates it
    const [, , iv, tag, body] = sealedOld.split('.');
    expect(both.open(['v1', iv, tag, body].join('.'))).toBe('provider key');
    expect(both.verify('link', oldOnly.sign('link'))).toBe(true);
    expect(oldOnly.verify('link', both.sign('link'))).toBe(false);
    expect(both.keyChecks()).toEqual([both.keyCheck(), oldOnly.keyCheck()]);
  });
});

describe.skipIf(!realPostgres)('rotating on Postgres while two pods serve', () => {
  const shared = { id: newTestId() };
  let mock: MockUpstream;
  let podA: TestServer;
  let pods: TestServer[] = [];
  let projectId: string;
  let apiKey: string;
  let topupUrl: string;
  let connectUrl: string;
  /** The connect page's form as a browser rendered it from a pod on the old key. */
  let connectForm: string;

  beforeAll(async () => {
    mock = await startMockUpstream();
    podA = await startTestServer({}, shared); // the old key only
    const seeded = await seedProject(podA.ctx, {
      upstreamUrl: mock.baseUrl,
      upstreamKey: 'sk-mock-provider-key',
      models: [
        { id: 'm', upstreamModel: 'mock-model', pricing: { mode: 'per_request', perRequest: '0.01' } },
      ],
    });
    projectId = seeded.projectId;
    apiKey = seeded.apiKey;
    await upsertProvider(podA.ctx.db, podA.ctx.sealer, projectId, {
      name: 'second',
      baseUrl: mock.baseUrl,
      key: 'sk-second-provider-key',
    });
    await createSubscription(
      podA.ctx,
      projectId,
      { url: 'http://127.0.0.1:9/hook', events: ['*'] },
      {
        createdBy: 'test',
      },
    );
    // enough secrets that re-sealing them one row at a time overlaps the requests
    for (let i = 0; i < 40; i++) {
      await upsertProvider(podA.ctx.db, podA.ctx.sealer, projectId, {
        name: `spare-${i}`,
        baseUrl: mock.baseUrl,
        key: `sk-spare-${i}`,
      });
    }
    const project = await getProject(podA.ctx.db, projectId);
    await connectUser(podA.ctx.db, podA.ctx.events, project, 'load', trigger);
    await podA.ctx.billing.deposit({ project, externalId: 'load', amount: '100', source: 'test', trigger });
    // a top-up link signed with the old key
    topupUrl = (await api(podA, apiKey, 'POST', '/v1/user/topup', { user: 'load' })).body.url as string;
    connectUrl = (await api(podA, apiKey, 'POST', '/v1/user/connect', { user: 'formy' })).body.url as string;
    const page = await (await fetch(`${podA.url}${new URL(connectUrl).pathname}`)).text();
    connectForm = new URLSearchParams(
      [...page.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map(
        ([, name, value]) => [name!, value!] as [string, string],
      ),
    ).toString();
    await podA.close();
    // the rolling update: every pod now runs the ring, the new key first
    pods = [
      await startTestServer({ TOLLGATE_ENCRYPTION_KEYS: ring }, shared),
      await startTestServer({ TOLLGATE_ENCRYPTION_KEYS: ring }, shared),
    ];
  });
  afterAll(async () => {
    for (const pod of pods) await pod.close();
    await mock?.close();
  });

  it('re-seals every secret under load with no failed request, and the old link still opens', async () => {
    const clients = pods.map(
      (pod) => new OpenAI({ baseURL: `${pod.url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 }),
    );
    const messages = [{ role: 'user' as const, content: 'Hello' }];
    let failures = 0;
    let served = 0;
    let rotating = true;
    const load = async (client: OpenAI) => {
      // bounded: at most 400 requests per client, and only while the rotation runs (plus one)
      for (let i = 0; i < 400 && (rotating || i === 0); i++) {
        try {
          const answer = await client.chat.completions.create({ model: 'm', user: 'load', messages });
          if (answer.choices[0]?.message.content) served++;
          else failures++;
        } catch {
          failures++;
        }
      }
    };
    const running = clients.map(load);
    const result = await rotateKeys(pods[0]!.ctx.db, pods[0]!.ctx.sealer, { batch: 1 }).finally(() => {
      rotating = false;
    });
    await Promise.all(running);
    expect(failures).toBe(0);
    expect(served).toBeGreaterThan(0);
    expect(result.activeKeyId).toBe(idOf(KEY_B));
    expect(result.resealed['projects.upstream_key_sealed']).toBe(1);
    expect(result.resealed['providers.key_sealed']).toBe(42); // default, second and 40 spares
    expect(result.resealed['webhook_subscriptions.secret_sealed']).toBe(1);
    // every sealed value is the new key's now; a second run has nothing to do
    const db = pods[0]!.ctx.db;
    for (const { table, column } of SEALED_COLUMNS) {
      const rows = (await db
        .selectFrom(table as 'projects')
        .select(`${column} as v` as 'upstream_key_sealed')
        .where(column as 'upstream_key_sealed', 'is not', null)
        .execute()) as unknown as Array<{ v: string }>;
      for (const row of rows) expect(row.v.startsWith(`v2.${idOf(KEY_B)}.`)).toBe(true);
    }
    const again = await rotateKeys(db, pods[0]!.ctx.sealer);
    expect(Object.values(again.resealed).every((n) => n === 0)).toBe(true);
    // the top-up link the old key signed still opens (links stay valid until they expire)
    const link = await fetch(`${pods[1]!.url}${new URL(topupUrl).pathname}`, { redirect: 'manual' });
    expect(link.status).toBeLessThan(400);
  });

  it('a form rendered under the old key still posts to a pod on the ring; a forged one does not', async () => {
    expect(connectForm).toMatch(/confirm=/);
    const path = new URL(connectUrl).pathname;
    const post = (body: string) =>
      fetch(`${pods[1]!.url}${path}`, {
        method: 'POST',
        redirect: 'manual',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body,
      });
    const connected = async () =>
      (await api(pods[1]!, apiKey, 'GET', '/v1/user/balance?user=formy')).body.connected as boolean;
    const forged = await post(connectForm.replace(/confirm=[^&]+/, `confirm=${'A'.repeat(43)}`));
    expect(forged.status).toBe(400);
    await forged.arrayBuffer();
    expect(await connected()).toBe(false);
    const res = await post(connectForm);
    expect(res.status).toBeLessThan(400);
    await res.arrayBuffer();
    expect(await connected()).toBe(true);
  });

  it('a request a pod on the old key sent upstream comes back to a pod on the ring: refused as a loop', async () => {
    const oldPodHop = hopId(new Sealer(Buffer.from(KEY_A, 'hex')));
    expect(oldPodHop).not.toBe(hopId(pods[0]!.ctx.sealer));
    for (const hop of [oldPodHop, hopId(pods[0]!.ctx.sealer)]) {
      const res = await fetch(`${pods[0]!.url}/v1/models`, { headers: { [HOP_HEADER]: hop } });
      expect(res.status).toBe(508);
      await res.arrayBuffer();
    }
  });

  it('afterwards the new key alone serves; the old key alone is refused at start', async () => {
    const fresh = await startTestServer({ TOLLGATE_ENCRYPTION_KEY: KEY_B }, shared);
    try {
      const client = new OpenAI({ baseURL: `${fresh.url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });
      const answer = await client.chat.completions.create({
        model: 'm',
        user: 'load',
        messages: [{ role: 'user', content: 'Hi' }],
      });
      expect(answer.choices[0]!.message.content).toBe(' hello'.repeat(5));
      const sub = await fresh.ctx.db
        .selectFrom('webhook_subscriptions')
        .select('secret_sealed')
        .where('project_id', '=', projectId)
        .executeTakeFirstOrThrow();
      expect(fresh.ctx.sealer.open(sub.secret_sealed)).toMatch(/^whsec_/);
    } finally {
      await fresh.close();
    }
    await expect(createTestContext({ TOLLGATE_ENCRYPTION_KEY: KEY_A }, shared)).rejects.toThrow(
      /not the key this database was set up with/,
    );
  });

  it('a secret no key opens: its request answers 503 and says why; a rotation reports it and goes on', async () => {
    const db = pods[0]!.ctx.db;
    const provider = () =>
      db.selectFrom('providers').where('project_id', '=', projectId).where('name', '=', 'default');
    const { key_sealed: kept } = await provider().select('key_sealed').executeTakeFirstOrThrow();
    // the provider's key sealed with a key that left the ring; a webhook secret still under the ring's old key
    const gone = `v2.${idOf('cd'.repeat(32))}.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA.AAAA`;
    const setKey = (value: string | null) =>
      db
        .updateTable('providers')
        .set({ key_sealed: value })
        .where('project_id', '=', projectId)
        .where('name', '=', 'default')
        .execute();
    await setKey(gone);
    await db
      .updateTable('webhook_subscriptions')
      .set({ secret_sealed: new Sealer(Buffer.from(KEY_A, 'hex')).seal(`whsec_${'x'.repeat(32)}`) })
      .where('project_id', '=', projectId)
      .execute();
    await pods[0]!.ctx.projects.changed(projectId);
    try {
      const res = await fetch(`${pods[0]!.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', user: 'load', messages: [{ role: 'user', content: 'Hi' }] }),
      });
      const body = (await res.json()) as { error: { code: string } };
      expect([res.status, body.error.code]).toEqual([503, 'sealed_value_unreadable']);
      const result = await rotateKeys(db, pods[0]!.ctx.sealer);
      expect(result.unopenable).toEqual({ 'providers.key_sealed': 1 });
      // the columns after it were re-sealed all the same
      expect(result.resealed['webhook_subscriptions.secret_sealed']).toBe(1);
    } finally {
      await setKey(kept);
      await pods[0]!.ctx.projects.changed(projectId);
    }
  });
});

describe('`tollgate keys rotate` on the embedded database', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-keys-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const run = (env: Record<string, string>, ...args: string[]) =>
    promisify(execFile)(process.execPath, ['cmd/tollgate.ts', ...args, '--json'], {
      env: {
        ...withoutKeys(process.env),
        DATABASE_URL: '',
        REDIS_URL: '',
        TOLLGATE_URL: '',
        TOLLGATE_DATA_DIR: dir,
        LOG_LEVEL: 'warn',
        ...env,
      },
      encoding: 'utf8',
      timeout: 120_000,
    });

  it('re-seals with the first key of the ring; then the old key alone is refused', async () => {
    await run({ TOLLGATE_ENCRYPTION_KEY: KEY_A }, 'migrate');
    const created = JSON.parse(
      (
        await run(
          { TOLLGATE_ENCRYPTION_KEY: KEY_A },
          'project',
          'create',
          '--name',
          'Rotated',
          '--upstream-url',
          'https://api.example.com/v1',
          '--upstream-key',
          'sk-rotated',
        )
      ).stdout,
    ) as { id: string };
    const rotated = JSON.parse((await run({ TOLLGATE_ENCRYPTION_KEYS: ring }, 'keys', 'rotate')).stdout) as {
      resealed: Record<string, number>;
      activeKeyId: string;
    };
    expect(rotated.activeKeyId).toBe(idOf(KEY_B));
    expect(rotated.resealed['projects.upstream_key_sealed']).toBe(1);
    const shown = await run({ TOLLGATE_ENCRYPTION_KEY: KEY_B }, 'project', 'show', '--project', created.id);
    expect(JSON.parse(shown.stdout)).toMatchObject({ id: created.id });
    const refused = await run({ TOLLGATE_ENCRYPTION_KEY: KEY_A }, 'project', 'list').catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((refused as { code: number }).code).not.toBe(0);
    expect((refused as { stderr: string }).stderr).toContain('not the key this database was set up with');
  }, 90_000); // CLI processes in turn, each opening the embedded database: ~13 s on a quiet machine
});
