#!/usr/bin/env bash
# Runs a command with Node 22.18+ on PATH and the project's dependencies installed.
# When the Node found is older than 22.18 (the first 22 that runs .ts files as they are), Node 24 LTS is
# installed from the npm registry into ~/.node24.
# WITH_NODE_DEPS=runtime (`make dev`, scripts/tollgate): the dependencies Tollgate runs on only
# (`npm ci --omit=dev`: some 220 MB instead of 1.4 GB, 11 s instead of 41 s cold); a later command that
# needs the development ones (tests, lint, build: the default, `all`) installs them all.
set -euo pipefail
cd "$(dirname "$0")/.."

# The floor, in one place: package.json's `engines` and the README say the same (a test checks).
NODE_FLOOR=22.18
# 1 when the Node on PATH is at least the floor, else 0 (no Node: 0).
node_ok() {
  node -e 'const [a, b] = process.versions.node.split(".").map(Number); const [x, y] = process.argv[1].split(".").map(Number); process.stdout.write(a > x || (a === x && b >= y) ? "1" : "0")' "$NODE_FLOOR" 2>/dev/null || echo 0
}

if [ "$(node_ok)" != 1 ]; then
  export PATH="$HOME/.node24/node_modules/.bin:$PATH"
  if [ "$(node_ok)" != 1 ]; then
    echo "with-node: installing Node 24 LTS into ~/.node24 (found $(node --version 2>/dev/null || echo none))" >&2
    npm install --prefix "$HOME/.node24" --no-save --loglevel=error node@24 >&2
  fi
fi

# (Re)install dependencies when node_modules is missing or older than the lockfile, or holds only the
# runtime ones and this command needs them all. node_modules/.with-node-deps says which were installed.
want="${WITH_NODE_DEPS:-all}"
have=none
if [ -d node_modules ] && [ ! package-lock.json -nt node_modules/.package-lock.json ]; then
  have="$(cat node_modules/.with-node-deps 2>/dev/null || echo all)"
fi
if [ "$have" = none ] || { [ "$want" = all ] && [ "$have" = runtime ]; }; then
  if [ "$want" = runtime ]; then
    echo "with-node: npm ci --omit=dev (the runtime dependencies)" >&2
    npm ci --omit=dev --loglevel=error >&2
  else
    echo "with-node: npm ci" >&2
    npm ci --loglevel=error >&2
  fi
  echo "$want" > node_modules/.with-node-deps
fi

exec "$@"
