import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { GENERATED_CRDS, generatedCrd, SPEC_PATH } from '../../scripts/crd-schemas.ts';
import { limitsSchema, pricingFileSchema } from '../../src/models/pricing.ts';
import { ALL_CRD_FILES, FakeKubeApiServer } from '../helpers/fake-kube-apiserver.ts';

/**
 * The PriceList CRD's `spec.currency` and `spec.models` are the pricing file's zod schema
 * (src/models/pricing.ts) made structural (src/operator/crd-schema.ts), and the LimitPolicy CRD's
 * `spec.project`, `key`, `user` and `spend` its `limits`: the files in crds/ (the chart's copy is a link
 * to them) are what scripts/crd-schemas.ts writes, and what a pricing file takes the API server takes
 * in a PriceList or a LimitPolicy — holdMargin included.
 */

const [priceList, limitPolicy] = GENERATED_CRDS;
const text = readFileSync(priceList.file, 'utf8');

describe.each(GENERATED_CRDS)('the $kind CRD', (crd) => {
  it(`is ${crd.source} as scripts/crd-schemas.ts writes it (run it after changing the schema)`, () => {
    const file = readFileSync(crd.file, 'utf8');
    const generated = crd.schemas();
    expect(file).toBe(generatedCrd(file, generated));
    const spec = SPEC_PATH.reduce<any>((node, key) => node[key], parse(file));
    for (const [field, schema] of Object.entries(generated)) expect(spec[field], field).toMatchObject(schema);
  });
});

describe('the PriceList CRD', () => {
  it('has every field of every pricing mode of the pricing file', () => {
    const spec = SPEC_PATH.reduce<any>((node, key) => node[key], parse(text));
    const pricing = spec.models.items.properties.pricing.properties;
    const fields = pricingFileSchema.shape.models.element.shape.pricing.options.flatMap((o) =>
      Object.keys(o.shape),
    );
    expect(fields).toContain('holdMargin');
    for (const field of fields) expect(pricing, field).toHaveProperty(field);
  });

  it('lets the API server take what the pricing file takes, and refuse what it refuses', async () => {
    const fake = new FakeKubeApiServer({ crdFiles: ALL_CRD_FILES, cel: true });
    const url = await fake.start();
    const create = async (pricing: Record<string, unknown>) => {
      const spec = { currency: 'usd', models: [{ id: 'm', pricing }] };
      const status = await dryRunCreate(url, 'pricelists', 'PriceList', spec);
      return { status, file: pricingFileSchema.safeParse(spec).success };
    };
    try {
      for (const pricing of [
        { mode: 'per_token', inputPerMillion: '3', holdMargin: '1.25' },
        { mode: 'per_token', inputPerMillion: '3', cacheWrite1hPerMillion: '6', outputPerMillion: '15' },
        { mode: 'per_request', perRequest: '0.01' },
        { mode: 'subscription', fee: '10', period: '30d' },
      ])
        expect(await create(pricing), JSON.stringify(pricing)).toEqual({ status: 201, file: true });
      for (const pricing of [
        { mode: 'per_request', perRequest: '0.01', holdMargin: '1.5' },
        { mode: 'per_token', inputPerMillion: '3', holdMargin: '1.2345' },
        { mode: 'per_token', inputPerMillion: '-3' },
        { mode: 'subscription', fee: '10' },
      ])
        expect(await create(pricing), JSON.stringify(pricing)).toEqual({ status: 422, file: false });
    } finally {
      await fake.stop();
    }
  });
});

describe('the LimitPolicy CRD', () => {
  it('lets the API server take what the pricing file takes as limits, and refuse what it refuses', async () => {
    expect(limitPolicy.kind).toBe('LimitPolicy');
    const fake = new FakeKubeApiServer({ crdFiles: ALL_CRD_FILES, cel: true });
    const url = await fake.start();
    const create = async (limits: Record<string, unknown>) => ({
      status: await dryRunCreate(url, 'limitpolicies', 'LimitPolicy', limits),
      file: limitsSchema.safeParse(limits).success,
    });
    try {
      for (const limits of [
        { project: { rpm: 600, tpm: 1_000_000 }, key: { rpm: 60 }, user: { tpm: 5000 } },
        { spend: { daily: '5', monthly: '100.50' } },
        {},
      ])
        expect(await create(limits), JSON.stringify(limits)).toEqual({ status: 201, file: true });
      for (const limits of [
        { project: { rpm: 0 } },
        { user: { tpm: 1.5 } },
        { key: { rpm: 2_000_000_000 } },
        { spend: { daily: '-5' } },
        { spend: { monthly: '1e3' } },
      ])
        expect(await create(limits), JSON.stringify(limits)).toEqual({ status: 422, file: false });
    } finally {
      await fake.stop();
    }
  });
});

/** The API server's answer to creating a resource of the project `acme` with `spec` (a dry run). */
async function dryRunCreate(url: string, plural: string, kind: string, spec: Record<string, unknown>) {
  const res = await fetch(`${url}/apis/tollgate.dev/v1alpha1/namespaces/default/${plural}?dryRun=All`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      apiVersion: 'tollgate.dev/v1alpha1',
      kind,
      metadata: { name: 'r' },
      spec: { projectRef: { name: 'acme' }, ...spec },
    }),
  });
  await res.arrayBuffer();
  return res.status;
}
