#!/usr/bin/env bash
# The Go client of the worker API, generated from worker/api/openapi.yaml with oapi-codegen: the
# one client the operator and the Velero plugin share (operator/pkg/workerclient; the plugin
# imports it through its replace of ../operator).
#
# usage: hack/worker-client.sh generate   write operator/pkg/workerclient/zz_generated.client.go
#                                         (make generate-client; part of make generate)
#        hack/worker-client.sh verify     generate into a scratch directory and diff with the
#                                         committed file; fails when it is stale (make lint-operator,
#                                         hack/operator-gen.sh verify)
#        hack/worker-client.sh install    only install oapi-codegen (path: last line)
#
# oapi-codegen is `go install`ed at OAPI_CODEGEN_VERSION (hack/lib.sh) into $REVAULT_CACHE/bin, as
# golangci-lint is by hack/go-lint.sh: its own go.mod (fixed for the tag, checked against the
# checksum database) pins what it is built from, so no tools module of ours has to. The runtime
# package the generated code imports is pinned in operator/go.mod.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$HACK_DIR/.." && pwd)
OAPI_CODEGEN=$TOOLS_BIN/oapi-codegen
PKG=operator/pkg/workerclient
SPEC=worker/api/openapi.yaml
OUT=zz_generated.client.go

install_oapi_codegen() {
  (
    with_lock oapi-codegen
    local have
    have=$(go version -m "$OAPI_CODEGEN" 2>/dev/null | awk '$1 == "mod" {print $3; exit}' || true)
    if [ "$have" != "$OAPI_CODEGEN_VERSION" ]; then
      log "go install oapi-codegen $OAPI_CODEGEN_VERSION${have:+ (had $have)}"
      mkdir -p "$TOOLS_BIN"
      GOBIN=$TOOLS_BIN CGO_ENABLED=0 go install -trimpath \
        "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@$OAPI_CODEGEN_VERSION" ||
        die "go install oapi-codegen@$OAPI_CODEGEN_VERSION failed (the Go proxy is a filtered mirror: is it available?)"
    fi
  )
}

# generate ROOT: the client from ROOT's spec into ROOT's package (the config names the output).
generate() {
  local root=$1
  (cd "$root/$PKG" && "$OAPI_CODEGEN" -config oapi-codegen.yaml "$root/$SPEC")
}

[ $# -eq 1 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
install_oapi_codegen
case "$1" in
  install) echo "$OAPI_CODEGEN" ;;
  generate)
    generate "$REPO"
    log "wrote $PKG/$OUT from $SPEC (oapi-codegen $OAPI_CODEGEN_VERSION)"
    ;;
  verify)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/$PKG" "$tmp/$(dirname "$SPEC")"
    cp "$REPO/$PKG/oapi-codegen.yaml" "$tmp/$PKG/"
    cp "$REPO/$SPEC" "$tmp/$SPEC"
    generate "$tmp"
    diff -u "$REPO/$PKG/$OUT" "$tmp/$PKG/$OUT" >&2 ||
      die "$PKG/$OUT is stale: run 'make generate-client' and commit the result"
    log "$PKG/$OUT is current (oapi-codegen $OAPI_CODEGEN_VERSION, $SPEC)"
    ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
