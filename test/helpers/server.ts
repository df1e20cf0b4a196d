import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll } from 'vitest';
import type { AppContext } from '../../src/app/context.ts';
import { recordEverything } from '../../src/events/outbox.ts';
import { buildServer } from '../../src/http/server.ts';
import type { ModelSpec } from '../../src/models/pricing.ts';
import { applyPricing } from '../../src/models/service.ts';
import { type CreateProjectInput, createProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { createTestContext, newTestId } from './context.ts';

export interface TestServer {
  ctx: AppContext;
  app: FastifyInstance;
  /** e.g. http://127.0.0.1:41234 */
  url: string;
  close(): Promise<void>;
}

/** Starts the real HTTP server on an ephemeral loopback port with a fresh test context. */
export async function startTestServer(
  env: Record<string, string> = {},
  shared: { id?: string } = {},
): Promise<TestServer> {
  const ctx = await createTestContext(env, shared);
  const app = await buildServer(ctx);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as { port: number };
  if (!env.PUBLIC_BASE_URL) ctx.publicBaseUrl = `http://127.0.0.1:${port}`;
  return {
    ctx,
    app,
    url: `http://127.0.0.1:${port}`,
    async close() {
      await app.close();
      await ctx.close();
    },
  };
}

/** `count` servers on one schema and one set of bus channels: the pods of one deployment. */
export async function startPods(env: Record<string, string>, count: number): Promise<TestServer[]> {
  const shared = { id: newTestId() };
  const pods: TestServer[] = [];
  for (let i = 0; i < count; i++) pods.push(await startTestServer(env, shared));
  return pods;
}

/** startTestServer whose outbox records every event, whatever the project's webhook subscriptions. */
export async function startRecordingServer(env: Record<string, string> = {}): Promise<TestServer> {
  const server = await startTestServer(env);
  server.ctx.events.filter = recordEverything;
  return server;
}

/**
 * A recording server for the tests of one file: started (with `env`) before them and closed after them.
 * `seed` gets it once started, to keep it and make the file's projects.
 */
export function withRecordingServer(
  seed: (server: TestServer) => Promise<void>,
  env: Record<string, string> = {},
): void {
  let server: TestServer | undefined;
  beforeAll(async () => {
    server = await startRecordingServer(env);
    await seed(server);
  });
  afterAll(() => server?.close());
}

/** What a test does is recorded as done by `test`. */
export const testTrigger = { source: 'test', actorType: 'test', actorId: 'test' };

/** Connects end user `user` to a seeded project (as the hosted connect page does). */
export async function connectTo(
  server: { ctx: AppContext },
  project: Pick<SeededProject, 'projectId'>,
  user: string,
  owner = 'o',
): Promise<void> {
  await connectUser(
    server.ctx.db,
    server.ctx.events,
    { id: project.projectId, owner_user_id: owner },
    user,
    testTrigger,
  );
}

/** Deposits `amount` for end user `user`, as done by `trigger` (source: the trigger's, unless given). */
export async function depositFor(
  ctx: AppContext,
  project: Parameters<AppContext['billing']['deposit']>[0]['project'],
  user: string,
  amount: string,
  trigger = testTrigger,
  source = trigger.source,
): Promise<void> {
  await ctx.billing.deposit({ project, externalId: user, amount, source, trigger });
}

/** Seeds a project (no models) and connects `users` to it. */
export async function seedProjectWithUsers(
  server: { ctx: AppContext },
  users: string[],
): Promise<SeededProject> {
  const seeded = await seedProject(server.ctx);
  for (const user of users) await connectTo(server, seeded, user);
  return seeded;
}

/** The envelopes of a project's events of one type, oldest first. */
export async function eventsOfType(ctx: AppContext, projectId: string, type: string): Promise<any[]> {
  const rows = await ctx.db
    .selectFrom('events')
    .select('envelope')
    .where('project_id', '=', projectId)
    .where('type', '=', type)
    .orderBy('seq')
    .execute();
  return rows.map((r) => r.envelope);
}

export interface SeededProject {
  projectId: string;
  apiKey: string;
  apiKeyId: string;
}

/**
 * The hold margin seeded per-token models get unless they set one (or `familyMargins` is passed): the
 * mock upstream's names (`mock-model`, …) belong to no tokenizer family, whose default (the largest
 * measured, 1.9) would change every hold the tests compute; they were written against 1.1, the o200k
 * family's margin, which `promptTokensUpperBound` still uses when given none. test/billing/hold-margin.test.ts
 * covers the family defaults.
 */
export const TEST_HOLD_MARGIN = '1.1';

function withTestHoldMargin(spec: ModelSpec): ModelSpec {
  if (spec.pricing.mode !== 'per_token' || spec.pricing.holdMargin !== undefined) return spec;
  return { ...spec, pricing: { ...spec.pricing, holdMargin: TEST_HOLD_MARGIN } };
}

/** Creates a project with a key and, optionally, models. */
export async function seedProject(
  ctx: AppContext,
  input: Partial<CreateProjectInput> & { models?: ModelSpec[]; familyMargins?: boolean } = {},
): Promise<SeededProject> {
  const { models, familyMargins, ...project } = input;
  const created = await createProject(ctx.db, ctx.sealer, {
    name: 'Test project',
    currency: 'usd',
    ...project,
  });
  if (models?.length) {
    const specs = familyMargins ? models : models.map(withTestHoldMargin);
    await applyPricing(ctx.db, created.project.id, { currency: created.project.currency, models: specs });
    await ctx.projects.changed(created.project.id);
  }
  return { projectId: created.project.id, apiKey: created.apiKey, apiKeyId: created.apiKeyId };
}

/** fetch with the project's key; JSON body when given. */
export async function api(
  server: TestServer,
  apiKey: string | undefined,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(server.url + path, {
    method,
    headers: {
      ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
      ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...headers,
    },
    ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {}
  return { status: res.status, body: parsed, headers: res.headers };
}

/** Signs a developer up and in over the admin API (sign-up starts no session); the session token. */
export async function signUpAndIn(
  server: TestServer,
  credentials: { email: string; password: string; invite?: string },
  bearer?: string,
): Promise<string> {
  const signUp = await api(server, bearer, 'POST', '/admin/v1/developers', credentials);
  if (signUp.status !== 202)
    throw new Error(`sign-up answered ${signUp.status}: ${JSON.stringify(signUp.body)}`);
  const { invite: _invite, ...signIn } = credentials;
  const session = await api(server, undefined, 'POST', '/admin/v1/sessions', signIn);
  if (session.status !== 201)
    throw new Error(`sign-in answered ${session.status}: ${JSON.stringify(session.body)}`);
  return session.body.session.token as string;
}

/**
 * The `tollgate` CLI as a child process against a running server, over its admin API with `token` (no
 * database or key of its own); resolves its output, rejects when it exits with an error.
 */
export function adminCli(
  url: string,
  token: string,
  args: string[],
): Promise<{ stdout: string; stderr: string }> {
  const env = {
    ...process.env,
    TOLLGATE_URL: url,
    TOLLGATE_ADMIN_TOKEN: token,
    DATABASE_URL: '',
    TOLLGATE_ENCRYPTION_KEY: '',
    LOG_LEVEL: 'silent',
  };
  return promisify(execFile)(process.execPath, ['cmd/tollgate.ts', ...args], { env, timeout: 30_000 });
}
