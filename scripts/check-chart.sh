#!/usr/bin/env bash
# Checks the Helm chart with the real tools: helm lint, helm template (default values, the full values
# file and a minimal variant), the values schema refusing bad input, the CRDs packaged from the top-level
# crds/ without drift, and every rendered manifest validated against the Kubernetes schemas
# (scripts/validate-manifests.ts). helm and kubectl come from scripts/fetch-k8s-tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=charts/tollgate
out=.tools/rendered
bin=$(bash scripts/fetch-k8s-tools.sh)
helm="$bin/helm"
rm -rf "$out"
mkdir -p "$out"

say() { echo "-- $*"; }
# helm prints an INFO line for the crds symlink on every command; keep the output readable.
quiet() { grep -v 'found symbolic link in path' || true; }

say "CRDs: $chart/crds is the top-level crds/"
if [ "$(readlink "$chart/crds")" != "../../crds" ]; then
  echo "$chart/crds must be a symlink to ../../crds (one source of truth for the CRDs)" >&2
  exit 1
fi
shopt -s nullglob
crd_files=(crds/*.yaml)
shopt -u nullglob
if [ ${#crd_files[@]} -eq 0 ]; then
  echo "crds/ holds no CustomResourceDefinition" >&2
  exit 1
fi

say "helm lint (default values, full values)"
"$helm" lint "$chart" --strict 2>&1 | quiet
"$helm" lint "$chart" --strict -f "$chart/ci/full-values.yaml" 2>&1 | quiet

say "helm template"
"$helm" template tollgate "$chart" --namespace tollgate --include-crds 2>&1 >"$out/default.yaml" | quiet
"$helm" template tollgate "$chart" --namespace tollgate -f "$chart/ci/full-values.yaml" 2>&1 >"$out/full.yaml" | quiet
"$helm" template tg "$chart" --namespace apps --set existingSecret=tollgate-secrets \
  --set operator.enabled=false --set migrations.enabled=false --set proxy.podDisruptionBudget.enabled=false \
  --set tests.enabled=false 2>&1 >"$out/minimal.yaml" | quiet

say "values.schema.json refuses bad values"
expect_refused() {
  local why=$1
  shift
  if "$helm" template tollgate "$chart" "$@" >/dev/null 2>"$out/refused.log"; then
    echo "helm template accepted $why ($*)" >&2
    exit 1
  fi
  grep -E '^- at' "$out/refused.log" | head -n 1 | sed "s/^- /   refused: /" || true
}
expect_refused "an unknown setting" --set config.NO_SUCH_SETTING=1
expect_refused "a malformed encryption key" --set secrets.encryptionKey=short
expect_refused "a non-Postgres DATABASE_URL" --set secrets.databaseUrl=mysql://db/x
expect_refused "an unknown top-level value" --set replicaCount=3

say "the packaged chart carries crds/ unchanged"
"$helm" package "$chart" --destination "$out" 2>&1 | quiet
mkdir -p "$out/package"
tar -xzf "$out"/tollgate-*.tgz -C "$out/package"
diff -r crds "$out/package/tollgate/crds"
for f in "${crd_files[@]}"; do
  grep -q "name: $(basename "$f" .yaml)" "$out/default.yaml" \
    || { echo "helm template --include-crds did not render $f" >&2; exit 1; }
done

say "validate the rendered manifests against the Kubernetes schemas"
node scripts/validate-manifests.ts "$out/default.yaml" "$out/minimal.yaml"
node scripts/validate-manifests.ts --config-coverage "$out/full.yaml"

say "chart OK"
