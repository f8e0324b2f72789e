#!/usr/bin/env bash
# Fetches k8s.io/kubernetes v1.30.0 ... v1.30.9 (the root module plus its staging
# modules, without vendor/) from the Go module proxy and writes one
# deterministic tar per version: sorted names, owner 0:0, mtime 0, mode u+rw.
# Output: $REVAULT_CACHE/datasets/kube/v1.30.N.tar; prints that directory last.
# Idempotent: versions already tarred are skipped.
set -euo pipefail
CACHE=${REVAULT_CACHE:-$HOME/.cache/revault}
OUT=$CACHE/datasets/kube
VERSIONS=${KUBE_VERSIONS:-"0 1 2 3 4 5 6 7 8 9"}
export GOMODCACHE=$CACHE/datasets/gomod GOFLAGS=-modcacherw GOSUMDB=off GOTOOLCHAIN=local
export PATH=/usr/local/go/bin:$PATH
log() { echo "kube-series: $*" >&2; }
trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR
command -v go >/dev/null || { log "go is required (the Go module proxy is where the data comes from)"; exit 1; }
mkdir -p "$OUT"

# The staging modules the module proxy serves for all ten versions (the filtered
# mirror here refuses some versions of the others, e.g. k8s.io/sample-cli-plugin
# v0.30.1). Pinned so that every machine builds the same series.
STAGING="k8s.io/api k8s.io/apiextensions-apiserver k8s.io/apimachinery k8s.io/apiserver
  k8s.io/cli-runtime k8s.io/client-go k8s.io/code-generator k8s.io/component-base
  k8s.io/component-helpers k8s.io/cri-api k8s.io/kms k8s.io/kube-aggregator k8s.io/kubectl
  k8s.io/kubelet"

for n in $VERSIONS; do
  tarball=$OUT/v1.30.$n.tar
  [ -s "$tarball" ] && continue
  log "fetching k8s.io/kubernetes v1.30.$n"
  root=$(cd /tmp && go mod download -json "k8s.io/kubernetes@v1.30.$n" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d "$OUT/.build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/kubernetes"
  cp -a --no-preserve=ownership "$root/." "$work/kubernetes/"
  for m in $STAGING; do
    dir=$(cd /tmp && go mod download -json "$m@v0.30.$n" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir",""))')
    [ -n "$dir" ] || { log "cannot download $m@v0.30.$n"; exit 1; }
    mkdir -p "$work/kubernetes/staging/src/$m"
    cp -a --no-preserve=ownership "$dir/." "$work/kubernetes/staging/src/$m/"
  done
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=u+rw,go+r \
      --hard-dereference --exclude=kubernetes/vendor -cf "$tarball.tmp" -C "$work" kubernetes
  mv "$tarball.tmp" "$tarball"
  rm -rf "$work"; trap - EXIT
  log "wrote $tarball ($(du -m "$tarball" | cut -f1) MiB)"
done
echo "$OUT"
