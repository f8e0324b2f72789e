#!/usr/bin/env bash
# Lint Revault's Go modules: gofmt, go vet, and golangci-lint with the shared .golangci.yml.
#
# usage: hack/go-lint.sh MODULE...   e.g. operator e2e velero-plugin (make lint-operator,
#                                    lint-e2e, lint-velero); fails on the first module with findings
#        hack/go-lint.sh install     only install golangci-lint (path: last line)
#
# golangci-lint is `go install`ed at GOLANGCI_LINT_VERSION (hack/lib.sh) into $REVAULT_CACHE/bin,
# like the tools of k8s-tools.sh: there are no release downloads here, and golangci-lint refuses
# to load code for a Go newer than the one it was built with, so it is built with the local Go
# and rebuilt when either changes. Its own go.mod (fixed for the tag, checked against the
# checksum database) pins what it is built from, so no tools module of ours has to.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$HACK_DIR/.." && pwd)
GOLANGCI_LINT=$TOOLS_BIN/golangci-lint
# Its analysis cache, under REVAULT_CACHE with the others (default: ~/.cache/golangci-lint).
export GOLANGCI_LINT_CACHE=${GOLANGCI_LINT_CACHE:-$REVAULT_CACHE/golangci-lint}

install_golangci_lint() {
  # The lint targets may run in parallel (make -j lint): one of them installs, the others wait.
  # A subshell, so the lock goes when the install is done, not when the lint is.
  (
    with_lock golangci-lint
    local have built go_now
    have=$(go version -m "$GOLANGCI_LINT" 2>/dev/null | awk '$1 == "mod" {print $3; exit}' || true)
    built=$(go version "$GOLANGCI_LINT" 2>/dev/null | awk '{print $2}' || true)
    go_now=$(go env GOVERSION)
    if [ "$have" != "$GOLANGCI_LINT_VERSION" ] || [ "$built" != "$go_now" ]; then
      log "go install golangci-lint $GOLANGCI_LINT_VERSION with $go_now${have:+ (had $have, $built)}; a few minutes the first time"
      mkdir -p "$TOOLS_BIN"
      GOBIN=$TOOLS_BIN CGO_ENABLED=0 go install -trimpath \
        "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" ||
        die "go install golangci-lint@$GOLANGCI_LINT_VERSION failed (the Go proxy is a filtered mirror: is it available?)"
    fi
  )
}

lint_module() {
  local mod=$1 dir=$REPO/$1 out
  [ -f "$dir/go.mod" ] || die "$mod is not a Go module (no $dir/go.mod)"
  out=$(cd "$dir" && gofmt -l .)
  [ -z "$out" ] || die "gofmt: needs formatting in $mod: $out"
  (cd "$dir" && go vet ./...)
  (cd "$dir" && "$GOLANGCI_LINT" run --config "$REPO/.golangci.yml" ./...)
  log "ok: $mod (gofmt, go vet, golangci-lint $GOLANGCI_LINT_VERSION)"
}

[ $# -gt 0 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
install_golangci_lint
if [ "$1" = install ]; then
  echo "$GOLANGCI_LINT"
  exit 0
fi
for m in "$@"; do
  lint_module "$m"
done
