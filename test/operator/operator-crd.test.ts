import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { GROUP, PLURAL, VERSION } from '../../src/operator/api.ts';
import { type KubeClients, makeClients } from '../../src/operator/runtime/kube.ts';
import { CRD_FILE, type KubeTarget, kubeTarget, type Schema } from '../helpers/fake-kube-apiserver.ts';

/**
 * The CustomResourceDefinition is valid structural OpenAPI, and the schema the API server applies from it
 * refuses what it can (served here by the fake API server, or a real cluster with KUBECONFIG).
 */

const crd = parse(readFileSync(CRD_FILE, 'utf8'));
const version = crd.spec.versions[0];
const schema: Schema = version.schema.openAPIV3Schema;

/** Violations of the structural-schema rules of apiextensions.k8s.io/v1. */
function structuralProblems(node: Schema, path: string, problems: string[]): void {
  const exempt = node['x-kubernetes-int-or-string'] || node['x-kubernetes-preserve-unknown-fields'];
  if (!node.type && !exempt) problems.push(`${path}: type is missing`);
  if (node.properties && node.additionalProperties)
    problems.push(`${path}: properties and additionalProperties together`);
  if (node.type === 'array' && !node.items) problems.push(`${path}: array without items`);
  if (node.type !== 'array' && node.items) problems.push(`${path}: items on a ${node.type}`);
  if (node.type !== 'object' && (node.properties || node.additionalProperties))
    problems.push(`${path}: properties on a ${node.type}`);
  for (const forbidden of [
    '$ref',
    'definitions',
    'dependencies',
    'patternProperties',
    'uniqueItems',
    'additionalItems',
  ])
    if (forbidden in node) problems.push(`${path}: ${forbidden} is not allowed`);
  const listType = node['x-kubernetes-list-type'];
  if (listType && node.type !== 'array') problems.push(`${path}: x-kubernetes-list-type on a ${node.type}`);
  if (listType === 'map') {
    const keys = node['x-kubernetes-list-map-keys'] ?? [];
    if (!keys.length) problems.push(`${path}: list-type map without list-map-keys`);
    for (const key of keys)
      if (!node.items?.required?.includes(key))
        problems.push(`${path}: map key ${key} is not required in items`);
  }
  if (listType === 'set' && node.items?.type === 'object') problems.push(`${path}: a set of objects`);
  for (const [name, sub] of Object.entries(node.properties ?? {}))
    structuralProblems(sub, `${path}.${name}`, problems);
  if (typeof node.additionalProperties === 'object')
    structuralProblems(node.additionalProperties, `${path}[*]`, problems);
  if (node.items) structuralProblems(node.items, `${path}[]`, problems);
}

describe('the CRD file', () => {
  it('declares the resource as specified', () => {
    expect(crd).toMatchObject({
      apiVersion: 'apiextensions.k8s.io/v1',
      kind: 'CustomResourceDefinition',
      metadata: { name: `${PLURAL}.${GROUP}` },
      spec: {
        group: GROUP,
        scope: 'Namespaced',
        names: { kind: 'WebhookSubscription', plural: PLURAL, shortNames: ['whsub'] },
      },
    });
    expect(crd.spec.versions).toHaveLength(1);
    expect(version).toMatchObject({
      name: VERSION,
      served: true,
      storage: true,
      subresources: { status: {} },
    });
    expect(version.additionalPrinterColumns.map((c: { name: string }) => c.name)).toEqual([
      'URL',
      'Active',
      'Ready',
      'Failures',
      'Age',
    ]);
  });

  it('has a structural schema', () => {
    const problems: string[] = [];
    structuralProblems(schema, 'openAPIV3Schema', problems);
    expect(problems).toEqual([]);
    // metadata may only be typed at the root; name/generateName are the only constraints allowed.
    expect(schema.properties?.metadata).toEqual({ type: 'object' });
  });

  it('validates what it can: required fields, url pattern, events, description, headers, the "*" rule', () => {
    const spec = schema.properties!.spec!;
    expect(spec.required).toEqual(['url', 'events']);
    expect(spec['x-kubernetes-validations']?.[1]?.rule).toBe('has(self.paywallId) != has(self.projectRef)');
    expect(spec.properties!.events).toMatchObject({ minItems: 1, 'x-kubernetes-list-type': 'set' });
    expect(spec.properties!.description).toMatchObject({ maxLength: 512 });
    expect(spec.properties!.customHeaders).toMatchObject({
      maxProperties: 10,
      additionalProperties: { type: 'string' },
    });
    expect(spec.properties!.active).toMatchObject({ type: 'boolean', default: true });
    expect(spec['x-kubernetes-validations']?.[0]?.rule).toBe(
      "!self.events.exists(e, e == '*') || size(self.events) == 1",
    );
    expect(spec.properties!.paywallId!['x-kubernetes-validations']?.[0]?.rule).toBe('self == oldSelf');
    const url = new RegExp(spec.properties!.url!.pattern as string);
    expect(url.test('https://hooks.example.com/a?b=c')).toBe(true);
    expect(url.test('ftp://hooks.example.com')).toBe(false);
    expect(url.test('https://user:pw@hooks.example.com')).toBe(false);
    const event = new RegExp(spec.properties!.events!.items!.pattern as string);
    for (const ok of ['*', 'balance.*', 'balance.deposit.created', 'updated'])
      expect(event.test(ok), ok).toBe(true);
    for (const bad of ['Balance', 'balance.', '.x', 'a.*.b', '**']) expect(event.test(bad), bad).toBe(false);
  });
});

describe('the API server applying the schema', () => {
  let target: KubeTarget;
  let kube: KubeClients;

  beforeAll(async () => {
    target = await kubeTarget('tg-crd');
    kube = makeClients(target.kubeConfig);
  });
  afterAll(async () => {
    await target?.close();
  });

  const create = (name: string, spec: Record<string, unknown>) =>
    kube.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: target.namespace,
      plural: PLURAL,
      body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'WebhookSubscription', metadata: { name }, spec },
    }) as Promise<{ spec: Record<string, unknown>; metadata: { generation: number } }>;

  const valid = { paywallId: 'pw_1', url: 'https://hooks.example.com/x', events: ['balance.*'] };

  it('defaults active and secretRef.key and prunes unknown fields', async () => {
    const created = await create('defaults', { ...valid, secretRef: { name: 's' }, surprise: 1 });
    expect(created.spec).toMatchObject({ active: true, secretRef: { name: 's', key: 'secret' } });
    expect(created.spec).not.toHaveProperty('surprise');
    expect(created.metadata.generation).toBe(1);
  });

  it.each([
    ['a missing url', { paywallId: 'pw_1', events: ['*'] }],
    ['a non-http url', { ...valid, url: 'ftp://x' }],
    ['no events', { ...valid, events: [] }],
    ['a malformed event', { ...valid, events: ['Balance'] }],
    ['a duplicate event', { ...valid, events: ['a', 'a'] }],
    ['a long description', { ...valid, description: 'x'.repeat(513) }],
    [
      '11 headers',
      { ...valid, customHeaders: Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`X-${i}`, 'v'])) },
    ],
  ])('refuses %s with 422', async (_what, spec) => {
    await expect(create(`bad-${Math.random().toString(36).slice(2, 8)}`, spec)).rejects.toMatchObject({
      code: 422,
    });
  });

  it('accepts the examples', async () => {
    const docs = parseAllDocuments(
      readFileSync(new URL('../../examples/webhooksubscription.yaml', import.meta.url), 'utf8'),
    );
    const resources = docs.map((d) => d.toJS()).filter((d) => d.kind === 'WebhookSubscription');
    expect(resources).toHaveLength(2);
    for (const r of resources) {
      const created = await create(r.metadata.name, r.spec);
      expect(created.spec.paywallId).toBe(r.spec.paywallId);
    }
  });
});
