import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { maintenanceJobs } from '../../src/app/jobs.ts';
import { deleteExpiredIdempotencyKeys, requestHash, withIdempotency } from '../../src/idempotency/index.ts';
import { realPostgres } from '../helpers/context.ts';
import {
  api,
  connectTo,
  type SeededProject,
  seedProject,
  type TestServer,
  withRecordingServer,
} from '../helpers/server.ts';

let server: TestServer;
let project: SeededProject;
let other: SeededProject;

withRecordingServer(async (started) => {
  server = started;
  project = await seedProject(server.ctx);
  other = await seedProject(server.ctx);
});

const post = (p: SeededProject, path: string, body: unknown, key?: string) =>
  api(server, p.apiKey, 'POST', path, body, key === undefined ? {} : { 'idempotency-key': key });

async function entriesOf(p: SeededProject, user: string) {
  const rows = await server.ctx.db
    .selectFrom('ledger_entries')
    .innerJoin('end_users', 'end_users.id', 'ledger_entries.user_id')
    .select(['ledger_entries.id', 'ledger_entries.kind', 'end_users.balance'])
    .where('end_users.project_id', '=', p.projectId)
    .where('end_users.external_id', '=', user)
    .execute();
  return rows;
}

async function eventsOf(p: SeededProject, type: string) {
  const rows = await server.ctx.db
    .selectFrom('events')
    .select('id')
    .where('project_id', '=', p.projectId)
    .where('type', '=', type)
    .execute();
  return rows.length;
}

describe('Idempotency-Key', () => {
  it('runs against the database the suite was configured with', () => {
    expect(server.ctx.database.kind).toBe(realPostgres ? 'postgres' : 'embedded');
  });

  it('replays the first response for the same key and body, and moves no money again', async () => {
    const body = { user: 'ann', amount: '4.00', metadata: { ref: 'chk_1', n: 1 } };
    const first = await post(project, '/v1/user/balance/deposit', body, 'dep-1');
    expect(first.status).toBe(201);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    // The same JSON with keys in another order and other whitespace is the same request.
    const same = `{ "metadata": {"n": 1, "ref": "chk_1"},  "amount": "4.00", "user": "ann" }`;
    const second = await post(project, '/v1/user/balance/deposit', same, 'dep-1');
    expect(second.status).toBe(201);
    expect(second.body).toEqual(first.body);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(await entriesOf(project, 'ann')).toHaveLength(1);
    expect(await eventsOf(project, 'balance.deposit.created')).toBe(1);
    const balance = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=ann');
    expect(balance.body.balance).toBe('4.00');
  });

  it('replays the exact bytes of the first response (keys in the same order, same spacing)', async () => {
    const raw = async (body: string) => {
      const res = await fetch(`${server.url}/v1/user/balance/deposit`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${project.apiKey}`,
          'content-type': 'application/json',
          'idempotency-key': 'dep-bytes',
        },
        body,
      });
      return { status: res.status, type: res.headers.get('content-type'), text: await res.text() };
    };
    // Metadata keys in an order jsonb would change (it sorts by length, then bytes).
    const body = JSON.stringify({
      user: 'bea',
      amount: '1.50',
      metadata: { zeta: 1, b: 'x', alpha: [1, 2] },
    });
    const first = await raw(body);
    expect(first.status).toBe(201);
    const second = await raw(body);
    expect(second.status).toBe(201);
    expect(second.text).toBe(first.text);
    expect(second.type).toBe(first.type);
    expect(Object.keys(JSON.parse(second.text).metadata ?? {})).toEqual(['zeta', 'b', 'alpha']);
  });

  it('answers 409 when the key is reused with a different body', async () => {
    await post(project, '/v1/user/balance/deposit', { user: 'ben', amount: '1.00' }, 'dep-2');
    const res = await post(project, '/v1/user/balance/deposit', { user: 'ben', amount: '2.00' }, 'dep-2');
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({ type: 'conflict_error', code: 'idempotency_key_reused' });
    const meta = await post(
      project,
      '/v1/user/balance/deposit',
      { user: 'ben', amount: '1.00', metadata: {} },
      'dep-2',
    );
    expect(meta.status).toBe(409);
    expect(await entriesOf(project, 'ben')).toHaveLength(1);
  });

  it('scopes keys per project and per endpoint', async () => {
    await connectTo(server, project, 'cat');
    const dep = await post(project, '/v1/user/balance/deposit', { user: 'cat', amount: '3.00' }, 'shared');
    expect(dep.status).toBe(201);
    const chg = await post(project, '/v1/user/charge', { user: 'cat', amount: '1.00' }, 'shared');
    expect(chg.status).toBe(200);
    expect(chg.body.success).toBe(true);
    const elsewhere = await post(
      other,
      '/v1/user/balance/deposit',
      { user: 'cat', amount: '3.00' },
      'shared',
    );
    expect(elsewhere.status).toBe(201);
    expect(elsewhere.body.id).not.toBe(dep.body.id);
    expect(await entriesOf(project, 'cat')).toHaveLength(2);
    expect(await entriesOf(other, 'cat')).toHaveLength(1);
  });

  it('makes exactly one ledger entry from 50 concurrent identical deposits', async () => {
    const body = { user: 'dan', amount: '2.50', metadata: { ref: 'pay_50' } };
    const deposited = async () =>
      (await server.ctx.metrics.deposited.get()).values.find((v) => v.labels.project === project.projectId)
        ?.value ?? 0;
    const before = await deposited();
    const eventsBefore = await eventsOf(project, 'balance.deposit.created');
    const results = await Promise.all(
      Array.from({ length: 50 }, () => post(project, '/v1/user/balance/deposit', body, 'burst-deposit')),
    );
    expect(results.map((r) => r.status)).toEqual(Array(50).fill(201));
    const ids = new Set(results.map((r) => r.body.id));
    expect(ids.size).toBe(1);
    expect(results.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(49);
    for (const r of results) expect(r.body).toEqual(results[0]!.body);
    const entries = await entriesOf(project, 'dan');
    expect(entries).toHaveLength(1);
    expect(entries[0]!.balance).toMatch(/^2\.50*$/);
    // Replays count nothing: the metric moved by one deposit.
    expect((await deposited()) - before).toBeCloseTo(2.5, 6);
    expect(await eventsOf(project, 'balance.deposit.created')).toBe(eventsBefore + 1);
  });

  it('makes exactly one charge from 50 concurrent identical charges', async () => {
    await connectTo(server, project, 'eve');
    await post(project, '/v1/user/balance/deposit', { user: 'eve', amount: '10.00' });
    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        post(project, '/v1/user/charge', { user: 'eve', amount: '0.75' }, 'burst-charge'),
      ),
    );
    expect(results.map((r) => r.status)).toEqual(Array(50).fill(200));
    expect(new Set(results.map((r) => r.body.charge.id)).size).toBe(1);
    const entries = await entriesOf(project, 'eve');
    expect(entries.filter((e) => e.kind === 'charge')).toHaveLength(1);
    const balance = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=eve');
    expect(balance.body.balance).toBe('9.25');
  });

  it('replays a refusal too: the stored first response wins until the key expires', async () => {
    const refused = await post(project, '/v1/user/charge', { user: 'fay', amount: '1.00' }, 'refused-once');
    expect(refused.body).toMatchObject({ success: false, reason: 'not_connected' });
    await connectTo(server, project, 'fay');
    await post(project, '/v1/user/balance/deposit', { user: 'fay', amount: '5.00' });
    const replay = await post(project, '/v1/user/charge', { user: 'fay', amount: '1.00' }, 'refused-once');
    expect(replay.body).toEqual(refused.body);
    const fresh = await post(project, '/v1/user/charge', { user: 'fay', amount: '1.00' }, 'refused-then-new');
    expect(fresh.body.success).toBe(true);
  });

  it('gives concurrent requests with one key and different bodies one success and 409s', async () => {
    const results = await Promise.all(
      ['1.00', '2.00', '3.00', '4.00'].map((amount) =>
        post(project, '/v1/user/balance/deposit', { user: 'kim', amount }, 'race-different'),
      ),
    );
    expect(results.map((r) => r.status).sort()).toEqual([201, 409, 409, 409]);
    const winner = results.find((r) => r.status === 201)!;
    expect(await entriesOf(project, 'kim')).toHaveLength(1);
    const balance = await api(server, project.apiKey, 'GET', '/v1/user/balance?user=kim');
    expect(balance.body.balance).toBe(winner.body.amount);
  });

  it('stores nothing when the work fails, so a retry with the key runs again', async () => {
    const scope = {
      projectId: project.projectId,
      endpoint: 'TEST',
      key: 'fails-once',
      requestHash: requestHash({ a: 1 }),
    };
    await expect(
      withIdempotency(server.ctx, scope, async (tx) => {
        await tx
          .insertInto('end_users')
          .values({ id: 'usr_rolled_back', project_id: project.projectId, external_id: 'rb' })
          .execute();
        throw new Error('upstream exploded');
      }),
    ).rejects.toThrow('upstream exploded');
    const rolledBack = await server.ctx.db
      .selectFrom('end_users')
      .select('id')
      .where('id', '=', 'usr_rolled_back')
      .executeTakeFirst();
    expect(rolledBack).toBeUndefined();
    const retry = await withIdempotency(server.ctx, scope, async () => ({ status: 201, body: { ok: true } }));
    expect(retry).toEqual({ status: 201, body: { ok: true }, raw: '{"ok":true}', replayed: false });
    const replay = await withIdempotency(server.ctx, scope, async () => ({ status: 500, body: 'not run' }));
    expect(replay).toEqual({ status: 201, body: { ok: true }, raw: '{"ok":true}', replayed: true });
  });

  it('does not consume a key on a request rejected as invalid', async () => {
    const bad = await post(
      project,
      '/v1/user/balance/deposit',
      { user: 'gus', amount: '-1' },
      'fix-and-retry',
    );
    expect(bad.status).toBe(400);
    const good = await post(
      project,
      '/v1/user/balance/deposit',
      { user: 'gus', amount: '1.00' },
      'fix-and-retry',
    );
    expect(good.status).toBe(201);
  });

  it('validates the key', async () => {
    for (const key of ['', 'x'.repeat(256), 'tab\there']) {
      const res = await post(project, '/v1/user/balance/deposit', { user: 'hal', amount: '1.00' }, key);
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({ param: 'Idempotency-Key', code: 'invalid_idempotency_key' });
    }
    const longest = await post(
      project,
      '/v1/user/balance/deposit',
      { user: 'hal', amount: '1.00' },
      'k'.repeat(255),
    );
    expect(longest.status).toBe(201);
    expect(await entriesOf(project, 'hal')).toHaveLength(1);
  });

  it('keeps keys for 24 hours, then lets them go', async () => {
    await post(project, '/v1/user/balance/deposit', { user: 'ivy', amount: '1.00' }, 'old-key');
    const row = await server.ctx.db
      .selectFrom('idempotency_keys')
      .select(['created_at', 'expires_at', 'endpoint'])
      .where('project_id', '=', project.projectId)
      .where('key', '=', 'old-key')
      .executeTakeFirstOrThrow();
    expect(row.endpoint).toBe('POST /v1/user/balance/deposit');
    expect(row.expires_at.getTime() - row.created_at.getTime()).toBeGreaterThanOrEqual(24 * 3600 * 1000);
    await server.ctx.db
      .updateTable('idempotency_keys')
      .set({ expires_at: sql`now() - interval '1 second'` })
      .where('key', '=', 'old-key')
      .execute();
    // An expired key is a new key: the request runs again.
    const again = await post(project, '/v1/user/balance/deposit', { user: 'ivy', amount: '2.00' }, 'old-key');
    expect(again.status).toBe(201);
    expect(again.body.balance).toBe('3.00');
    await server.ctx.db
      .updateTable('idempotency_keys')
      .set({ expires_at: sql`now() - interval '1 second'` })
      .where('key', 'in', ['old-key', 'dep-1'])
      .execute();
    expect(await deleteExpiredIdempotencyKeys(server.ctx.db)).toBe(2);
    const left = () =>
      server.ctx.db
        .selectFrom('idempotency_keys')
        .select('key')
        .where('key', 'in', ['old-key', 'dep-1', 'dep-2'])
        .execute();
    expect((await left()).map((r) => r.key)).toEqual(['dep-2']);
    // The periodic job does the same.
    const job = maintenanceJobs.find((j) => j.name === 'idempotency-key-cleanup')!;
    expect(await job.run(server.ctx)).toBe(0);
    await server.ctx.db
      .updateTable('idempotency_keys')
      .set({ expires_at: sql`now() - interval '1 second'` })
      .where('key', '=', 'dep-2')
      .execute();
    expect(await job.run(server.ctx)).toBe(1);
    expect(await left()).toEqual([]);
  });
});
