/**
 * Writes the schemas of the CRDs that are generated from zod (src/operator/crd-schema.ts) into crds/
 * (the chart's crds/ is a link to it): the PriceList's `spec.currency` and `spec.models`, from the
 * pricing file's schema. `--check` writes nothing and fails when a file differs (the test
 * test/operator/operator-crd-schema.test.ts does the same).
 *
 *   node scripts/crd-schemas.ts [--check]
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import { priceListSchemas } from '../src/operator/crd-schema.ts';

const root = join(import.meta.dirname, '..');
export const PRICELIST_CRD = join(root, 'crds/pricelists.tollgate.dev.yaml');
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

/** The CRD file's text with the generated schemas in place. */
export function generatedPriceListCrd(text: string): string {
  const doc = parseDocument(text);
  for (const [field, schema] of Object.entries(priceListSchemas())) {
    const current = doc.getIn([...SPEC_PATH, field]) as { toJSON(): Record<string, unknown> } | undefined;
    // What the CRD says beside the schema (its description for `kubectl explain`) stays.
    const description = current?.toJSON().description;
    doc.setIn([...SPEC_PATH, field], doc.createNode(description ? { description, ...schema } : schema));
  }
  return doc.toString({ lineWidth: 0 });
}

if (process.argv[1] === import.meta.filename) {
  const text = readFileSync(PRICELIST_CRD, 'utf8');
  const generated = generatedPriceListCrd(text);
  if (process.argv.includes('--check')) {
    if (generated !== text) {
      console.error(
        `${PRICELIST_CRD} differs from the pricing file's schema: run node scripts/crd-schemas.ts`,
      );
      process.exit(1);
    }
  } else if (generated !== text) {
    writeFileSync(PRICELIST_CRD, generated);
    console.log(`wrote ${PRICELIST_CRD}`);
  }
}
