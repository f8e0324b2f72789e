#!/usr/bin/env bash
# The operator's tests (make test-operator):
#   1. generated files (deepcopy, CRDs, RBAC, the chart's copies, the worker API's client) are current;
#   2. helm lint of charts/revault;
#   3. go test ./... in operator/: unit tests, and the Ginkgo envtest suite, which runs the
#      controllers against a real kube-apiserver + etcd (built by hack/k8s-binaries.sh, never
#      downloaded) with real `revault serve` workers on loopback, and applies the chart's and
#      config/'s manifests to that API server with a server-side dry run.
# Needs $REVAULT_BIN (the revault binary: make build) and the tools of hack/k8s-tools.sh; the
# workers' remote is a versitygw on loopback (hack/s3-server.sh, installed here).
# Extra arguments go to `go test` (e.g. -run TestControllers -ginkgo.focus=RestoreJob).
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$HACK_DIR/.." && pwd)
REVAULT_BIN=${REVAULT_BIN:-$REVAULT_CACHE/target/x86_64-unknown-linux-gnu/release/revault}
[ -x "$REVAULT_BIN" ] || die "no revault binary at $REVAULT_BIN: run make build"
"$REVAULT_BIN" serve --help >/dev/null 2>&1 || die "$REVAULT_BIN has no 'serve' command: rebuild it (make build)"
need_cmd helm hack/k8s-tools.sh
export REVAULT_BIN
REVAULT_S3_SERVER=$("$HACK_DIR/s3-server.sh" install | tail -1)
export REVAULT_S3_SERVER

start=$(now)
"$HACK_DIR/operator-gen.sh" verify
"$HACK_DIR/worker-client.sh" verify

log "helm lint charts/revault"
helm lint "$REPO/charts/revault" --strict --kube-version "${K8S_VERSION#v}" >&2

KUBEBUILDER_ASSETS=$("$HACK_DIR/k8s-binaries.sh" envtest | tail -1)
export KUBEBUILDER_ASSETS
log "go test ./... (KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS)"
cd "$REPO/operator"
go test ./... -count=1 -timeout 30m "$@"
log "ok in $(( $(now) - start )) s"
