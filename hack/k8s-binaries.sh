#!/usr/bin/env bash
# Build the Kubernetes binaries Revault's tests need, from the Go module proxy (no downloads
# from anywhere else, no setup-envtest), and cache them in $REVAULT_CACHE/k8s/<version>/bin.
#
# usage: hack/k8s-binaries.sh [all|envtest|BINARY...]
#   all      (default) kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#            kubeadm kubectl etcd   -- everything the kind node image needs
#   envtest  only kube-apiserver, etcd, kubectl (what controller-runtime's envtest runs);
#            prints the KUBEBUILDER_ASSETS directory as the last line of stdout
#   BINARY   any of the names above
# Output: stdout's last line is the bin directory (use it as KUBEBUILDER_ASSETS).
# Cold: kube-apiserver ~5 min, the rest ~5 min more, etcd <1 min on 2 idle cores. Warm: <1 s.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_ALL=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm kubectl)
case "${1:-all}" in
  all)     want=("${K8S_ALL[@]}" etcd) ;;
  envtest) want=(kube-apiserver etcd kubectl) ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
  *)       want=("$@") ;;
esac

# A binary is "present" when it exists and was built by this recipe for this version; the
# stamp guards against a half-written file or a cache from an older pin.
STAMP_DIR=$K8S_BIN/.stamps
stamp_of() { echo "$K8S_VERSION etcd=$ETCD_VERSION recipe=1"; }
present() { [ -x "$K8S_BIN/$1" ] && [ "$(cat "$STAMP_DIR/$1" 2>/dev/null)" = "$(stamp_of)" ]; }

find_missing() {
  missing_k8s=() missing_etcd=0
  for b in "${want[@]}"; do
    if [ "$b" = etcd ]; then present etcd || missing_etcd=1; continue; fi
    [[ " ${K8S_ALL[*]} " == *" $b "* ]] || die "unknown binary '$b' (known: ${K8S_ALL[*]} etcd)"
    present "$b" || missing_k8s+=("$b")
  done
  [ ${#missing_k8s[@]} -gt 0 ] || [ $missing_etcd = 1 ]
}

mkdir -p "$K8S_BIN" "$STAMP_DIR" "$TOOLS_BIN"
# Another run (a parallel make target) may be building right now: wait for it, then look again.
if find_missing; then with_lock k8s-binaries; find_missing || true; fi
SRC=$REVAULT_CACHE/k8s/$K8S_VERSION/src
start=$(now)

if [ ${#missing_k8s[@]} -gt 0 ]; then
  # k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the k8s.io/* staging
  # modules with ./staging/... directories, which module mode ignores for dependencies. So
  # build from a throwaway module that requires k8s.io/kubernetes and replaces every staging
  # module with its published v0.X.Y release (same code, published from the staging tree).
  mkdir -p "$SRC/kube"
  cd "$SRC/kube"
  if [ ! -f go.sum ] || ! grep -q "^require k8s.io/kubernetes $K8S_VERSION$" go.mod 2>/dev/null; then
    log "resolving k8s.io/kubernetes@$K8S_VERSION modules (first time: downloads ~1 GB of modules)"
    modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
    [ -f "$modfile" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION from the Go proxy"
    staging_v=v0.${K8S_VERSION#v1.}
    {
      printf 'module revault.local/k8sbuild\n\ngo 1.24.0\n\n'
      # k8s 1.33 is built with go1.24 semantics; keep its GODEBUG defaults with a newer go.
      printf 'godebug default=go1.24\n\nrequire k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
      awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$modfile" | sort -u |
        while read -r m; do printf 'replace %s => %s %s\n' "$m" "$m" "$staging_v"; done
    } > go.mod
    {
      printf '//go:build tools\n\npackage k8sbuild\n\nimport (\n'
      for c in "${K8S_ALL[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
      printf ')\n'
    } > tools.go
    rm -f go.sum
    go mod tidy || die "go mod tidy failed for the k8s build module ($SRC/kube)"
  fi
  # What `kubectl version`, kubelet's node status and kubeadm's image tags report. kubeadm
  # derives the control-plane image tags from this, so it must be the real version.
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  log "building ${missing_k8s[*]} $K8S_VERSION (cold: several minutes per binary on 2 cores)"
  tmp=$(mktemp -d "$K8S_BIN/.build.XXXXXX")
  pkgs=(); for c in "${missing_k8s[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # One `go build` for all packages: shared packages compile once and in parallel.
  CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/" "${pkgs[@]}" ||
    { rm -rf "$tmp"; die "go build of ${missing_k8s[*]} failed"; }
  for c in "${missing_k8s[@]}"; do
    mv -f "$tmp/$c" "$K8S_BIN/$c" && stamp_of > "$STAMP_DIR/$c"
  done
  rm -rf "$tmp"
fi

if [ $missing_etcd = 1 ]; then
  # etcd's server module is installable as a main package but pins nothing for us; a tiny
  # module keeps the exact version and a go.sum.
  mkdir -p "$SRC/etcd"
  cd "$SRC/etcd"
  if [ ! -f go.sum ] || ! grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION$" go.mod 2>/dev/null; then
    log "resolving etcd $ETCD_VERSION modules"
    printf 'module revault.local/etcdbuild\n\ngo 1.23\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
    printf '//go:build tools\n\npackage etcdbuild\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    rm -f go.sum
    go mod tidy || die "go mod tidy failed for the etcd build module ($SRC/etcd)"
  fi
  log "building etcd $ETCD_VERSION"
  CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$K8S_BIN/.etcd.tmp" go.etcd.io/etcd/server/v3 ||
    die "go build of etcd failed"
  mv -f "$K8S_BIN/.etcd.tmp" "$K8S_BIN/etcd" && stamp_of > "$STAMP_DIR/etcd"
fi

# One PATH entry for every tool: expose our kubectl next to kind/helm (the distro's kubectl,
# if any, may be another version).
[ ! -x "$K8S_BIN/kubectl" ] || ln -sfn "$K8S_BIN/kubectl" "$TOOLS_BIN/kubectl"

if [ ${#missing_k8s[@]} -gt 0 ] || [ $missing_etcd = 1 ]; then
  log "built in $(( $(now) - start ))s: ${missing_k8s[*]} $([ $missing_etcd = 1 ] && echo etcd)"
else
  log "ok: ${want[*]} present ($K8S_VERSION, etcd $ETCD_VERSION)"
fi
echo "$K8S_BIN"
