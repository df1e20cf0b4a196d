import { type ChildProcess, spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { dataDirFor, devEnv, startDev } from '../helpers/dev-process.ts';

/**
 * `tollgate dev` on the embedded database, administered as the issue asks: the CLI next to it goes over
 * the admin API (TOLLGATE_URL + TOLLGATE_ADMIN_TOKEN, as dev prints them), and a CLI that tries the
 * database directly is refused by the lock with one line naming the dev process.
 */
describe('the CLI against a running tollgate dev', () => {
  let child: ChildProcess | undefined;
  const dataDir = dataDirFor('tollgate-dev-http-', () => [child]);
  const baseEnv = devEnv(dataDir);

  function tollgate(env: Record<string, string>, ...args: string[]) {
    const run = spawnSync(process.execPath, ['cmd/tollgate.ts', ...args], {
      env: { ...baseEnv, ...env },
      encoding: 'utf8',
      timeout: 60_000,
    });
    return { status: run.status, stdout: run.stdout, stderr: run.stderr, json: () => JSON.parse(run.stdout) };
  }

  it('prints the dashboard, a login and both variables; the CLI uses them; the database is locked', async () => {
    const dev = startDev({ ...baseEnv, PORT: '0' });
    child = dev.child;
    const out = await dev.ready;
    const url = /TOLLGATE_URL=(http:\/\/\S+)/.exec(out)?.[1];
    const token = /TOLLGATE_ADMIN_TOKEN=(\S+)/.exec(out)?.[1];
    const login = /sign in as\s+(\S+) \/ (\S+)/.exec(out);
    const projectId = /project:\s+(pw_\S+)/.exec(out)?.[1];
    expect(url, out).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/); // loopback unless HOST is set
    expect(out).toContain(`${url!.replace('127.0.0.1', 'localhost')}/dashboard`);
    expect(token).toBeTruthy();
    expect(login?.[1]).toBe('admin@localhost');

    // The printed login works.
    const session = await fetch(`${url}/admin/v1/sessions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ email: login![1], password: login![2] }),
    });
    expect(session.status).toBe(201);

    const remote = { TOLLGATE_URL: url!, TOLLGATE_ADMIN_TOKEN: token! };
    const listed = tollgate(remote, 'project', 'list', '--json');
    expect(listed.status, listed.stderr).toBe(0);
    expect(listed.json().map((p: { id: string }) => p.id)).toContain(projectId);

    const deposited = tollgate(
      remote,
      'users',
      'deposit',
      '--project',
      projectId!,
      '--user',
      'demo-user',
      '--amount',
      '1.00',
      '--json',
    );
    expect(deposited.status, deposited.stderr).toBe(0);
    expect(deposited.json().balance).toBe('11.00');
    // The server sees the same balance (one database, one process).
    const balance = await fetch(`${url}/admin/v1/projects/${projectId}/users/demo-user`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(((await balance.json()) as { balance: string }).balance).toBe('11.00');
    // and the CLI shows it over the admin API, as on the database
    const shown = tollgate(remote, 'users', 'show', '--project', projectId!, '--user', 'demo-user', '--json');
    expect(shown.status, shown.stderr).toBe(0);
    expect(shown.json()).toMatchObject({
      user: 'demo-user',
      connected: true,
      balance: '11.00',
      held: '0.00',
    });
    const users = tollgate(remote, 'users', 'list', '--project', projectId!, '--search', 'demo');
    expect(users.status, users.stderr).toBe(0);
    expect(users.stdout).toMatch(/^demo-user {2}connected {2}balance 11\.00/m);

    const created = tollgate(remote, 'project', 'create', '--name', 'Over HTTP', '--json');
    expect(created.status, created.stderr).toBe(0);
    const applied = tollgate(
      remote,
      'models',
      'apply',
      '--project',
      created.json().id,
      '--file',
      'examples/pricing.yaml',
      '--json',
    );
    expect(applied.status, applied.stderr).toBe(0);
    expect(applied.json().created).toContain('gpt-4o-mini');
    const models = await fetch(`${url}/v1/models`, {
      headers: { authorization: `Bearer ${created.json().apiKey}` },
    });
    expect(models.status).toBe(200);

    const badToken = tollgate({ ...remote, TOLLGATE_ADMIN_TOKEN: 'x'.repeat(30) }, 'project', 'list');
    expect(badToken.status).toBe(1);
    expect(badToken.stderr).toMatch(/admin token/i);

    // Straight to the database while dev runs: refused, one line naming the dev process.
    const direct = tollgate({}, 'project', 'list');
    expect(direct.status).toBe(1);
    expect(direct.stderr.trim().split('\n')).toHaveLength(1);
    expect(direct.stderr).toContain(`in use by process ${child.pid}`);
    expect(direct.stderr).toContain(`TOLLGATE_URL=${url}`);

    const exited = new Promise<number | null>((resolve) => child!.once('exit', resolve));
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    child = undefined;
    // Once dev has stopped, the database is free again.
    const after = tollgate({}, 'project', 'list', '--json');
    expect(after.status, after.stderr).toBe(0);
  }, 180_000);
});
