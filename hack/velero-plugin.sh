#!/usr/bin/env bash
# Revault's Velero plugin (velero-plugin/, its own Go module on Velero v1.18.3).
#
# usage: hack/velero-plugin.sh build   static plugin binary -> $REVAULT_CACHE/velero/bin/velero-plugin-revault
#        hack/velero-plugin.sh image   the plugin image as an archive, no registry:
#                                      revault.local/velero-plugin-revault:TAG (REVAULT_IMAGE_REPO,
#                                      REVAULT_IMAGE_TAG override); its entrypoint copies the binary to
#                                      /target, as Velero's plugin init containers must
#                                      result: $REVAULT_CACHE/images/velero-plugin.env (PLUGIN_IMAGE,
#                                      PLUGIN_ARCHIVE), its path the last line of stdout
#        hack/velero-plugin.sh test [ARGS]  gofmt and go vet, then go test ./... with a real
#                                      `revault serve` ($REVAULT_BIN, make build) and envtest
#                                      (hack/k8s-binaries.sh); ARGS go to go test
#        hack/velero-plugin.sh velero  Velero itself (server and CLI are one binary), built from the
#                                      Go module github.com/vmware-tanzu/velero $VELERO_VERSION
#                                      -> $REVAULT_CACHE/velero/bin/velero (path: last line)
#        hack/velero-plugin.sh e2e-images   the Velero image (revault.local/velero:VERSION-DIGEST,
#                                      from that binary) and the plugin image, as archives for
#                                      hack/e2e.sh; result: $REVAULT_CACHE/images/velero.env
#                                      (VELERO_BIN, VELERO_IMAGE, VELERO_ARCHIVE, PLUGIN_IMAGE,
#                                      PLUGIN_ARCHIVE), its path the last line of stdout
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$HACK_DIR/.." && pwd)
MOD=$REPO/velero-plugin
OUT=$REVAULT_CACHE/velero
BIN=$OUT/bin/velero-plugin-revault

build() {
  mkdir -p "$OUT/bin"
  log "building $BIN"
  (cd "$MOD" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN.new" .)
  mv "$BIN.new" "$BIN"
}

image() {
  build
  local repo=${REVAULT_IMAGE_REPO:-revault.local} images=$REVAULT_CACHE/images tag name archive
  tag=${REVAULT_IMAGE_TAG:-dev-$(cat "$BIN" "$HACK_DIR/mkimage.py" | sha256sum | cut -c1-12)}
  name=$repo/velero-plugin-revault:$tag
  archive=$images/velero-plugin-revault-$tag.tar
  mkdir -p "$images"
  if [ ! -s "$archive" ]; then
    python3 "$HACK_DIR/mkimage.py" --label org.opencontainers.image.title=velero-plugin-revault \
      "$name" "$archive.new" '["/plugins/velero-plugin-revault","install","/target"]' \
      "$BIN:/plugins/velero-plugin-revault" >/dev/null
    mv "$archive.new" "$archive"
    find "$images" -maxdepth 1 -name 'velero-plugin-revault-dev-*.tar' ! -name "*-$tag.tar" -delete
    log "built $name -> $archive ($(du -h "$archive" | cut -f1))"
  else
    log "ok: $name ($archive, cached)"
  fi
  printf 'PLUGIN_IMAGE=%s\nPLUGIN_ARCHIVE=%s\n' "$name" "$archive" > "$images/velero-plugin.env.new"
  mv "$images/velero-plugin.env.new" "$images/velero-plugin.env"
  echo "$images/velero-plugin.env"
}

# The Velero release the plugin is built against (velero-plugin/go.mod) and the e2e suite runs.
VELERO_VERSION=v1.18.3
# Velero's go.mod replaces kopia with its fork; a module that builds Velero must do the same
# (replace directives of dependencies are ignored). Kubernetes modules are pinned to the
# release the proxy serves (Velero asks for v0.33.12, which the proxy refuses for some).
VELERO_KOPIA=github.com/project-velero/kopia@v0.0.0-20251230033609-d946b1e75197
VELERO_K8S=v0.33.13
VELERO_BIN=$OUT/bin/velero

velero_build() {
  local src=$OUT/src stamp="$VELERO_VERSION $VELERO_KOPIA $VELERO_K8S" start m
  if [ -x "$VELERO_BIN" ] && [ "$(cat "$VELERO_BIN.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "ok: $VELERO_BIN (Velero $VELERO_VERSION, cached)"
    return
  fi
  start=$(now)
  mkdir -p "$src" "$OUT/bin"
  # A throwaway module: `go install ...@version` refuses modules with replace directives.
  printf 'module revault.local/velero-build\n\ngo 1.26.0\n\nrequire github.com/vmware-tanzu/velero %s\n\nreplace github.com/kopia/kopia => %s %s\n' \
    "$VELERO_VERSION" "${VELERO_KOPIA%@*}" "${VELERO_KOPIA#*@}" > "$src/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/vmware-tanzu/velero/cmd/velero"\n' > "$src/tools.go"
  for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go component-base kube-aggregator metrics; do
    (cd "$src" && go mod edit -require="k8s.io/$m@$VELERO_K8S")
  done
  log "building Velero $VELERO_VERSION from its Go module (a few minutes the first time)"
  (cd "$src" && go mod tidy && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=$VELERO_VERSION" \
      -o "$VELERO_BIN.new" github.com/vmware-tanzu/velero/cmd/velero)
  mv "$VELERO_BIN.new" "$VELERO_BIN"
  echo "$stamp" > "$VELERO_BIN.stamp"
  log "built $VELERO_BIN in $(( $(now) - start )) s"
}

e2e_images() {
  image >/dev/null
  velero_build
  local images=$REVAULT_CACHE/images name archive tag
  tag=$VELERO_VERSION-$(cat "$VELERO_BIN" "$HACK_DIR/mkimage.py" | sha256sum | cut -c1-8)
  name=${REVAULT_IMAGE_REPO:-revault.local}/velero:$tag
  archive=$images/velero-$tag.tar
  if [ ! -s "$archive" ]; then
    # Velero's Deployment runs /velero server; its plugin manager runs /velero run-plugins for
    # the built-in plugins, next to the binaries the init containers copied to /plugins.
    python3 "$HACK_DIR/mkimage.py" --label org.opencontainers.image.title=velero \
      "$name" "$archive.new" /velero "$VELERO_BIN:/velero" >/dev/null
    mv "$archive.new" "$archive"
    find "$images" -maxdepth 1 -name 'velero-v*.tar' ! -name "velero-$tag.tar" -delete
    log "built $name -> $archive ($(du -h "$archive" | cut -f1))"
  else
    log "ok: $name ($archive, cached)"
  fi
  local PLUGIN_IMAGE PLUGIN_ARCHIVE
  # shellcheck source=/dev/null
  . "$images/velero-plugin.env"
  printf 'VELERO_BIN=%s\nVELERO_IMAGE=%s\nVELERO_ARCHIVE=%s\nPLUGIN_IMAGE=%s\nPLUGIN_ARCHIVE=%s\n' \
    "$VELERO_BIN" "$name" "$archive" "$PLUGIN_IMAGE" "$PLUGIN_ARCHIVE" > "$images/velero.env.new"
  mv "$images/velero.env.new" "$images/velero.env"
  echo "$images/velero.env"
}

test_plugin() {
  local start; start=$(now)
  REVAULT_BIN=${REVAULT_BIN:-$REVAULT_CACHE/target/x86_64-unknown-linux-gnu/release/revault}
  [ -x "$REVAULT_BIN" ] || die "no revault binary at $REVAULT_BIN: run make build"
  export REVAULT_BIN
  local out
  out=$(cd "$MOD" && gofmt -l .)
  [ -z "$out" ] || die "gofmt: needs formatting: $out"
  (cd "$MOD" && go vet ./...)
  KUBEBUILDER_ASSETS=$("$HACK_DIR/k8s-binaries.sh" envtest | tail -1)
  export KUBEBUILDER_ASSETS
  log "go test ./... in velero-plugin (KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS)"
  (cd "$MOD" && go test ./... -count=1 -timeout 20m "$@")
  log "ok in $(( $(now) - start )) s"
}

case "${1:-}" in
  build) build; echo "$BIN" ;;
  image) image ;;
  test) shift; test_plugin "$@" ;;
  velero) velero_build; echo "$VELERO_BIN" ;;
  e2e-images) e2e_images ;;
  *) die "usage: $0 build|image|test [go test args]|velero|e2e-images" ;;
esac
