/**
 * Validates Kubernetes manifests rendered by `helm template` (multi-document YAML files):
 * - every built-in kind against its OpenAPI schema (kubernetes-models: types, required fields, formats),
 * - no unknown field anywhere (the model attribute maps of @kubernetes/client-node), which the schemas
 *   alone let through,
 * - the ServiceMonitor and PrometheusRule (monitoring.coreos.com, not built-in kinds) against minimal
 *   schemas, and the rules with Prometheus' own `promtool check rules` where it is installed,
 * - the chart's own rules: hardened pods, probes, resources, recommended labels.
 * With `--config-coverage`, also that every Tollgate setting (src/config/index.ts) is reachable from the
 * chart's values and reaches a Tollgate container in the rendered manifests.
 *
 *   node scripts/validate-manifests.ts [--config-coverage] rendered.yaml...
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { isMap, isScalar, parse, parseAllDocuments, parseDocument } from 'yaml';
import { configSchema } from '../src/config/index.ts';

// biome-ignore lint/suspicious/noExplicitAny: parsed YAML documents of any shape
type Obj = Record<string, any>;

const root = join(import.meta.dirname, '..');
const errors: string[] = [];
const notes = new Set<string>();

function fail(where: string, message: string): void {
  errors.push(`${where}: ${message}`);
}

// ---- schema validation of built-in kinds (kubernetes-models) ----

async function validateSchema(doc: Obj, where: string): Promise<boolean> {
  const module = `kubernetes-models/${doc.apiVersion}/${doc.kind}`;
  let Model: { new (data: Obj): { validate(): void } } | undefined;
  try {
    Model = (await import(module))[doc.kind];
  } catch {}
  if (!Model) {
    fail(where, `unknown kind ${doc.apiVersion}/${doc.kind} (no schema in kubernetes-models)`);
    return false;
  }
  try {
    new Model(doc).validate();
  } catch (err) {
    fail(where, `schema: ${(err as Error).message}`);
  }
  return true;
}

// ---- unknown fields (client-node model attribute maps) ----

type AttributeMap = { baseName: string; type: string }[];
const models = k8s as unknown as Record<string, { getAttributeTypeMap?: () => AttributeMap } | undefined>;

function modelName(apiVersion: string, kind: string): string {
  const version = apiVersion.split('/').at(-1)!;
  return version.charAt(0).toUpperCase() + version.slice(1) + kind;
}

function checkFields(value: unknown, type: string, path: string, where: string): void {
  if (value === null || value === undefined) return;
  const array = /^Array<(.+)>$/.exec(type);
  if (array) {
    if (Array.isArray(value)) {
      for (const [i, v] of value.entries()) checkFields(v, array[1]!, `${path}[${i}]`, where);
    }
    return;
  }
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map) {
    if (typeof value === 'object') {
      for (const [k, v] of Object.entries(value as Obj)) checkFields(v, map[1]!, `${path}.${k}`, where);
    }
    return;
  }
  const model = models[type];
  if (!model?.getAttributeTypeMap || typeof value !== 'object' || Array.isArray(value)) return;
  const attributes = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  for (const [key, child] of Object.entries(value as Obj)) {
    const childType = attributes.get(key);
    if (childType === undefined) fail(where, `unknown field ${path}.${key}`);
    else checkFields(child, childType, `${path}.${key}`, where);
  }
}

// ---- ServiceMonitor: a minimal schema of monitoring.coreos.com/v1 ----

function validateServiceMonitor(doc: Obj, where: string): void {
  notes.add(
    'ServiceMonitor (monitoring.coreos.com/v1) is not a built-in kind: checked against a minimal schema',
  );
  const spec = doc.spec as Obj | undefined;
  const duration = /^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$/;
  if (doc.apiVersion !== 'monitoring.coreos.com/v1')
    fail(where, 'apiVersion must be monitoring.coreos.com/v1');
  if (!spec || typeof spec !== 'object') {
    fail(where, 'spec is required');
    return;
  }
  const known = ['selector', 'endpoints', 'namespaceSelector', 'jobLabel', 'targetLabels', 'podTargetLabels'];
  for (const key of Object.keys(spec)) if (!known.includes(key)) fail(where, `unknown field spec.${key}`);
  if (!spec.selector || typeof spec.selector !== 'object') fail(where, 'spec.selector is required');
  checkFields(spec.selector, 'V1LabelSelector', 'spec.selector', where);
  if (!Array.isArray(spec.endpoints) || spec.endpoints.length === 0) {
    fail(where, 'spec.endpoints must list at least one endpoint');
    return;
  }
  const endpointKeys = [
    'port',
    'targetPort',
    'path',
    'scheme',
    'interval',
    'scrapeTimeout',
    'honorLabels',
    'relabelings',
    'metricRelabelings',
  ];
  spec.endpoints.forEach((e: Obj, i: number) => {
    for (const key of Object.keys(e)) {
      if (!endpointKeys.includes(key)) fail(where, `unknown field spec.endpoints[${i}].${key}`);
    }
    if (typeof e.port !== 'string' && e.targetPort === undefined) {
      fail(where, `spec.endpoints[${i}] needs port (a Service port name) or targetPort`);
    }
    for (const key of ['interval', 'scrapeTimeout']) {
      if (e[key] !== undefined && (typeof e[key] !== 'string' || !duration.test(e[key]))) {
        fail(where, `spec.endpoints[${i}].${key} must be a duration such as 30s`);
      }
    }
    if (e.path !== undefined && (typeof e.path !== 'string' || !e.path.startsWith('/'))) {
      fail(where, `spec.endpoints[${i}].path must start with /`);
    }
  });
}

// ---- PrometheusRule: a minimal schema, then promtool ----

function validatePrometheusRule(doc: Obj, where: string): void {
  notes.add(
    'PrometheusRule (monitoring.coreos.com/v1) is not a built-in kind: checked against a minimal schema',
  );
  const groups = doc.spec?.groups;
  if (!Array.isArray(groups) || groups.length === 0) {
    fail(where, 'spec.groups must list at least one group');
    return;
  }
  for (const [i, group] of (groups as Obj[]).entries()) {
    if (typeof group.name !== 'string' || !Array.isArray(group.rules)) {
      fail(where, `spec.groups[${i}] needs a name and rules`);
      continue;
    }
    for (const [j, rule] of (group.rules as Obj[]).entries()) {
      const at = `spec.groups[${i}].rules[${j}]`;
      if (typeof rule.expr !== 'string' || !rule.expr.trim()) fail(where, `${at}.expr is required`);
      if ((typeof rule.alert === 'string') === (typeof rule.record === 'string')) {
        fail(where, `${at} needs exactly one of alert and record`);
      }
    }
  }
  const promtool = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  if (promtool.error) {
    notes.add('promtool is not installed: PrometheusRule expressions were not parsed');
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-rules-'));
  try {
    const file = join(dir, 'rules.json');
    writeFileSync(file, JSON.stringify({ groups }));
    const res = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
    if (res.status !== 0) fail(where, `promtool check rules: ${(res.stdout + res.stderr).trim()}`);
    else notes.add('PrometheusRule expressions parsed by promtool check rules');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---- the chart's own rules ----

function podSpecOf(doc: Obj): Obj | undefined {
  if (doc.kind === 'Pod') return doc.spec;
  if (['Deployment', 'StatefulSet', 'DaemonSet', 'Job'].includes(doc.kind)) return doc.spec?.template?.spec;
  return undefined;
}

function checkHardening(doc: Obj, where: string): void {
  const pod = podSpecOf(doc);
  if (!pod) return;
  const podSc = (pod.securityContext ?? {}) as Obj;
  for (const c of (pod.containers ?? []) as Obj[]) {
    const at = `${where} container ${c.name}`;
    const sc = (c.securityContext ?? {}) as Obj;
    if ((sc.runAsNonRoot ?? podSc.runAsNonRoot) !== true) fail(at, 'runAsNonRoot must be true');
    if (sc.allowPrivilegeEscalation !== false) fail(at, 'allowPrivilegeEscalation must be false');
    if (sc.readOnlyRootFilesystem !== true) fail(at, 'readOnlyRootFilesystem must be true');
    if (sc.privileged === true) fail(at, 'must not be privileged');
    if (!(sc.capabilities?.drop ?? []).includes('ALL')) fail(at, 'capabilities.drop must include ALL');
    const seccomp = sc.seccompProfile?.type ?? podSc.seccompProfile?.type;
    if (seccomp !== 'RuntimeDefault' && seccomp !== 'Localhost')
      fail(at, 'seccompProfile must be RuntimeDefault');
    if (!c.resources?.requests || !c.resources?.limits?.memory)
      fail(at, 'resources need requests and a memory limit');
    if (typeof c.image !== 'string' || /:latest$/.test(c.image))
      fail(at, 'image must be pinned (not :latest)');
    if (doc.kind === 'Deployment') {
      if (c.livenessProbe?.httpGet?.path !== '/healthz') fail(at, 'livenessProbe must call /healthz');
      if (c.readinessProbe?.httpGet?.path !== '/readyz') fail(at, 'readinessProbe must call /readyz');
    }
  }
}

function checkLabels(doc: Obj, where: string): void {
  const labels = (doc.metadata?.labels ?? {}) as Obj;
  for (const key of [
    'app.kubernetes.io/name',
    'app.kubernetes.io/instance',
    'app.kubernetes.io/managed-by',
  ]) {
    if (!labels[key]) fail(where, `metadata.labels must carry ${key}`);
  }
}

// ---- configuration coverage ----

/** Settings the chart derives instead of taking from `config:` (value key, or where they come from). */
const DERIVED: Record<string, string> = {
  DATABASE_URL: 'secrets.databaseUrl',
  REDIS_URL: 'secrets.redisUrl',
  TOLLGATE_ENCRYPTION_KEY: 'secrets.encryptionKey',
  TOLLGATE_ENCRYPTION_KEYS: 'secrets.encryptionKeys',
  TOLLGATE_ADMIN_TOKEN: 'secrets.adminToken',
  PORT: 'proxy.port',
  OPERATOR_PORT: 'operator.port',
  POD_NAME: 'the downward API (metadata.name)',
};

function checkConfigCoverage(docs: Obj[], file: string): void {
  const settings = Object.keys(configSchema.shape);
  const values = parse(readFileSync(join(root, 'charts/tollgate/values.yaml'), 'utf8')) as Obj;
  const schema = JSON.parse(readFileSync(join(root, 'charts/tollgate/values.schema.json'), 'utf8')) as Obj;
  const configKeys = Object.keys(values.config ?? {});
  const schemaKeys = Object.keys(schema.properties?.config?.properties ?? {});
  for (const name of settings) {
    if (DERIVED[name]) continue;
    if (!configKeys.includes(name))
      fail('values.yaml', `config.${name} is missing (every setting must be reachable)`);
    if (!schemaKeys.includes(name))
      fail('values.schema.json', `properties.config.properties.${name} is missing`);
  }
  for (const key of configKeys) {
    if (!settings.includes(key) || DERIVED[key])
      fail('values.yaml', `config.${key} is not a Tollgate setting`);
  }
  for (const key of schemaKeys) {
    if (!configKeys.includes(key)) fail('values.schema.json', `config.${key} is not in values.yaml`);
  }
  checkDocumentedDefaults();

  // In the rendered manifests: what reaches the proxy and the operator containers.
  const data = new Map<string, Set<string>>();
  for (const d of docs) {
    if (d.kind === 'ConfigMap' || d.kind === 'Secret') {
      data.set(`${d.kind}/${d.metadata?.name}`, new Set(Object.keys({ ...d.data, ...d.stringData })));
    }
  }
  const reached = new Set<string>();
  let containers = 0;
  for (const d of docs) {
    if (d.kind !== 'Deployment') continue;
    for (const c of (d.spec?.template?.spec?.containers ?? []) as Obj[]) {
      containers++;
      for (const e of (c.env ?? []) as Obj[]) reached.add(e.name);
      for (const from of (c.envFrom ?? []) as Obj[]) {
        const ref = from.configMapRef
          ? `ConfigMap/${from.configMapRef.name}`
          : `Secret/${from.secretRef?.name}`;
        for (const key of data.get(ref) ?? []) reached.add(key);
      }
    }
  }
  if (containers === 0) fail(file, 'no Deployment container to check the configuration against');
  for (const name of settings) {
    if (!reached.has(name)) {
      fail(file, `${name} reaches no Tollgate container (set it in the values used for this check)`);
    }
  }
  notes.add(
    `configuration: all ${settings.length} settings of src/config/index.ts are reachable from values`,
  );
}

/** The `(default X)` in the comment above each `config` entry of values.yaml is Tollgate's real default. */
function checkDocumentedDefaults(): void {
  const doc = parseDocument(readFileSync(join(root, 'charts/tollgate/values.yaml'), 'utf8'));
  const config = doc.get('config');
  if (!isMap(config)) return;
  const shape = configSchema.shape as Record<
    string,
    { safeParse(v: unknown): { success: boolean; data?: unknown } }
  >;
  for (const pair of config.items) {
    const key = isScalar(pair.key) ? String(pair.key.value) : '';
    const comment = (isScalar(pair.key) ? pair.key.commentBefore : undefined) ?? '';
    const documented = /\(default ([^;:)]+)[;)]/.exec(comment)?.[1]?.trim();
    if (!documented || !shape[key]) continue;
    const parsed = shape[key].safeParse(undefined);
    const actual = parsed.success && parsed.data !== undefined ? String(parsed.data) : undefined;
    if (documented !== actual) {
      fail('values.yaml', `the comment of config.${key} says default ${documented}, Tollgate's is ${actual}`);
    }
  }
}

// ---- main ----

const args = process.argv.slice(2);
const coverage = args.includes('--config-coverage');
const files = args.filter((a) => !a.startsWith('--'));
if (files.length === 0) {
  process.stderr.write('usage: node scripts/validate-manifests.ts [--config-coverage] rendered.yaml...\n');
  process.exit(2);
}

for (const file of files) {
  const docs: Obj[] = [];
  for (const parsed of parseAllDocuments(readFileSync(file, 'utf8'))) {
    if (parsed.errors.length) fail(file, `YAML: ${parsed.errors[0]!.message}`);
    const doc = parsed.toJS() as Obj | null;
    if (doc && typeof doc === 'object') docs.push(doc);
  }
  const kinds = new Map<string, number>();
  for (const doc of docs) {
    const where = `${file}: ${doc.kind}/${doc.metadata?.name ?? '?'}`;
    if (typeof doc.apiVersion !== 'string' || typeof doc.kind !== 'string') {
      fail(where, 'apiVersion and kind are required');
      continue;
    }
    kinds.set(doc.kind, (kinds.get(doc.kind) ?? 0) + 1);
    if (doc.apiVersion.startsWith('monitoring.coreos.com/') && doc.kind === 'ServiceMonitor') {
      validateServiceMonitor(doc, where);
    } else if (doc.apiVersion.startsWith('monitoring.coreos.com/') && doc.kind === 'PrometheusRule') {
      validatePrometheusRule(doc, where);
    } else if (await validateSchema(doc, where)) {
      const name = modelName(doc.apiVersion, doc.kind);
      if (!models[name]?.getAttributeTypeMap) fail(where, `no model ${name} for the unknown-field check`);
      else checkFields(doc, name, doc.kind, where);
    }
    checkHardening(doc, where);
    if (doc.kind !== 'CustomResourceDefinition') checkLabels(doc, where);
  }
  if (coverage) checkConfigCoverage(docs, file);
  const summary = [...kinds].map(([k, n]) => `${n} ${k}`).join(', ');
  process.stdout.write(`${file}: ${docs.length} manifests (${summary})\n`);
}

for (const note of notes) process.stdout.write(`note: ${note}\n`);
if (errors.length) {
  process.stderr.write(`\n${errors.length} problem(s):\n${errors.map((e) => `  ${e}`).join('\n')}\n`);
  process.exit(1);
}
process.stdout.write('all manifests valid\n');
