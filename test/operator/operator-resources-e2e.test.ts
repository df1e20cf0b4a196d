import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { Money } from '../../src/core/money.ts';
import { GROUP, VERSION } from '../../src/operator/api.ts';
import type { RunningOperator } from '../../src/operator/replica.ts';
import { type KubeClients, makeClients, mergePatch } from '../../src/operator/runtime/kube.ts';
import type { Resource } from '../../src/operator/status.ts';
import { getProject } from '../../src/projects/service.ts';
import { connectUser } from '../../src/users/service.ts';
import { ALL_CRD_FILES, type KubeTarget, kubeTarget } from '../helpers/fake-kube-apiserver.ts';
import { type MockUpstream, startMockUpstream } from '../helpers/mock-upstream.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { operatorEnv, PLURALS, startLeadingOperator } from './fixture.ts';

/**
 * The example set of examples/k8s/ applied to the fake API server (CRD schemas and CEL rules applied) with
 * the operator running; then paid chat with the official `openai` client, on a real Tollgate server on an
 * ephemeral loopback port, with the API key read from the Secret the operator wrote, against the loopback
 * provider. The charges are the declared prices; a price edited in the resource changes the next charge.
 */

const EXAMPLES = new URL('../../examples/k8s/', import.meta.url);

const ADMIN_TOKEN = 'e2e-admin-token-0123456789abcdef';
let target: KubeTarget;
let server: TestServer;
let upstream: MockUpstream;
let kube: KubeClients;
let operator: RunningOperator;
let ns: string;
let applied: Resource[] = [];

/** The documents of the kustomization, in its order. */
function exampleDocuments(): Array<Resource & Record<string, unknown>> {
  const kustomization = parse(readFileSync(new URL('kustomization.yaml', EXAMPLES), 'utf8')) as {
    resources: string[];
  };
  return kustomization.resources.flatMap((file) =>
    parseAllDocuments(readFileSync(new URL(file, EXAMPLES), 'utf8')).map((d) => d.toJS()),
  );
}

beforeAll(async () => {
  target = await kubeTarget('tg-examples', { crdFiles: ALL_CRD_FILES, cel: true });
  ns = target.namespace;
  upstream = await startMockUpstream();
  server = await startTestServer({
    TOLLGATE_ADMIN_TOKEN: ADMIN_TOKEN,
    ...operatorEnv(ns),
  });
  kube = makeClients(target.kubeConfig);
  operator = await startLeadingOperator(server.ctx, target, kube, 'operator-e2e');
});

afterAll(async () => {
  await operator?.shutdown(0);
  await server?.close();
  await upstream?.close();
  await target?.close();
});

const ready = (r: Resource | undefined) => r?.status?.conditions?.find((c) => c.type === 'Ready');

async function read(kind: string, name: string): Promise<Resource> {
  return (await kube.custom.getNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace: ns,
    plural: PLURALS[kind]!,
    name,
  })) as Resource;
}

/** The value of an additionalPrinterColumns JSONPath (the forms the CRDs use). */
function column(object: unknown, path: string): unknown {
  let value: unknown = object;
  for (const part of path.match(/\.[A-Za-z]+|\[\?\(@\.type=="[A-Za-z]+"\)\]/g) ?? []) {
    if (part.startsWith('[')) {
      const type = /"(.+)"/.exec(part)![1];
      value = (value as Array<{ type: string }> | undefined)?.find((c) => c.type === type);
    } else value = (value as Record<string, unknown> | undefined)?.[part.slice(1)];
  }
  return value;
}

describe('examples/k8s applied with the operator running', () => {
  it('every resource of the set becomes Ready, with useful columns', async () => {
    for (const doc of exampleDocuments()) {
      doc.metadata.namespace = ns;
      if (doc.kind === 'ModelProvider') (doc.spec as Record<string, unknown>).baseUrl = upstream.baseUrl;
      if (doc.kind === 'WebhookSubscription')
        (doc.spec as Record<string, unknown>).url = 'http://127.0.0.1:9/hooks';
      if (doc.kind === 'Secret')
        await kube.core.createNamespacedSecret({ namespace: ns, body: doc as never });
      else
        applied.push(
          (await kube.custom.createNamespacedCustomObject({
            group: GROUP,
            version: VERSION,
            namespace: ns,
            plural: PLURALS[doc.kind!]!,
            body: doc,
          })) as Resource,
        );
    }
    expect(applied.map((r) => r.kind).sort()).toEqual(Object.keys(PLURALS).sort());
    applied = await Promise.all(
      applied.map((r) =>
        target.until(async () => {
          const got = await read(r.kind!, r.metadata.name);
          return ready(got)?.status === 'True' && got.status?.observedGeneration === got.metadata.generation
            ? got
            : undefined;
        }, `${r.kind} ${r.metadata.name} to be Ready`),
      ),
    );
    // `kubectl get` columns: every one resolves on a Ready resource.
    for (const file of ALL_CRD_FILES) {
      const crd = parse(readFileSync(file, 'utf8'));
      const resource = applied.find((r) => r.kind === crd.spec.names.kind)!;
      for (const col of crd.spec.versions[0].additionalPrinterColumns)
        expect(column(resource, col.jsonPath), `${resource.kind} column ${col.name}`).not.toBeUndefined();
    }
  });

  let client: OpenAI;
  let projectId: string;
  const messages = [{ role: 'user' as const, content: 'Say hello' }];

  async function fund(user: string, amount: string) {
    const { ctx } = server;
    const project = await getProject(ctx.db, projectId);
    const trigger = { source: 'test', actorType: 'test', actorId: 'e2e' };
    await connectUser(ctx.db, ctx.events, project, user, trigger);
    await ctx.billing.deposit({ project, externalId: user, amount, source: 'test', trigger });
  }

  async function charges(user: string): Promise<string[]> {
    const { ctx } = server;
    await server.app.metering.idle();
    await ctx.billing.idle();
    const rows = await ctx.db
      .selectFrom('ledger_entries')
      .innerJoin('end_users', 'end_users.id', 'ledger_entries.user_id')
      .select('ledger_entries.amount')
      .where('end_users.project_id', '=', projectId)
      .where('end_users.external_id', '=', user)
      .where('ledger_entries.kind', '=', 'charge')
      .orderBy('ledger_entries.id')
      .execute();
    return rows.map((r) => new Money(r.amount).negated().toFixed());
  }

  it('serves paid chat with the key read from the Secret, at the declared prices', async () => {
    const secret = await kube.core.readNamespacedSecret({ name: 'acme-backend-api-key', namespace: ns });
    const apiKey = Buffer.from(secret.data!.apiKey!, 'base64').toString();
    projectId = Buffer.from(secret.data!.projectId!, 'base64').toString();
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });
    await fund('alice', '1.00');

    const reply = await client.chat.completions.create({ model: 'quick', user: 'alice', messages });
    expect(reply.choices[0]?.message.content).toBeTruthy();
    expect(await charges('alice')).toEqual(['0.01']); // perRequest: "0.01"

    const tokens = await client.chat.completions.create({ model: 'gpt-4o-mini', user: 'alice', messages });
    const usage = tokens.usage!;
    const expected = new Money(usage.prompt_tokens)
      .times('0.15')
      .plus(new Money(usage.completion_tokens).times('0.60'))
      .div(1_000_000)
      .toFixed();
    expect((await charges('alice'))[1]).toBe(expected);
  });

  it('charges the next request at a price edited in the PriceList', async () => {
    const list = await read('PriceList', 'acme-prices');
    const models = (list.spec as { models: Array<{ id: string; pricing: Record<string, string> }> }).models;
    const edited = models.map((m) =>
      m.id === 'quick' ? { ...m, pricing: { mode: 'per_request', perRequest: '0.03' } } : m,
    );
    const patched = (await kube.custom.patchNamespacedCustomObject(
      {
        group: GROUP,
        version: VERSION,
        namespace: ns,
        plural: 'pricelists',
        name: 'acme-prices',
        body: { spec: { models: edited } },
      },
      mergePatch,
    )) as Resource;
    await target.until(async () => {
      const got = await read('PriceList', 'acme-prices');
      return ready(got)?.status === 'True' && got.status?.observedGeneration === patched.metadata.generation;
    }, 'the edited price list to be applied');
    await client.chat.completions.create({ model: 'quick', user: 'alice', messages });
    expect((await charges('alice')).at(-1)).toBe('0.03');
  });

  it('answers the admin API a 409 naming the resource for the rows it manages', async () => {
    const res = await fetch(`${server.url}/admin/v1/projects/${projectId}/models`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        currency: 'usd',
        models: [{ id: 'quick', pricing: { mode: 'per_request', perRequest: '0' } }],
      }),
    });
    expect(res.status).toBe(409);
    expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: 'managed_by_resource',
      message: expect.stringContaining(`PriceList ${ns}/acme-prices`),
    });
  });

  it('refuses a malformed price in the PriceList at the API server, leaving the price as it was', async () => {
    const list = await read('PriceList', 'acme-prices');
    const models = (list.spec as { models: Array<{ id: string; pricing: Record<string, string> }> }).models;
    await expect(
      kube.custom.patchNamespacedCustomObject(
        {
          group: GROUP,
          version: VERSION,
          namespace: ns,
          plural: 'pricelists',
          name: 'acme-prices',
          body: {
            spec: {
              models: models.map((m) =>
                m.id === 'quick' ? { ...m, pricing: { mode: 'per_request', perRequest: '1e-2' } } : m,
              ),
            },
          },
        },
        mergePatch,
      ),
    ).rejects.toMatchObject({ code: 422 });
    await client.chat.completions.create({ model: 'quick', user: 'alice', messages });
    expect((await charges('alice')).at(-1)).toBe('0.03');
  });
});
