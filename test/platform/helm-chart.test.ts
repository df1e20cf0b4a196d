import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { type FamilyPath, pathMatches, ROUTE_FAMILIES } from '../../src/http/route-families.ts';
import { webhookUrl } from '../../src/payments/connection.ts';
import { linkUrl } from '../../src/users/links.ts';

/**
 * What the Helm chart renders, with the real helm binary (scripts/fetch-k8s-tools.sh puts it in
 * .tools/bin; CI runs scripts/check-chart.sh first). The chart's lint and schema validation of every
 * manifest run in scripts/check-chart.sh; these tests pin its behaviour.
 */
const root = join(import.meta.dirname, '..', '..');
const helm = join(root, '.tools/bin/helm');
const chart = join(root, 'charts/tollgate');
const available = existsSync(helm);
if (!available) {
  console.warn('helm-chart: skipped, .tools/bin/helm is missing (run `bash scripts/fetch-k8s-tools.sh`)');
}

type Obj = Record<string, any>;
const tmp = mkdtempSync(join(tmpdir(), 'tollgate-helm-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function render(args: string[] = []): Obj[] {
  const out = execFileSync(helm, ['template', 'tg', chart, '--namespace', 'apps', ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return parseAllDocuments(out)
    .map((d) => d.toJS() as Obj | null)
    .filter((d): d is Obj => d !== null);
}

const find = (docs: Obj[], kind: string, name: string) => {
  const doc = docs.find((d) => d.kind === kind && d.metadata?.name === name);
  if (!doc) throw new Error(`${kind}/${name} not rendered`);
  return doc;
};
const container = (deployment: Obj) => deployment.spec.template.spec.containers[0] as Obj;
const b64 = (s: string) => Buffer.from(s, 'base64').toString('utf8');
const KEY = 'ab'.repeat(32);
const DB = [
  '--set',
  'secrets.databaseUrl=postgres://u:p@db:5432/tollgate',
  '--set',
  `secrets.encryptionKey=${KEY}`,
];

/** The paths an ingress routes for a host, as `{ path, pathType }`. */
function routed(ingress: Obj, host: string): FamilyPath[] {
  const rule = (ingress.spec.rules as Obj[]).find((r) => r.host === host);
  return (rule?.http.paths ?? []).map((p: Obj) => ({ path: p.path, pathType: p.pathType }));
}

describe.skipIf(!available)('the Helm chart', () => {
  it('ships the CRDs of the top-level crds/ unchanged', () => {
    const docs = render(['--include-crds']);
    const files = readdirSync(join(root, 'crds')).filter((f) => f.endsWith('.yaml'));
    expect(files.length).toBeGreaterThan(0);
    for (const file of files) {
      const source = parse(readFileSync(join(root, 'crds', file), 'utf8')) as Obj;
      expect(find(docs, 'CustomResourceDefinition', source.metadata.name)).toEqual(source);
    }
  });

  it('runs migrations as a pre-install/pre-upgrade hook with its own copy of the secrets', () => {
    const docs = render(DB);
    const job = find(docs, 'Job', 'tg-tollgate-migrate');
    const hookSecret = find(docs, 'Secret', 'tg-tollgate-migrate');
    const secret = find(docs, 'Secret', 'tg-tollgate');
    expect(job.metadata.annotations['helm.sh/hook']).toBe('pre-install,pre-upgrade');
    // The hook Secret is created before the Job (lower weight); both go once the migrations succeeded.
    expect(Number(hookSecret.metadata.annotations['helm.sh/hook-weight'])).toBeLessThan(
      Number(job.metadata.annotations['helm.sh/hook-weight']),
    );
    expect(hookSecret.metadata.annotations['helm.sh/hook-delete-policy']).toContain('hook-succeeded');
    expect(hookSecret.data).toEqual(secret.data);
    expect(b64(secret.data.TOLLGATE_ENCRYPTION_KEY)).toBe(KEY);
    expect(secret.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
    const c = job.spec.template.spec.containers[0];
    expect(c.args).toEqual(['migrate']);
    const refs = c.env
      .filter((e: Obj) => e.valueFrom?.secretKeyRef)
      .map((e: Obj) => e.valueFrom.secretKeyRef);
    expect(refs.map((r: Obj) => r.name)).toEqual(Array(3).fill('tg-tollgate-migrate'));
    // the key ring of a rotation (optional) reaches the migrations too
    expect(refs.map((r: Obj) => [r.key, r.optional === true])).toEqual([
      ['DATABASE_URL', false],
      ['TOLLGATE_ENCRYPTION_KEY', false],
      ['TOLLGATE_ENCRYPTION_KEYS', true],
    ]);
  });

  it('rotates the encryption key: the ring reaches every container, and a post-upgrade Job re-seals', () => {
    const NEW = 'cd'.repeat(32);
    expect(render(DB).some((d) => d.kind === 'Job' && d.metadata.name === 'tg-tollgate-rotate-keys')).toBe(
      false,
    );
    const docs = render([
      ...DB,
      '--set',
      `secrets.encryptionKeys=${NEW}\\,${KEY}`, // helm's --set splits on unescaped commas
      '--set',
      'keyRotation.enabled=true',
    ]);
    expect(b64(find(docs, 'Secret', 'tg-tollgate').data.TOLLGATE_ENCRYPTION_KEYS)).toBe(`${NEW},${KEY}`);
    const job = find(docs, 'Job', 'tg-tollgate-rotate-keys');
    expect(job.metadata.annotations['helm.sh/hook']).toBe('post-install,post-upgrade');
    const c = job.spec.template.spec.containers[0];
    expect(c.args).toEqual(['keys', 'rotate', '--batch', '200']);
    const ring = c.env.find((e: Obj) => e.name === 'TOLLGATE_ENCRYPTION_KEYS');
    expect(ring.valueFrom.secretKeyRef).toMatchObject({
      name: 'tg-tollgate',
      key: 'TOLLGATE_ENCRYPTION_KEYS',
    });
    for (const name of ['tg-tollgate-proxy', 'tg-tollgate-operator']) {
      const deployment = docs.find((d) => d.kind === 'Deployment' && d.metadata.name === name);
      if (!deployment) continue;
      expect(container(deployment).env.map((e: Obj) => e.name)).toContain('TOLLGATE_ENCRYPTION_KEYS');
    }
  });

  it('generates one encryption key per render when none is given, the same in both Secrets', () => {
    const docs = render(['--set', 'secrets.databaseUrl=postgres://db/x']);
    const key = b64(find(docs, 'Secret', 'tg-tollgate').data.TOLLGATE_ENCRYPTION_KEY);
    expect(key).toMatch(/^[0-9a-f]{64}$/);
    expect(b64(find(docs, 'Secret', 'tg-tollgate-migrate').data.TOLLGATE_ENCRYPTION_KEY)).toBe(key);
  });

  it('runs the proxy and the operator with probes, the downward-API identity and hardened pods', () => {
    const docs = render(DB);
    const proxy = container(find(docs, 'Deployment', 'tg-tollgate-proxy'));
    expect(proxy.args).toEqual(['proxy']);
    expect(proxy.livenessProbe.httpGet.path).toBe('/healthz');
    expect(proxy.readinessProbe.httpGet.path).toBe('/readyz');
    const operatorDeployment = find(docs, 'Deployment', 'tg-tollgate-operator');
    expect(operatorDeployment.spec.replicas).toBe(2);
    const operator = container(operatorDeployment);
    expect(operator.args).toEqual(['operator']);
    const env = Object.fromEntries(operator.env.map((e: Obj) => [e.name, e]));
    expect(env.POD_NAME.valueFrom.fieldRef.fieldPath).toBe('metadata.name');
    expect(env.OPERATOR_PORT.value).toBe('8081');
    expect(env.OPERATOR_LEASE_NAME.value).toBe('tollgate-operator');
    expect(env.OPERATOR_LEASE_NAMESPACE.value).toBe('apps');
    for (const c of [proxy, operator]) {
      expect(c.securityContext).toMatchObject({
        runAsNonRoot: true,
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ['ALL'] },
        seccompProfile: { type: 'RuntimeDefault' },
      });
      expect(c.volumeMounts).toContainEqual({ name: 'tmp', mountPath: '/tmp' });
    }
    // Only the operator talks to the Kubernetes API.
    expect(
      find(docs, 'Deployment', 'tg-tollgate-proxy').spec.template.spec.automountServiceAccountToken,
    ).toBe(false);
  });

  it('gives the operator least-privilege RBAC, cluster-wide or per watched namespace', () => {
    const all = render(DB);
    const clusterRole = find(all, 'ClusterRole', 'apps-tg-tollgate-operator');
    const rules = Object.fromEntries(
      clusterRole.rules.map((r: Obj) => [`${r.apiGroups[0]}/${r.resources.join(',')}`, r.verbs]),
    );
    const kinds = [
      'webhooksubscriptions',
      'projects',
      'apikeys',
      'modelproviders',
      'pricelists',
      'limitpolicies',
    ];
    expect(rules).toEqual({
      [`tollgate.dev/${kinds.join(',')}`]: ['list', 'watch', 'patch'],
      [`tollgate.dev/${kinds.map((k) => `${k}/status`).join(',')}`]: ['patch'],
      'tollgate.dev/webhooksubscriptions/finalizers,apikeys/finalizers': ['update'],
      '/secrets': ['get', 'list', 'watch', 'create', 'update'],
      '/events': ['create'],
    });
    const lease = find(all, 'Role', 'tg-tollgate-operator-leader-election');
    expect(lease.metadata.namespace).toBe('apps');
    expect(lease.rules).toEqual([
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
      {
        apiGroups: ['coordination.k8s.io'],
        resources: ['leases'],
        resourceNames: ['tollgate-operator'],
        verbs: ['get', 'update'],
      },
    ]);

    const scoped = render([
      ...DB,
      '--set',
      'operator.watchNamespaces={team-a,team-b}',
      '--set',
      'config.OPERATOR_LEASE_NAME=leader',
      '--set',
      'config.OPERATOR_LEASE_NAMESPACE=system',
    ]);
    expect(scoped.some((d) => d.kind === 'ClusterRole' || d.kind === 'ClusterRoleBinding')).toBe(false);
    for (const ns of ['team-a', 'team-b']) {
      const role = scoped.find((d) => d.kind === 'Role' && d.metadata.namespace === ns);
      expect(role?.rules).toEqual(clusterRole.rules);
      const binding = scoped.find((d) => d.kind === 'RoleBinding' && d.metadata.namespace === ns);
      expect(binding?.subjects).toEqual([
        { kind: 'ServiceAccount', name: 'tg-tollgate-operator', namespace: 'apps' },
      ]);
    }
    const scopedLease = find(scoped, 'Role', 'tg-tollgate-operator-leader-election');
    expect(scopedLease.metadata.namespace).toBe('system');
    expect(scopedLease.rules[1].resourceNames).toEqual(['leader']);
    const args = container(find(scoped, 'Deployment', 'tg-tollgate-operator')).args;
    expect(args).toEqual(['operator', '--namespace', 'team-a', '--namespace', 'team-b']);
  });

  it('rolls the pods when the configuration or a secret changes', () => {
    const checksums = (args: string[]) =>
      find(render([...DB, ...args]), 'Deployment', 'tg-tollgate-proxy').spec.template.metadata.annotations;
    const base = checksums([]);
    const config = checksums(['--set', 'config.LOG_LEVEL=debug']);
    expect(config['checksum/config']).not.toBe(base['checksum/config']);
    expect(config['checksum/secret']).toBe(base['checksum/secret']);
    const secret = checksums(['--set', 'secrets.redisUrl=redis://cache:6379']);
    expect(secret['checksum/secret']).not.toBe(base['checksum/secret']);
    expect(secret['checksum/config']).toBe(base['checksum/config']);
  });

  it('takes the secrets from existingSecret without creating one', () => {
    const docs = render(['--set', 'existingSecret=mine']);
    expect(docs.filter((d) => d.kind === 'Secret')).toEqual([]);
    const proxy = find(docs, 'Deployment', 'tg-tollgate-proxy');
    const refs = container(proxy)
      .env.filter((e: Obj) => e.valueFrom?.secretKeyRef)
      .map((e: Obj) => [e.name, e.valueFrom.secretKeyRef.name]);
    expect(refs).toEqual([
      ['DATABASE_URL', 'mine'],
      ['TOLLGATE_ENCRYPTION_KEY', 'mine'],
      ['TOLLGATE_ENCRYPTION_KEYS', 'mine'],
      ['REDIS_URL', 'mine'],
      ['TOLLGATE_ADMIN_TOKEN', 'mine'],
    ]);
    expect(proxy.spec.template.metadata.annotations['checksum/secret']).toBeUndefined();
    const job = find(docs, 'Job', 'tg-tollgate-migrate');
    expect(
      job.spec.template.spec.containers[0].env.find((e: Obj) => e.name === 'DATABASE_URL').valueFrom
        .secretKeyRef.name,
    ).toBe('mine');
  });

  it('puts every non-empty config value in the ConfigMap and leaves empty ones to Tollgate', () => {
    const docs = render([
      ...DB,
      '--set',
      'config.WEBHOOK_MAX_ATTEMPTS=12',
      '--set',
      'config.WEBHOOK_ALLOW_HTTP=true',
    ]);
    const data = find(docs, 'ConfigMap', 'tg-tollgate-config').data;
    expect(data).toEqual({
      TOLLGATE_DATA_DIR: '/tmp/tollgate',
      // The chart's one non-empty default besides the data dir: trust the ingress, one hop.
      TOLLGATE_TRUSTED_PROXIES: '1',
      WEBHOOK_MAX_ATTEMPTS: '12',
      WEBHOOK_ALLOW_HTTP: 'true',
    });
    const job = find(docs, 'Job', 'tg-tollgate-migrate');
    const env = job.spec.template.spec.containers[0].env.map((e: Obj) => e.name);
    expect(env).toEqual(expect.arrayContaining(['WEBHOOK_MAX_ATTEMPTS', 'WEBHOOK_ALLOW_HTTP']));
  });

  it('renders a streaming-friendly ingress routing every public path family, never /metrics', () => {
    const docs = render([...DB, '--set', 'ingress.enabled=true']);
    const ingress = find(docs, 'Ingress', 'tg-tollgate-proxy');
    expect(ingress.metadata.annotations).toMatchObject({
      'nginx.ingress.kubernetes.io/proxy-buffering': 'off',
      'nginx.ingress.kubernetes.io/proxy-read-timeout': '3600',
    });
    // the server's own list, every entry with its path type
    expect(routed(ingress, 'tollgate.example.com')).toEqual(ROUTE_FAMILIES.public);
    const base = 'https://tollgate.example.com';
    const reached = (url: string, host = 'tollgate.example.com') =>
      routed(ingress, host).some((entry) => pathMatches(entry, new URL(url).pathname));
    for (const url of [
      webhookUrl({ publicBaseUrl: base }, 'stripe', 'proj_01JABCDEF'),
      `${base}/payments/done/cGF5XzAx.c2lnbmF0dXJl`,
      linkUrl(base, 'portal', 'eyJ1Ijoi.c2ln'),
      linkUrl(base, 'connect', 'eyJ1Ijoi.c2ln'),
      linkUrl(base, 'topup', 'eyJ1Ijoi.c2ln'),
      `${base}/v1/chat/completions`,
      `${base}/v1/messages?beta=true`,
      `${base}/`,
      `${base}/docs`,
    ]) {
      expect([url, reached(url)]).toEqual([url, true]);
    }
    // the dashboard and the admin API only when the values say so; probes and metrics never
    for (const url of [
      `${base}/dashboard`,
      `${base}/admin/v1/projects`,
      `${base}/metrics`,
      `${base}/healthz`,
    ]) {
      expect([url, reached(url)]).toEqual([url, false]);
    }
    const exposed = find(
      render([
        ...DB,
        '--set',
        'ingress.enabled=true',
        '--set',
        'ingress.dashboard.enabled=true',
        '--set',
        'ingress.dashboard.host=dash.example.com',
        '--set',
        'ingress.admin.enabled=true',
      ]),
      'Ingress',
      'tg-tollgate-proxy',
    );
    expect(routed(exposed, 'dash.example.com')).toEqual(ROUTE_FAMILIES.dashboard);
    expect(routed(exposed, 'tollgate.example.com')).toEqual([
      ...ROUTE_FAMILIES.public,
      ...ROUTE_FAMILIES.admin,
    ]);
  });

  it('renders alerting rules scoped to the release namespace', () => {
    const names = (docs: Obj[]) =>
      find(docs, 'PrometheusRule', 'tg-tollgate').spec.groups[0].rules.map((r: Obj) => r.alert);
    const docs = render([...DB, '--set', 'metrics.prometheusRule.enabled=true']);
    const rules = find(docs, 'PrometheusRule', 'tg-tollgate').spec.groups[0].rules as Obj[];
    expect(names(docs)).toEqual([
      'TollgateWebhookDeliveryFailureRateHigh',
      'TollgateWebhookBacklogStale',
      'TollgateOperatorLeaderMissing',
      'TollgateReconcileErrors',
      'TollgateUpstreamErrorsHigh',
      'TollgateOverheadLatencyHigh',
    ]);
    for (const rule of rules) expect(rule.expr).toContain('namespace="apps"');
    const withoutOperator = render([
      ...DB,
      '--set',
      'metrics.prometheusRule.enabled=true',
      '--set',
      'operator.enabled=false',
    ]);
    expect(names(withoutOperator)).not.toContain('TollgateOperatorLeaderMissing');
  });

  it('ships the Grafana dashboard as a ConfigMap for the sidecar, only when asked', () => {
    const file = readFileSync(join(chart, 'dashboards/tollgate.json'), 'utf8');
    expect(render(DB).some((d) => d.kind === 'ConfigMap' && d.metadata.name.endsWith('-dashboard'))).toBe(
      false,
    );
    const docs = render([
      ...DB,
      '--set',
      'metrics.grafanaDashboard.enabled=true',
      '--set',
      'metrics.grafanaDashboard.namespace=monitoring',
      '--set',
      'metrics.grafanaDashboard.annotations.grafana_folder=Tollgate',
    ]);
    const cm = find(docs, 'ConfigMap', 'tg-tollgate-dashboard');
    expect(cm.metadata.namespace).toBe('monitoring');
    expect(cm.metadata.labels.grafana_dashboard).toBe('1');
    expect(cm.metadata.annotations).toEqual({ grafana_folder: 'Tollgate' });
    expect(JSON.parse(cm.data['tollgate.json'])).toEqual(JSON.parse(file));
  });

  it('refuses values the schema does not know', () => {
    const res = spawnSync(helm, ['template', 'tg', chart, '--set', 'config.LOG_LEVELS=debug'], {
      encoding: 'utf8',
    });
    expect(res.status).not.toBe(0);
    expect(res.stderr).toContain("additional properties 'LOG_LEVELS' not allowed");
  });
});

describe.skipIf(!available)('scripts/validate-manifests.ts', () => {
  const validate = (args: string[]) =>
    spawnSync(process.execPath, [join(root, 'scripts/validate-manifests.ts'), ...args], { encoding: 'utf8' });

  it('accepts the chart and rejects unknown fields, wrong types and unhardened containers', () => {
    const good = join(tmp, 'good.yaml');
    writeFileSync(good, execFileSync(helm, ['template', 'tg', chart, ...DB], { encoding: 'utf8' }));
    expect(validate([good]).status).toBe(0);

    const broken = join(tmp, 'broken.yaml');
    writeFileSync(
      broken,
      readFileSync(good, 'utf8')
        .replace('revisionHistoryLimit: 5', 'revisionHistoryLimt: 5')
        .replace('readOnlyRootFilesystem: true', 'readOnlyRootFilesystem: false')
        .replace('backoffLimit: 3', 'backoffLimit: three'),
    );
    const res = validate([broken]);
    expect(res.status).toBe(1);
    expect(res.stderr).toContain('unknown field Deployment.spec.revisionHistoryLimt');
    expect(res.stderr).toContain('readOnlyRootFilesystem must be true');
    expect(res.stderr).toContain('backoffLimit must be integer');
  }, 60_000);

  it('fails the configuration check when a setting does not reach a container', () => {
    const file = join(tmp, 'defaults.yaml');
    writeFileSync(file, execFileSync(helm, ['template', 'tg', chart, ...DB], { encoding: 'utf8' }));
    const res = validate(['--config-coverage', file]);
    expect(res.status).toBe(1);
    // With default values the optional settings are left out of the ConfigMap, so they are reported.
    expect(res.stderr).toContain('WEBHOOK_MAX_ATTEMPTS reaches no Tollgate container');
    expect(res.stderr).not.toContain('DATABASE_URL reaches no');
    expect(res.stderr).not.toContain('POD_NAME reaches no');
  }, 60_000);
});

describe('the image and the chart agree', () => {
  const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8');
  const values = parse(readFileSync(join(chart, 'values.yaml'), 'utf8')) as Obj;

  it('runs as the user the chart expects, with the entry point the build produces', () => {
    const user = /^USER (\d+):(\d+)$/m.exec(dockerfile);
    expect(user?.[1]).toBe(String(values.podSecurityContext.runAsUser));
    expect(user?.[2]).toBe(String(values.podSecurityContext.runAsGroup));
    // rolldown.config.ts bundles cmd/tollgate.ts into dist/bin/tollgate.js (entry `tollgate`, `[name].js`).
    const bundle = readFileSync(join(root, 'rolldown.config.ts'), 'utf8');
    expect(bundle).toContain("input: { tollgate: 'cmd/tollgate.ts' }");
    expect(bundle).toContain("dir: 'dist/bin'");
    expect(bundle).toContain("entryFileNames: '[name].js'");
    expect(dockerfile).toContain(
      'ENTRYPOINT ["node", "--max-semi-space-size=16", "/app/dist/bin/tollgate.js"]',
    );
    expect(existsSync(join(root, 'cmd/tollgate.ts'))).toBe(true);
  });

  it('copies everything the build compiles, and .dockerignore lets it through', () => {
    const ignore = readFileSync(join(root, '.dockerignore'), 'utf8');
    // The bundle reads cmd/ and src/; tsconfig.build.json compiles the webhook verifier from src/.
    for (const dir of ['cmd', 'src']) {
      expect(dockerfile).toContain(`COPY ${dir} ./${dir}`);
      expect(ignore).toContain(`!${dir}/**`);
    }
    const files = [
      'package.json',
      'package-lock.json',
      'tsconfig.json',
      'tsconfig.build.json',
      'rolldown.config.ts',
    ];
    for (const file of files) {
      expect(ignore).toContain(`!${file}`);
    }
    // The chart's writable /tmp is where the image points the data directory.
    expect(dockerfile).toContain('TOLLGATE_DATA_DIR=/tmp/tollgate');
    expect(values.config.TOLLGATE_DATA_DIR).toBe('/tmp/tollgate');
  });
});

describe('the chart metadata', () => {
  it('states the Kubernetes floor the CRD needs: CEL rules with fieldPath are accepted from 1.28', () => {
    const meta = parse(readFileSync(join(chart, 'Chart.yaml'), 'utf8')) as Obj;
    const crds = readdirSync(join(root, 'crds')).map((f) => readFileSync(join(root, 'crds', f), 'utf8'));
    expect(crds.some((text) => /fieldPath:/.test(text))).toBe(true);
    expect(meta.kubeVersion).toBe('>=1.28.0-0');
    expect(readFileSync(join(root, 'docs', 'kubernetes.md'), 'utf8')).toContain(
      'It needs Kubernetes 1.28 or later',
    );
  });
});
