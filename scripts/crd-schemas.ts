/**
 * Writes the schemas of the CRDs that are generated from zod (src/operator/crd-schema.ts) into crds/
 * (the chart's crds/ is a link to it): the PriceList's `spec.currency` and `spec.models`, from the
 * pricing file's schema, and the LimitPolicy's `spec.project`, `key`, `user` and `spend`, from its
 * `limits`. `--check` writes nothing and fails when a file differs (the test
 * test/operator/operator-crd-schema.test.ts does the same).
 *
 *   node scripts/crd-schemas.ts [--check]
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import { limitPolicySchemas, priceListSchemas, type Schema } from '../src/operator/crd-schema.ts';

const root = join(import.meta.dirname, '..');
export const SPEC_PATH = [
  'spec',
  'versions',
  0,
  'schema',
  'openAPIV3Schema',
  'properties',
  'spec',
  'properties',
];

/** Each generated CRD: its file, the fields of its `spec` written from zod, and where they come from. */
export const GENERATED_CRDS = [
  {
    kind: 'PriceList',
    file: join(root, 'crds/pricelists.tollgate.dev.yaml'),
    schemas: priceListSchemas,
    source: "the pricing file's schema",
  },
  {
    kind: 'LimitPolicy',
    file: join(root, 'crds/limitpolicies.tollgate.dev.yaml'),
    schemas: limitPolicySchemas,
    source: "the pricing file's limits",
  },
] as const satisfies ReadonlyArray<{
  kind: string;
  file: string;
  schemas: () => Record<string, Schema>;
  source: string;
}>;

/** The CRD file's text with the generated schemas in place. */
export function generatedCrd(text: string, schemas: Record<string, Schema>): string {
  const doc = parseDocument(text);
  for (const [field, schema] of Object.entries(schemas)) {
    const current = doc.getIn([...SPEC_PATH, field]) as { toJSON(): Record<string, unknown> } | undefined;
    // What the CRD says beside the schema (its description for `kubectl explain`) stays unless the
    // schema describes the field itself.
    const description = schema.description === undefined ? current?.toJSON().description : undefined;
    doc.setIn([...SPEC_PATH, field], doc.createNode(description ? { description, ...schema } : schema));
  }
  return doc.toString({ lineWidth: 0 });
}

if (process.argv[1] === import.meta.filename) {
  let differs = false;
  for (const crd of GENERATED_CRDS) {
    const text = readFileSync(crd.file, 'utf8');
    const generated = generatedCrd(text, crd.schemas());
    if (generated === text) continue;
    if (process.argv.includes('--check')) {
      console.error(`${crd.file} differs from ${crd.source}: run node scripts/crd-schemas.ts`);
      differs = true;
    } else {
      writeFileSync(crd.file, generated);
      console.log(`wrote ${crd.file}`);
    }
  }
  if (differs) process.exit(1);
}
