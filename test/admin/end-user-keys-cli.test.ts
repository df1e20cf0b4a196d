import { execFile } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { localAdmin } from '../../src/admin/local.ts';
import { api, seedProject, type TestServer, withRecordingServer } from '../helpers/server.ts';

/**
 * `tollgate users keys create|list|revoke`: over the admin API (TOLLGATE_URL + TOLLGATE_ADMIN_TOKEN, the
 * CLI as a child process), and the same operations on the database (../../src/admin/local.ts). A key
 * made so authenticates `/v1` as its user until revoked.
 */
const ROOT = 'root-admin-token-user-keys-0123456789';
let server: TestServer;

withRecordingServer(
  async (started) => {
    server = started;
  },
  { TOLLGATE_ADMIN_TOKEN: ROOT },
);

/** The CLI as a child process (asynchronous: the server it calls runs in this process). */
async function tollgate(...args: string[]) {
  const run = await new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile(
      process.execPath,
      ['cmd/tollgate.ts', ...args],
      {
        env: { ...process.env, TOLLGATE_URL: server.url, TOLLGATE_ADMIN_TOKEN: ROOT, LOG_LEVEL: 'error' },
        encoding: 'utf8',
        timeout: 60_000,
      },
      (err, stdout, stderr) =>
        resolve({ status: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
    );
  });
  return { ...run, json: () => JSON.parse(run.stdout) };
}

describe('tollgate users keys', () => {
  it('creates, lists and revokes an end-user key over the admin API', async () => {
    const project = await seedProject(server.ctx);
    const p = project.projectId;
    const created = await tollgate(
      'users',
      'keys',
      'create',
      '--project',
      p,
      '--user',
      'dora',
      '--name',
      'laptop',
      '--spend-cap',
      '20.00',
      '--expires',
      '2099-01-01T00:00:00Z',
      '--json',
    );
    expect(created.status, created.stderr).toBe(0);
    const key = created.json();
    expect(key).toMatchObject({ user: 'dora', name: 'laptop', spendCap: '20.00' });
    expect(key.expiresAt).toBe('2099-01-01T00:00:00.000Z');
    expect(key.key).toMatch(/^tgu_/);
    const balance = await api(server, key.key, 'GET', '/v1/user/balance');
    expect(balance.body.user).toBe('dora');

    const text = await tollgate('users', 'keys', 'list', '--project', p, '--user', 'dora');
    expect(text.status, text.stderr).toBe(0);
    expect(text.stdout).toContain(`${key.id}  ${key.prefix}…  laptop  active`);
    expect(text.stdout).not.toContain(key.key);

    const revoked = await tollgate('users', 'keys', 'revoke', '--project', p, '--key', key.id);
    expect(revoked.status, revoked.stderr).toBe(0);
    expect(revoked.stdout).toContain(`Revoked key ${key.id}`);
    expect((await api(server, key.key, 'GET', '/v1/user/balance')).status).toBe(401);
    const listed = await tollgate('users', 'keys', 'list', '--project', p, '--user', 'dora', '--json');
    expect(listed.json()).toEqual([expect.objectContaining({ id: key.id, revokedAt: expect.any(String) })]);

    const bad = await tollgate(
      'users',
      'keys',
      'create',
      '--project',
      p,
      '--user',
      'dora',
      '--name',
      'x',
      '--spend-cap',
      'lots',
    );
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/spendCap/);
  });

  it('does the same on the database', async () => {
    const project = await seedProject(server.ctx);
    const admin = localAdmin(server.ctx);
    const created = await admin.createUserKey(project.projectId, { user: 'eve', name: 'ci' });
    expect((await api(server, created.key, 'GET', '/v1/user/balance')).body.user).toBe('eve');
    expect(await admin.listUserKeys(project.projectId, 'eve')).toEqual([
      expect.objectContaining({ id: created.id, name: 'ci', revokedAt: null }),
    ]);
    const revoked = await admin.revokeUserKey(project.projectId, created.id);
    expect(revoked).toMatchObject({ id: created.id, propagated: true });
    expect((await api(server, created.key, 'GET', '/v1/user/balance')).status).toBe(401);
    const audit = await server.ctx.db
      .selectFrom('audit_log')
      .select('action')
      .where('target_id', '=', created.id)
      .orderBy('id')
      .execute();
    expect(audit.map((a) => a.action)).toEqual(['user_key.create', 'user_key.revoke']);
  });
});
