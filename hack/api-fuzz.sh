#!/usr/bin/env bash
# Fuzzes the worker API with schemathesis against a real `revault serve`,
# using worker/api/openapi.yaml: no response may be a 5xx, and every status,
# content type and JSON body must be one the spec documents.
#
# schemathesis is installed (pinned) into $REVAULT_CACHE/venv the first time;
# later runs reuse it. Bounded: a fixed number of examples per operation and
# a hard time limit. Loopback only.
#
#   hack/api-fuzz.sh                 # REVAULT_BIN defaults to the release build
#   API_FUZZ_EXAMPLES=50 hack/api-fuzz.sh
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${REVAULT_CACHE:-$HOME/.cache/revault}"
venv="$cache/venv"
version="4.32.5"
bin="${REVAULT_BIN:-$cache/target/x86_64-unknown-linux-gnu/release/revault}"
examples="${API_FUZZ_EXAMPLES:-60}"
limit="${API_FUZZ_SECONDS:-240}"

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    echo "api-fuzz: apt-get install python3-venv" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  echo "api-fuzz: installing schemathesis $version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$version"
fi
[ -x "$bin" ] || { echo "api-fuzz: $bin not found (run make build)" >&2; exit 1; }

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

token="fuzz-admin-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s *\n' "$token" > "$work/tokens"
REVAULT_LOG=info "$bin" serve --store "$work/store" --init --listen 127.0.0.1:0 \
  --addr-file "$work/addr" --token-file "$work/tokens" --maintenance-interval 2s \
  --max-cache-mib 64 2> "$work/serve.log" &
pid=$!
for _ in $(seq 1 300); do
  if [ -s "$work/addr" ] && grep -q "store open; ready" "$work/serve.log"; then break; fi
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
addr="$(cat "$work/addr")"
echo "api-fuzz: revault serve on $addr, $examples examples per operation" >&2

status=0
(cd "$work" && timeout --signal=INT "$limit" "$venv/bin/schemathesis" run "$here/worker/api/openapi.yaml" \
  --url "http://$addr" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --phases examples,coverage,fuzzing \
  --max-examples "$examples" \
  --seed 20260101 \
  --generation-database none \
  --workers 1 \
  --request-timeout 30 \
  --no-color) || status=$?

if grep -qi "panicked" "$work/serve.log"; then
  echo "api-fuzz: the server panicked:" >&2
  grep -i -A5 "panicked" "$work/serve.log" >&2
  status=1
fi
if ! kill -0 "$pid" 2>/dev/null; then
  echo "api-fuzz: the server died during the run" >&2
  tail -20 "$work/serve.log" >&2
  status=1
fi
exit "$status"
