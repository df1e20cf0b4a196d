#!/usr/bin/env bash
# Debian packages the test suite uses when it can: Chromium (hosted-page browser tests) and Prometheus
# (scraping /metrics end to end). Tests skip with a clear message where these cannot be installed.
set -uo pipefail
want=()
command -v chromium >/dev/null 2>&1 || want+=(chromium)
command -v prometheus >/dev/null 2>&1 || want+=(prometheus)
if [ ${#want[@]} -eq 0 ]; then echo "system packages present"; exit 0; fi
if [ "$(id -u)" -ne 0 ]; then echo "not root: cannot install ${want[*]}; the tests that need them will skip"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || echo "apt-get update failed"
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 \
  && echo "installed ${want[*]}" || echo "could not install ${want[*]}; the tests that need them will skip"
exit 0
