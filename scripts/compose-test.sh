#!/usr/bin/env bash
# Runs compose.yaml with podman-compose against the image scripts/image.sh built, and checks the whole
# single-host deployment: Postgres and Redis healthy, the proxy migrated and ready on its published port,
# a project made with the CLI inside the proxy container answering a chat completion, and the worker
# delivering a webhook. scripts/image.sh runs it (`compose` mode, and in `ci` after the smoke test).
#   bash scripts/compose-test.sh IMAGE SERVICES_IMAGE
# SERVICES_IMAGE stands in for the official postgres and redis images when those cannot be pulled
# (scripts/image/services-standin.Containerfile); empty: compose.yaml's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
image=$1
services=${2:-}
project=tollgate-compose-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
dir=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-compose.XXXXXX")
port=$(node -e "const s=require('node:net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
key=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
say() { echo "compose: $*"; }

# This machine's podman needs runc and explicit rlimits (see scripts/image.sh): a containers.conf of our
# own for this run, so compose.yaml stays as it is everywhere else.
cat >"$dir/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF=$dir/containers.conf

cp compose.yaml "$dir/compose.yaml"
{
  echo "POSTGRES_PASSWORD=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
  echo "TOLLGATE_ENCRYPTION_KEY=$key"
  echo "TOLLGATE_IMAGE=$image"
  echo "TOLLGATE_PORT=$port"
  echo "PUBLIC_BASE_URL=http://127.0.0.1:$port"
  # The test's webhook receiver is the proxy itself, on the compose network.
  echo "WEBHOOK_ALLOW_HTTP=true"
  echo "WEBHOOK_ALLOW_PRIVATE_NETWORKS=true"
  if [ -n "$services" ]; then
    echo "POSTGRES_IMAGE=$services"
    echo "REDIS_IMAGE=$services"
  fi
} >"$dir/.env"
compose() { (cd "$dir" && podman-compose -p "$project" "$@"); }
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for s in postgres redis proxy worker; do
      echo "--- logs of $s"
      podman logs --tail 12 "${project}_${s}_1" 2>&1 | cut -c1-300 || true
    done
  fi
  if [ -n "${KEEP:-}" ]; then
    echo "compose: KEEP set: left $project running (cd $dir && podman-compose -p $project down -v)"
    exit $rc
  fi
  compose down -v >/dev/null 2>&1 || true
  podman volume rm -f "${project}_pgdata" >/dev/null 2>&1 || true
  # podman-compose 1.0's `down` leaves the project's network behind.
  podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  rm -rf "$dir"
  exit $rc
}
trap cleanup EXIT

say "up ($project, proxy on 127.0.0.1:$port)"
compose up -d >"$dir/up.log" 2>&1 || {
  cat "$dir/up.log"
  exit 1
}
base=http://127.0.0.1:$port
ready=""
for _ in $(seq 1 120); do
  if curl -fsS -o /dev/null "$base/readyz" 2>/dev/null; then
    ready=1
    break
  fi
  sleep 1
done
[ -n "$ready" ] || {
  echo "compose: the proxy was not ready on $base/readyz within 120 s" >&2
  exit 1
}
say "proxy ready (migrated, Postgres and Redis reached)"

exec_proxy() { podman exec "${project}_proxy_1" tollgate "$@"; }
created=$(exec_proxy project create --name Compose --currency usd --upstream-url echo://local --json)
id=$(node -p "JSON.parse(process.argv[1]).id" "$created")
api_key=$(node -p "JSON.parse(process.argv[1]).apiKey" "$created")
printf 'currency: usd\nmodels:\n  - id: compose-model\n    pricing: { mode: per_request, perRequest: "0.10" }\n' \
  | podman exec -i "${project}_proxy_1" sh -c 'cat >/tmp/pricing.yaml'
exec_proxy models apply --project "$id" --file /tmp/pricing.yaml >/dev/null
exec_proxy users connect --project "$id" --user compose-user >/dev/null
say "project $id made with the CLI in the proxy container"

auth=(-H "authorization: Bearer $api_key" -H 'content-type: application/json')
sub=$(curl -fsS "${auth[@]}" "$base/v1/webhooks/subscriptions" \
  -d '{"url":"http://proxy:8080/webhook-receiver","events":["balance.*"]}')
sub_id=$(node -p "JSON.parse(process.argv[1]).subscription.id" "$sub")
curl -fsS -o /dev/null "${auth[@]}" "$base/v1/user/balance/deposit" -d '{"user":"compose-user","amount":"1.00"}'
reply=$(curl -fsS "${auth[@]}" "$base/v1/chat/completions" \
  -d '{"model":"compose-model","user":"compose-user","messages":[{"role":"user","content":"Hello"}]}')
node -e '
const r = JSON.parse(process.argv[1]);
if (!r.choices?.[0]?.message?.content) { console.error("no completion:", process.argv[1]); process.exit(1); }
' "$reply"
balance=$(curl -fsS "${auth[@]}" "$base/v1/user/balance?user=compose-user")
node -e 'const b = JSON.parse(process.argv[1]); if (b.balance !== "0.90") { console.error("balance:", process.argv[1]); process.exit(1); }' "$balance"
say "chat completion served and charged (balance 0.90)"

# The worker fans the deposit's event out and sends it; the receiver (the proxy) answers 404, which
# ends the delivery after one attempt: the log shows the worker did its job.
delivered=""
for _ in $(seq 1 60); do
  logs=$(curl -fsS "${auth[@]}" "$base/v1/webhooks/logs?subscriptionId=$sub_id")
  if node -e 'const l = JSON.parse(process.argv[1]); process.exit(l.data.some((d) => d.attempts >= 1 && d.lastResponseStatus === 404) ? 0 : 1)' "$logs"; then
    delivered=1
    break
  fi
  sleep 1
done
[ -n "$delivered" ] || {
  echo "compose: the worker delivered no webhook within 60 s: $logs" >&2
  exit 1
}
say "the worker delivered the deposit's webhook"
for s in proxy worker; do
  user=$(podman exec "${project}_${s}_1" id -u)
  [ "$user" = 10001 ] || {
    echo "compose: $s runs as $user, not 10001" >&2
    exit 1
  }
done
say "passed"
