#!/usr/bin/env bash
# Install the Kubernetes tooling Revault's e2e/operator tests use, idempotently:
#   - Debian packages for the kind path (dockerd, debootstrap, ...) -- only the missing ones;
#   - kind, helm, controller-gen, ginkgo at pinned versions, `go install`ed from the Go module
#     proxy into $REVAULT_CACHE/bin (nothing is downloaded from release pages: there is no
#     internet here besides package registries).
# usage: hack/k8s-tools.sh          (prints one summary line when everything is present)
# Add $REVAULT_CACHE/bin (default ~/.cache/revault/bin) to PATH to use the tools.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# docker.io: dockerd + containerd + runc (kind runs nodes as containers; Debian's engine is
#   the only one reachable without a container registry or download site);
# debootstrap: the Debian rootfs the offline kind node image starts from;
# iptables: dockerd's networking; containernetworking-plugins: CNI plugins on the host
#   (the node image gets its own copy from Debian inside its build);
# python3: the runc-nosysres wrapper edits OCI JSON with it.
APT_PKGS=(docker.io debootstrap containernetworking-plugins iptables python3 curl)

missing=()
for p in "${APT_PKGS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  # There is no systemd here; Debian's policy-rc.d (if present) keeps postinst from starting
  # daemons. We start dockerd ourselves when needed (lib.sh ensure_dockerd).
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

# name|package to go install|pinned module version
TOOLS=(
  "kind|sigs.k8s.io/kind|$KIND_VERSION"
  "helm|helm.sh/helm/v3/cmd/helm|$HELM_VERSION"
  "controller-gen|sigs.k8s.io/controller-tools/cmd/controller-gen|$CONTROLLER_GEN_VERSION"
  "ginkgo|github.com/onsi/ginkgo/v2/ginkgo|$GINKGO_VERSION"
)
mkdir -p "$TOOLS_BIN"
summary=()
for t in "${TOOLS[@]}"; do
  IFS='|' read -r name pkg ver <<<"$t"
  # The binary records the module version it was built from; trust that, not a stamp file.
  have=$(go version -m "$TOOLS_BIN/$name" 2>/dev/null | awk '$1 == "mod" {print $3; exit}' || true)
  if [ "$have" != "$ver" ]; then
    log "go install $pkg@$ver${have:+ (had $have)}"
    # helm reports its version from an ldflag (otherwise "v3.22+unreleased").
    ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    GOBIN=$TOOLS_BIN CGO_ENABLED=0 go install -trimpath -ldflags "$ld" "$pkg@$ver" ||
      die "go install $pkg@$ver failed (the Go proxy is a filtered mirror: is $ver available?)"
  fi
  summary+=("$name $ver")
done

log "ok: ${summary[*]}; apt: ${APT_PKGS[*]} (bin: $TOOLS_BIN)"
