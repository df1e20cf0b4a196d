import { z } from 'zod';
import { PRICE_SCALE, priceSchema } from '../core/money.ts';
import { holdMarginSchema } from '../models/hold-margin.ts';
import { ENDPOINTS, limitsSchema, pricingFileSchema } from '../models/pricing.ts';

/**
 * A CRD's openAPIV3Schema from a zod schema (`z.toJSONSchema`, the accepted input), made structural as
 * the API server requires: every node typed, no `additionalProperties: false` beside `properties` (the
 * API server prunes unknown fields; kubectl's field validation names them), `const` as a one-value
 * `enum`, and a discriminated union of objects as one object whose per-variant fields are CEL rules
 * (`x-kubernetes-validations`). A scalar JSON Schema cannot state as Kubernetes holds it (a decimal
 * string that zod also takes as a number) is given in `scalars`. Used by scripts/crd-schemas.ts to write
 * the CRDs and by the test that compares them.
 */

export type Schema = Record<string, unknown>;

/** A decimal string, checked at the API server: a price. */
const PRICE: Schema = {
  type: 'string',
  maxLength: 40,
  pattern: `^(0|[1-9][0-9]*)(\\.[0-9]{1,${PRICE_SCALE}})?$`,
  'x-kubernetes-validations': [
    {
      rule: "self.matches('^[0-9]+(\\\\.[0-9]+)?$')",
      message: 'must be a decimal string such as "0.15" (no sign, no exponent)',
    },
  ],
};

/** The hold margin, a decimal multiplier as a string (1 to 10, checked by the operator). */
const HOLD_MARGIN: Schema = { type: 'string', maxLength: 6, pattern: '^[0-9]{1,2}(\\.[0-9]{1,3})?$' };

/**
 * `spec.currency` and `spec.models` of the PriceList CRD (crds/pricelists.tollgate.dev.yaml): the
 * pricing file's schema (src/models/pricing.ts), prices as decimal strings, and what a CRD adds — the
 * models a list keyed by id with a bound (the API server's CEL cost), the endpoints a set.
 */
export function priceListSchemas(): { currency: Schema; models: Schema } {
  const scalars = new Map<z.ZodType, Schema>([
    [priceSchema, PRICE],
    [holdMarginSchema, HOLD_MARGIN],
  ]);
  const shape = pricingFileSchema.shape;
  const models = structuralSchema(shape.models, { scalars });
  const item = models.items as Schema & { properties: Record<string, Schema> };
  const endpoints = item.properties.endpoints!;
  item.properties.endpoints = { ...endpoints, maxItems: ENDPOINTS.length, 'x-kubernetes-list-type': 'set' };
  return {
    currency: structuralSchema(shape.currency),
    models: {
      ...models,
      maxItems: 500,
      'x-kubernetes-list-type': 'map',
      'x-kubernetes-list-map-keys': ['id'],
    },
  };
}

/**
 * `spec.project`, `spec.key`, `spec.user` and `spec.spend` of the LimitPolicy CRD
 * (crds/limitpolicies.tollgate.dev.yaml): the pricing file's `limits` (src/models/pricing.ts), caps as
 * decimal strings.
 */
export function limitPolicySchemas(): Record<string, Schema> {
  const scalars = new Map<z.ZodType, Schema>([[priceSchema, PRICE]]);
  return Object.fromEntries(
    Object.entries(limitsSchema.shape).map(([field, schema]) => [
      field,
      structuralSchema(schema, { scalars }),
    ]),
  );
}

export interface StructuralOptions {
  /** The schema of these zod schemas, as given (e.g. a price: a string with its pattern). */
  scalars?: Map<z.ZodType, Schema>;
}

const KEPT = [
  'description',
  'minLength',
  'maxLength',
  'pattern',
  'enum',
  'minimum',
  'maximum',
  'exclusiveMinimum',
  'exclusiveMaximum',
  'minItems',
  'maxItems',
] as const;

export function structuralSchema(schema: z.ZodType, opts: StructuralOptions = {}): Schema {
  // By definition: `.describe()` and `.optional()` of a scalar wrap or clone it, with the same definition.
  const scalars = new Map([...(opts.scalars ?? [])].map(([s, given]) => [s._zod.def, given]));
  const json = z.toJSONSchema(schema, {
    io: 'input',
    target: 'openapi-3.0',
    unrepresentable: 'throw',
    override: (ctx) => {
      const given = scalars.get(ctx.zodSchema._zod.def as z.ZodType['_zod']['def']);
      if (!given) return;
      const { description } = ctx.jsonSchema as Schema;
      for (const key of Object.keys(ctx.jsonSchema)) delete (ctx.jsonSchema as Schema)[key];
      Object.assign(ctx.jsonSchema, structuredClone(given), description ? { description } : {}, {
        'x-scalar': true,
      });
    },
  }) as Schema;
  return convert(json, '');
}

function convert(node: Schema, path: string): Schema {
  if (node['x-scalar']) {
    const { 'x-scalar': _given, ...given } = node;
    return given;
  }
  const variants = (node.oneOf ?? node.anyOf) as Schema[] | undefined;
  if (variants) return union(variants, node, path);
  const out: Schema = {};
  if (node.const !== undefined) {
    out.type = typeof node.const === 'string' ? 'string' : node.type;
    out.enum = [node.const];
  } else out.type = node.type;
  if (typeof out.type !== 'string')
    throw new Error(`${path || 'root'}: no single type in ${JSON.stringify(node)}`);
  for (const key of KEPT) if (node[key] !== undefined && out[key] === undefined) out[key] = node[key];
  if (out.type === 'object') {
    const properties = (node.properties ?? {}) as Record<string, Schema>;
    if (Array.isArray(node.required) && node.required.length) out.required = node.required;
    if (Object.keys(properties).length)
      out.properties = Object.fromEntries(
        Object.entries(properties).map(([name, sub]) => [name, convert(sub, `${path}.${name}`)]),
      );
    else if (typeof node.additionalProperties === 'object')
      out.additionalProperties = convert(node.additionalProperties as Schema, `${path}[*]`);
  }
  if (out.type === 'array') out.items = convert(node.items as Schema, `${path}[]`);
  return out;
}

/**
 * A union of objects told apart by one field (`mode: per_token`…): one object with every variant's
 * fields, the discriminator required, and CEL rules for the rest — each variant's required fields, and
 * each field only where its variants allow it.
 */
function union(variants: Schema[], node: Schema, path: string): Schema {
  const objects = variants.map((v, i) => convert(v, `${path}|${i}`));
  if (objects.some((o) => o.type !== 'object'))
    throw new Error(`${path || 'root'}: a union of other than objects (give it in scalars)`);
  const props = objects.map((o) => (o.properties ?? {}) as Record<string, Schema>);
  const key = Object.keys(props[0]!).find((k) =>
    props.every((p) => Array.isArray(p[k]?.enum) && (p[k]!.enum as unknown[]).length === 1),
  );
  if (!key) throw new Error(`${path || 'root'}: a union of objects with no discriminator`);
  const tagOf = (p: Record<string, Schema>) => (p[key]!.enum as string[])[0]!;
  const properties: Record<string, Schema> = {
    [key]: { type: 'string', enum: props.map(tagOf) },
  };
  for (const p of props)
    for (const [name, sub] of Object.entries(p)) {
      if (name === key) continue;
      if (properties[name] && JSON.stringify(properties[name]) !== JSON.stringify(sub))
        throw new Error(`${path}.${name}: differs between the variants`);
      properties[name] = sub;
    }
  const rules: Array<{ rule: string; message: string }> = [];
  objects.forEach((o, i) => {
    const needed = ((o.required ?? []) as string[]).filter((r) => r !== key);
    if (!needed.length) return;
    const has = needed.map((r) => `has(self.${r})`).join(' && ');
    rules.push({
      rule: `self.${key} != '${tagOf(props[i]!)}' || ${needed.length > 1 ? `(${has})` : has}`,
      message: `${tagOf(props[i]!)} ${key} needs ${needed.join(' and ')}`,
    });
  });
  for (const name of Object.keys(properties)) {
    const allowed = props.filter((p) => name in p).map(tagOf);
    if (allowed.length === props.length) continue;
    rules.push({
      rule: `${allowed.map((t) => `self.${key} == '${t}'`).join(' || ')} || !has(self.${name})`,
      message: `${name} is for ${allowed.join(', ')} ${key} only`,
    });
  }
  return {
    type: 'object',
    ...(node.description ? { description: node.description } : {}),
    required: [key],
    properties,
    'x-kubernetes-validations': rules,
  };
}
