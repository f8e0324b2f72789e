#!/usr/bin/env bash
# Revault's end-to-end run (make e2e): the Ginkgo suite in e2e/ on a real 4-node kind cluster,
# with images built locally and loaded into the nodes (no registry anywhere).
#
# usage: hack/e2e.sh [run]    kind-up (with the images of `make images`, the previous release's
#                             (hack/previous-release.sh) and the e2e tool image), the suite in
#                             two groups, kind-down: first the group "upgrade" (scenario 16: the
#                             suite installs the previous release and upgrades it to
#                             charts/revault), then every other scenario (the suite `helm
#                             upgrade --install`s charts/revault itself); on failure first prints
#                             the operator's and workers' logs and the test namespaces' events
#                             and objects.
#        hack/e2e.sh check    can this machine run it? exit 0: yes; 1: no, the reason is printed
#                             (make test then skips the e2e suite); 2: no, but REVAULT_E2E=1
#                             requires it.
# env:   KEEP=1               keep the cluster afterwards (export KUBECONFIG=... is printed);
#                             a later run reuses it (a new helm upgrade, new namespaces)
#        REVAULT_E2E          0: make test skips the suite; 1: make test fails if it cannot run
#        E2E_FOCUS            run only the specs matching this regexp (ginkgo --focus)
#        E2E_TIMEOUT          the suite's time limit (default 45m)
#        KIND_CLUSTER, REVAULT_KIND_OFFLINE, ...   see hack/kind-up.sh and hack/README.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:-run}

# ---- check: no root needed, nothing installed ---------------------------------------------
# The suite needs what hack/k8s-tools.sh and kind-node-image.sh need: root (apt-get, dockerd,
# debootstrap, privileged containers), Linux on x86_64 (the static binaries, the node image),
# a Docker engine or Debian's (apt-get install docker.io), Go, Python 3, and disk space for the
# node image (~3 GB in Docker plus its 1.5 GB archive) and the clusters' volumes.
check() {
  local why=()
  [ "$(uname -s)" = Linux ] || why+=("not Linux")
  [ "$(uname -m)" = x86_64 ] || why+=("not x86_64 ($(uname -m))")
  [ "$(id -u)" -eq 0 ] || why+=("not root (hack/ installs packages and starts dockerd)")
  if ! timeout 10 docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null &&
     ! { command -v apt-get >/dev/null && [ -f /etc/debian_version ]; }; then
    why+=("no Docker engine and no apt-get to install Debian's docker.io")
  fi
  command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || why+=("no Go toolchain")
  command -v python3 >/dev/null || why+=("no python3")
  local cache=${REVAULT_CACHE:-$HOME/.cache/revault} d avail
  for d in "$cache" /var/lib; do
    while [ ! -d "$d" ]; do d=$(dirname "$d"); done
    avail=$(df -Pk "$d" | awk 'NR == 2 {print $4}')
    [ "${avail:-0}" -ge $((10 * 1024 * 1024)) ] || why+=("less than 10 GiB free in $d")
  done
  if [ "${REVAULT_E2E:-}" = 0 ]; then echo "e2e: SKIPPED: REVAULT_E2E=0"; return 1; fi
  if [ ${#why[@]} -eq 0 ]; then return 0; fi
  local IFS=';'
  echo "e2e: SKIPPED: this machine cannot run the kind e2e suite: ${why[*]}"
  if [ "${REVAULT_E2E:-}" = 1 ]; then echo "e2e: ERROR: REVAULT_E2E=1 requires it" >&2; return 2; fi
  return 1
}

case $MODE in
  check) check; exit $? ;;
  run) ;;
  *) echo "usage: hack/e2e.sh [run|check]" >&2; exit 2 ;;
esac

SCRIPT_NAME=e2e
. "$ROOT/hack/lib.sh"

CLUSTER=${KIND_CLUSTER:-revault-e2e}
IMAGES=$REVAULT_CACHE/images
RUN_ID=$(date -u +%m%d-%H%M%S)
ARTIFACTS=$REVAULT_CACHE/e2e
mkdir -p "$ARTIFACTS"
t0=$(now)
# One run per cluster at a time (runs on differently named clusters may overlap).
with_lock "e2e-$CLUSTER"

[ -f "$IMAGES/images.env" ] || die "no $IMAGES/images.env: run 'make images' first"
# shellcheck source=/dev/null
. "$IMAGES/images.env"
for a in "$WORKER_ARCHIVE" "$OPERATOR_ARCHIVE"; do [ -f "$a" ] || die "$a missing: run 'make images'"; done

# The suite's in-cluster helper (generate, change and checksum trees; call the worker API) and
# the suite itself, compiled before any cluster exists so a compile error costs nothing.
log "building e2e/cmd/e2e-tool and the suite"
(cd "$ROOT/e2e" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o bin/e2e-tool ./cmd/e2e-tool &&
  go test -c -o bin/e2e.test .) || die "building the e2e suite failed"
tool_tag=dev-$(cat "$ROOT/e2e/bin/e2e-tool" "$HACK_DIR/mkimage.py" | sha256sum | cut -c1-12)
TOOL_IMAGE=revault.local/e2e-tool:$tool_tag
TOOL_ARCHIVE=$IMAGES/e2e-tool-$tool_tag.tar
if [ ! -s "$TOOL_ARCHIVE" ]; then
  find "$IMAGES" -maxdepth 1 -name 'e2e-tool-*.tar' -delete
  python3 "$HACK_DIR/mkimage.py" "$TOOL_IMAGE" "$TOOL_ARCHIVE" /e2e-tool "$ROOT/e2e/bin/e2e-tool:/e2e-tool" >/dev/null
fi
# Velero (built from its Go module) and the Revault plugin: images and the CLI for
# e2e/velero_test.go (hack/velero-plugin.sh).
VELERO_ENV=$("$HACK_DIR/velero-plugin.sh" e2e-images | tail -1) || die "building the Velero images failed"
# shellcheck source=/dev/null
. "$VELERO_ENV"
# The previous release (chart, images) that scenario 16 upgrades from, built from its commit.
prev_rc=0
PREVIOUS_ENV=$("$HACK_DIR/previous-release.sh" | tail -1) || prev_rc=$?
case $prev_rc in
  0) # shellcheck source=/dev/null
     . "$PREVIOUS_ENV" ;;
  3) [ "${REVAULT_E2E:-}" != 1 ] || die "REVAULT_E2E=1 requires the group upgrade, which needs the previous release's commit"
     PREVIOUS_ENV=""
     log "WARNING: the group upgrade (scenario 16) will be SKIPPED: no previous release to upgrade from" ;;
  *) die "building the previous release failed" ;;
esac
# The S3 server the workers' remote runs against in the cluster (e2e/remote_test.go).
S3_ENV=$("$HACK_DIR/s3-server.sh" e2e-image | tail -1) || die "building the S3 server's image failed"
# shellcheck source=/dev/null
. "$S3_ENV"
t_build=$(now)

# Diagnostics for a failed run: what the issue asks for (operator and worker logs, the test
# namespaces' events) plus the objects' state.
diagnose() {
  local kc=("$K8S_BIN/kubectl" --kubeconfig "$KCFG") p ns
  echo "==================== e2e FAILED: diagnostics (cluster $CLUSTER, run $RUN_ID) ===================="
  echo "---- revault-system"
  "${kc[@]}" -n revault-system get deploy,ds,pods,svc -o wide 2>&1 || true
  for p in $("${kc[@]}" -n revault-system get pods -l app.kubernetes.io/component=operator -o name 2>/dev/null); do
    echo "---- operator log: $p (last 300 lines)"
    "${kc[@]}" -n revault-system logs "$p" --tail=300 2>&1 || true
  done
  for p in $("${kc[@]}" -n revault-system get pods -l app.kubernetes.io/component=worker -o name 2>/dev/null); do
    echo "---- worker log: $p (last 200 lines)"
    "${kc[@]}" -n revault-system logs "$p" --tail=200 2>&1 || true
    if [ "$("${kc[@]}" -n revault-system get "$p" -o jsonpath='{.status.containerStatuses[0].restartCount}' 2>/dev/null)" != 0 ]; then
      echo "---- worker log: $p, previous container"
      "${kc[@]}" -n revault-system logs "$p" --previous --tail=100 2>&1 || true
    fi
  done
  for p in $("${kc[@]}" -n revault-system get pods -l revault.io/adopted -o name 2>/dev/null); do
    echo "---- adopted store log: $p (last 200 lines)"
    "${kc[@]}" -n revault-system logs "$p" --tail=200 2>&1 || true
  done
  echo "---- S3 server (revault-s3): pods and log (last 100 lines)"
  "${kc[@]}" -n revault-s3 get pods -o wide 2>&1 || true
  "${kc[@]}" -n revault-s3 logs deploy/s3 --tail=100 2>&1 || true
  echo "---- nodes"
  "${kc[@]}" get nodes -L revault.io/storage 2>&1 || true
  echo "---- events: revault-system"
  "${kc[@]}" -n revault-system get events --sort-by=.lastTimestamp 2>&1 | tail -40 || true
  for ns in $("${kc[@]}" get ns -l "revault.io/e2e-run=$RUN_ID" -o jsonpath='{.items[*].metadata.name}' 2>/dev/null); do
    echo "---- test namespace $ns: objects"
    "${kc[@]}" -n "$ns" get backupseries,retentionpolicies,restorejobs,jobs,pods,pvc -o wide 2>&1 || true
    echo "---- test namespace $ns: events"
    "${kc[@]}" -n "$ns" get events --sort-by=.lastTimestamp 2>&1 || true
  done
  echo "---- velero: objects and server log (last 200 lines)"
  "${kc[@]}" -n velero get backups,restores,backupstoragelocations,pods -o wide 2>&1 || true
  "${kc[@]}" -n velero logs deploy/velero --tail=200 2>&1 || true
  echo "==================== end of diagnostics ===================="
}

KCFG=""
diagnosed=0  # each group prints its own diagnostics when it fails
finish() {
  local rc=$? t_end
  [ $rc -eq 0 ] || [ $diagnosed = 1 ] || { [ -z "$KCFG" ] || diagnose; } >&2
  t_end=$(now)
  if [ "${KEEP:-}" = 1 ]; then
    log "KEEP=1: cluster $CLUSTER kept: export KUBECONFIG=$KCFG; hack/kind-down.sh removes it"
  else
    "$HACK_DIR/kind-down.sh" || log "WARNING: kind-down failed"
  fi
  log "$([ $rc -eq 0 ] && echo PASS || echo FAIL) in $(( $(now) - t0 ))s: build ${t_build_s:-?}s," \
      "cluster up ${t_up_s:-?}s, suite ${t_suite_s:-?}s, down $(( $(now) - t_end ))s" \
      "(junit: $ARTIFACTS/junit-upgrade.xml, $ARTIFACTS/junit.xml)"
  exit $rc
}
t_build_s=$(( t_build - t0 ))
trap finish EXIT

# Every spec's PVCs bind static local PVs, which only the next kind-up recycles: a run needs
# about 16, and on a kept cluster (KEEP=1) a failed run's namespaces still hold theirs until
# the next run's suite deletes them.
export KIND_LOCAL_PVS=${KIND_LOCAL_PVS:-40}
ARCHIVES=("$WORKER_ARCHIVE" "$OPERATOR_ARCHIVE" "$TOOL_ARCHIVE" "$VELERO_ARCHIVE" "$PLUGIN_ARCHIVE" "$S3_ARCHIVE")
t_up_s=0

# up ARCHIVE...: hack/kind-up.sh with these image archives (a healthy cluster of the name is reused).
up() {
  local t
  t=$(now)
  log "hack/kind-up.sh with $WORKER_IMAGE, $OPERATOR_IMAGE, $TOOL_IMAGE ($# image archives)"
  KCFG=$("$HACK_DIR/kind-up.sh" "$@" | tail -1)
  [ -s "$KCFG" ] || die "hack/kind-up.sh gave no kubeconfig"
  t_up_s=$(( t_up_s + $(now) - t ))
}

# suite GROUP LABEL-FILTER JUNIT: one run of the suite binary over the specs of a label filter.
suite() {
  local group=$1 filter=$2 junit=$3
  local args=(-ginkgo.v -ginkgo.timeout="${E2E_TIMEOUT:-45m}" -ginkgo.poll-progress-after=180s
              -ginkgo.label-filter="$filter" -ginkgo.junit-report="$ARTIFACTS/$junit")
  [ -z "${E2E_FOCUS:-}" ] || args+=(-ginkgo.focus="$E2E_FOCUS")
  log "running the suite, group $group (run $RUN_ID)"
  (cd "$ROOT/e2e" && KUBECONFIG=$KCFG E2E_GROUP=$group E2E_WORKER_IMAGE=$WORKER_IMAGE \
    E2E_OPERATOR_IMAGE=$OPERATOR_IMAGE E2E_TOOL_IMAGE=$TOOL_IMAGE E2E_CHART=$ROOT/charts/revault \
    E2E_HELM=$TOOLS_BIN/helm E2E_RUN_ID=$RUN_ID \
    E2E_PREVIOUS_CHART=${PREVIOUS_CHART:-} E2E_PREVIOUS_WORKER_IMAGE=${PREVIOUS_WORKER_IMAGE:-} \
    E2E_PREVIOUS_OPERATOR_IMAGE=${PREVIOUS_OPERATOR_IMAGE:-} \
    E2E_VELERO=$VELERO_BIN E2E_VELERO_IMAGE=$VELERO_IMAGE E2E_VELERO_PLUGIN_IMAGE=$PLUGIN_IMAGE \
    E2E_S3_IMAGE=$S3_IMAGE E2E_SPARE_NODE=$CLUSTER-worker3 \
    ./bin/e2e.test "${args[@]}")
}

rm -f "$ARTIFACTS/junit-upgrade.xml" "$ARTIFACTS/junit.xml"
t_suite_s=0
rc=0
# focused SPECS-LABEL-FILTER: does E2E_FOCUS leave any spec of the filter to run?
focused() {
  [ -n "${E2E_FOCUS:-}" ] || return 0
  local out
  out=$(cd "$ROOT/e2e" && ./bin/e2e.test -ginkgo.dry-run -ginkgo.label-filter="$1" -ginkgo.focus="$E2E_FOCUS" 2>&1) ||
    die "E2E_FOCUS='$E2E_FOCUS': the suite's dry run failed: $(tail -5 <<<"$out")"
  grep -q 'Ran [1-9][0-9]* of' <<<"$out"
}
ran_groups=0
# The group "upgrade" starts from the previous release on a cluster of its own, made for it and
# deleted after it: every other group then runs on a new cluster with this build installed
# fresh, so a first install is tested too. A kept cluster (KEEP=1 before) is reused for the
# other groups only.
if [ -z "$PREVIOUS_ENV" ]; then
  log "group upgrade SKIPPED: no previous release (see above)"
elif ! focused upgrade; then
  log "group upgrade: E2E_FOCUS selects none of its specs"
elif grep -qx "$CLUSTER" <<<"$(kind get clusters 2>/dev/null || true)"; then
  log "group upgrade SKIPPED: cluster $CLUSTER exists (kept): the group needs a new cluster"
else
  up "${ARCHIVES[@]}" "$PREVIOUS_WORKER_ARCHIVE" "$PREVIOUS_OPERATOR_ARCHIVE"
  ran_groups=$((ran_groups + 1))
  t2=$(now)
  suite upgrade upgrade junit-upgrade.xml || rc=$?
  t_suite_s=$(( $(now) - t2 ))
  [ $rc -eq 0 ] || diagnose >&2
  # Every other group runs even if this one failed.
  log "deleting the group upgrade's cluster; the other groups get a new one"
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || die "kind delete cluster --name $CLUSTER failed"
  KCFG=""  # diagnosed above; finish() has no cluster of this group to look at
fi
rc2=0
t2=$(now)
if focused '!upgrade'; then
  up "${ARCHIVES[@]}"
  ran_groups=$((ran_groups + 1))
  t2=$(now)
  suite main '!upgrade' junit.xml || rc2=$?
  [ $rc2 -eq 0 ] || diagnose >&2
else
  log "group main: E2E_FOCUS selects none of its specs"
fi
[ $rc -ne 0 ] || rc=$rc2
diagnosed=1
t_suite_s=$(( t_suite_s + $(now) - t2 ))
# A focus that selects nothing is a mistake, not a pass.
[ $ran_groups -gt 0 ] || die "E2E_FOCUS='${E2E_FOCUS:-}' selects no spec of any group"
exit $rc
