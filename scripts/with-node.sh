#!/usr/bin/env bash
# Runs a command with Node 22+ on PATH and the project's dependencies installed.
# When the Node found is older than 22, Node 24 LTS is installed from the npm registry into ~/.node24.
set -euo pipefail
cd "$(dirname "$0")/.."

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if [ "$(node_major)" -lt 22 ]; then
  export PATH="$HOME/.node24/node_modules/.bin:$PATH"
  if [ "$(node_major)" -lt 22 ]; then
    echo "with-node: installing Node 24 LTS into ~/.node24 (found $(node --version 2>/dev/null || echo none))" >&2
    npm install --prefix "$HOME/.node24" --no-save --loglevel=error node@24 >&2
  fi
fi

# (Re)install dependencies when node_modules is missing or older than the lockfile.
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "with-node: npm ci" >&2
  npm ci --loglevel=error >&2
fi

exec "$@"
