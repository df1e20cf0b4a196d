import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { evaluate, parse as parseCel } from '@marcbachmann/cel-js';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { pricingFileSchema } from '../../src/models/pricing.ts';
import { ALL_CRD_FILES, FakeKubeApiServer } from '../helpers/fake-kube-apiserver.ts';

/**
 * The CRDs of the deployment's kinds (crds/): structural, with the columns `kubectl get` shows; every CEL
 * rule parses and the price rules accept what Tollgate accepts and refuse the rest (a real CEL evaluator,
 * @marcbachmann/cel-js; Kubernetes' own runs only in a cluster); examples/k8s is valid against them.
 * The chart test (test/platform/helm-chart.test.ts) validates the CRD objects themselves against the
 * apiextensions.k8s.io/v1 schema.
 */

type Schema = Record<string, any>;
const crds = ALL_CRD_FILES.map((file) => ({ file: basename(file), crd: parse(readFileSync(file, 'utf8')) }));

function walk(node: Schema, path: string, visit: (node: Schema, path: string) => void): void {
  visit(node, path);
  for (const [name, sub] of Object.entries((node.properties ?? {}) as Record<string, Schema>))
    walk(sub, `${path}.${name}`, visit);
  if (node.items) walk(node.items, `${path}[]`, visit);
  if (typeof node.additionalProperties === 'object') walk(node.additionalProperties, `${path}[*]`, visit);
}

describe.each(crds)('$file', ({ file, crd }) => {
  const version = crd.spec.versions[0];
  const schema: Schema = version.schema.openAPIV3Schema;

  it('is a namespaced tollgate.dev/v1alpha1 kind with a status subresource, kept on uninstall', () => {
    expect(file).toBe(`${crd.spec.names.plural}.tollgate.dev.yaml`);
    expect(crd.metadata.name).toBe(`${crd.spec.names.plural}.tollgate.dev`);
    expect(crd.spec).toMatchObject({ group: 'tollgate.dev', scope: 'Namespaced' });
    expect(crd.spec.names.categories).toContain('tollgate');
    expect(version).toMatchObject({
      name: 'v1alpha1',
      served: true,
      storage: true,
      subresources: { status: {} },
    });
    expect(crd.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
  });

  it('is structural: every node typed, no properties beside additionalProperties, map lists keyed', () => {
    const problems: string[] = [];
    walk(schema, 'root', (node, path) => {
      if (!node.type && !node['x-kubernetes-preserve-unknown-fields']) problems.push(`${path}: no type`);
      if (node.properties && node.additionalProperties) problems.push(`${path}: both`);
      if (node['x-kubernetes-list-type'] === 'map')
        for (const key of node['x-kubernetes-list-map-keys'] ?? [])
          if (!node.items?.required?.includes(key)) problems.push(`${path}: map key ${key} not required`);
    });
    expect(problems).toEqual([]);
    expect(schema.properties.metadata).toEqual({ type: 'object' });
  });

  it('shows Ready, Reason and Age in kubectl get, and observedGeneration with conditions in status', () => {
    const names = version.additionalPrinterColumns.map((c: { name: string }) => c.name);
    expect(names).toEqual(expect.arrayContaining(['Ready', 'Age']));
    expect(schema.properties.status.properties).toHaveProperty('observedGeneration');
    expect(schema.properties.status.properties.conditions['x-kubernetes-list-map-keys']).toEqual(['type']);
  });

  it('has CEL rules that parse', () => {
    const rules: string[] = [];
    walk(schema, 'root', (node) => {
      for (const v of node['x-kubernetes-validations'] ?? []) rules.push(v.rule);
    });
    for (const rule of rules) expect(() => parseCel(rule), rule).not.toThrow();
  });
});

describe('the price rules', () => {
  const pricelist = crds.find((c) => c.crd.spec.names.kind === 'PriceList')!.crd;
  const pricing: Schema =
    pricelist.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.models.items.properties
      .pricing;
  const decimal = pricing.properties.perRequest;
  const rule = decimal['x-kubernetes-validations'][0].rule as string;

  it('uses the decimal rule of the issue', () => {
    expect(rule).toBe("self.matches('^[0-9]+(\\\\.[0-9]+)?$')");
  });

  it.each(['0', '0.15', '10.00', '2.000001', '1000'])('accepts %s, as Tollgate does', (v) => {
    expect(evaluate(rule, { self: v })).toBe(true);
    expect(new RegExp(decimal.pattern).test(v)).toBe(true);
    expect(
      pricingFileSchema.safeParse({
        currency: 'usd',
        models: [{ id: 'm', pricing: { mode: 'per_request', perRequest: v } }],
      }).success,
    ).toBe(true);
  });

  it.each(['-1', '1e-2', '0.1x', '.5', '1.', '', '0x10', '1,5'])('refuses %j, as Tollgate does', (v) => {
    expect(evaluate(rule, { self: v }) && new RegExp(decimal.pattern).test(v)).toBe(false);
    expect(
      pricingFileSchema.safeParse({
        currency: 'usd',
        models: [{ id: 'm', pricing: { mode: 'per_request', perRequest: v } }],
      }).success,
    ).toBe(false);
  });

  const modeRules = (pricing['x-kubernetes-validations'] as Array<{ rule: string }>).map((r) => r.rule);
  const passes = (self: Record<string, string | undefined>) =>
    modeRules.every((r) => evaluate(r, { self }) === true);

  it.each([
    { mode: 'per_request', perRequest: '0.01' },
    { mode: 'per_token', inputPerMillion: '0.15' },
    { mode: 'per_token', inputPerMillion: '0.15', outputPerMillion: '0.6', cachedInputPerMillion: '0.05' },
    { mode: 'per_token', inputPerMillion: '3', cacheWritePerMillion: '3.75', cacheWrite1hPerMillion: '6' },
    { mode: 'subscription', fee: '10', period: '30d' },
  ])('accepts the fields of its mode: %j', (self) => {
    expect(passes(self)).toBe(true);
  });

  it.each([
    { mode: 'per_request' },
    { mode: 'per_token', outputPerMillion: '1' },
    { mode: 'subscription', fee: '10' },
    { mode: 'per_request', perRequest: '1', fee: '1' },
    { mode: 'per_token', inputPerMillion: '1', perRequest: '1' },
    { mode: 'subscription', fee: '1', period: '1d', inputPerMillion: '1' },
    { mode: 'per_request', perRequest: '1', cacheWritePerMillion: '1' },
    { mode: 'subscription', fee: '1', period: '1d', cacheWrite1hPerMillion: '1' },
  ])('refuses fields missing or of another mode: %j', (self) => {
    expect(passes(self)).toBe(false);
  });
});

describe('examples/k8s', () => {
  it('is valid against the CRDs (schema and CEL rules) and pricing like examples/pricing.yaml', async () => {
    const fake = new FakeKubeApiServer({ crdFiles: ALL_CRD_FILES, cel: true });
    const url = await fake.start();
    try {
      const kustomization = parse(
        readFileSync(new URL('../../examples/k8s/kustomization.yaml', import.meta.url), 'utf8'),
      );
      let count = 0;
      for (const file of kustomization.resources as string[]) {
        for (const doc of parseAllDocuments(
          readFileSync(new URL(`../../examples/k8s/${file}`, import.meta.url), 'utf8'),
        )) {
          const object = doc.toJS();
          const plural =
            object.kind === 'Secret'
              ? 'secrets'
              : crds.find((c) => c.crd.spec.names.kind === object.kind)?.crd.spec.names.plural;
          expect(plural, object.kind).toBeDefined();
          const base = object.kind === 'Secret' ? '/api/v1' : '/apis/tollgate.dev/v1alpha1';
          const res = await fetch(
            `${url}${base}/namespaces/${object.metadata.namespace}/${plural}?dryRun=All`,
            {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify(object),
            },
          );
          expect(res.status, `${object.kind} ${object.metadata.name}: ${await res.text()}`).toBe(201);
          if (object.kind === 'PriceList') {
            const { projectRef: _ref, ...file } = object.spec;
            expect(pricingFileSchema.safeParse(file).success).toBe(true);
          }
          count++;
        }
      }
      expect(count).toBe(7);
    } finally {
      await fake.stop();
    }
  });
});
