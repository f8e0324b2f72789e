#!/usr/bin/env bash
# Provide a kind node image that works WITHOUT a container registry, and print its reference as
# the last line of stdout (hack/kind-up.sh passes it to `kind create cluster --image`).
#
# Which image, first match wins:
#   1. $REVAULT_KIND_IMAGE, if set (pulled if not present): force any node image.
#   2. revault.local/kind-node:<k8s version>, if dockerd has it with the current recipe label,
#      or if its archive is cached in $REVAULT_CACHE/kind/ (then `docker load`, ~30 s).
#   3. kind's own default node image, if it is present or a registry is reachable (a 5 s probe;
#      REVAULT_KIND_OFFLINE=1 skips it).
#   4. Otherwise build revault.local/kind-node from scratch, offline (cold: 10-20 min):
#      debootstrap'ed Debian rootfs -> `docker import` -> kind's base files (from the
#      sigs.k8s.io/kind module) + Debian's systemd/containerd/runc/CNI plugins -> our kubeadm,
#      kubelet, kubectl -> every image kubeadm needs (made from our static binaries with
#      hack/mkimage.py) preloaded into the node's containerd -> archive cached.
# Images of type 2/4 carry the label io.revault.kind-node=offline: kind-up.sh then installs its
# own CNI and local PVs (the default kindnet and local-path-provisioner images are not there).
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODE_REPO=revault.local/kind-node
NODE_IMAGE=$NODE_REPO:$K8S_VERSION
DEBIAN_IMAGE=revault.local/debian:bookworm
DEBIAN_MIRROR=${REVAULT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Bump when the build logic below changes in a way the hashed inputs don't show.
RECIPE_REV=1

# Everything that determines the image's content -> a short hash: a changed Dockerfile or pin
# rebuilds the image instead of silently reusing a stale archive.
recipe=$( { echo "$RECIPE_REV $K8S_VERSION $ETCD_VERSION $COREDNS_VERSION $KIND_VERSION"
            cat "$HACK_DIR"/kind/*.Dockerfile "$HACK_DIR"/kind/pause/main.go "$HACK_DIR/mkimage.py"
          } | sha256sum | cut -c1-12)
ARCHIVE=$KIND_CACHE/kind-node-$K8S_VERSION-$recipe.tar

image_recipe() { docker image inspect -f '{{index .Config.Labels "io.revault.recipe"}}' "$1" 2>/dev/null || true; }

ensure_dockerd

# 1. forced image
if [ -n "${REVAULT_KIND_IMAGE:-}" ]; then
  if ! docker image inspect "$REVAULT_KIND_IMAGE" >/dev/null 2>&1; then
    log "pulling $REVAULT_KIND_IMAGE (REVAULT_KIND_IMAGE)"
    docker pull "$REVAULT_KIND_IMAGE" >&2 || die "cannot pull REVAULT_KIND_IMAGE=$REVAULT_KIND_IMAGE"
  fi
  echo "$REVAULT_KIND_IMAGE"; exit 0
fi

# 2. our offline image, already loaded or cached as an archive
if [ "$(image_recipe "$NODE_IMAGE")" = "$recipe" ]; then
  log "ok: $NODE_IMAGE present (recipe $recipe)"
  echo "$NODE_IMAGE"; exit 0
fi
with_lock kind-node-image
if [ -f "$ARCHIVE" ]; then
  log "docker load $ARCHIVE"
  docker load -q -i "$ARCHIVE" >&2 || die "docker load $ARCHIVE failed (delete it to rebuild)"
  [ "$(image_recipe "$NODE_IMAGE")" = "$recipe" ] || die "$ARCHIVE did not contain $NODE_IMAGE recipe $recipe"
  echo "$NODE_IMAGE"; exit 0
fi

# 3. kind's default image where a registry can serve it
kind_src() {
  go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p'
}
KIND_DIR=$(kind_src) || true
[ -d "${KIND_DIR:-/nonexistent}" ] || die "cannot get sigs.k8s.io/kind@$KIND_VERSION from the Go proxy"
default_image=$(sed -n 's/^const Image = "\(.*\)"$/\1/p' "$KIND_DIR/pkg/apis/config/defaults/image.go")
if [ -n "$default_image" ] && docker image inspect "$default_image" >/dev/null 2>&1; then
  log "ok: kind's default image $default_image present"
  echo "$default_image"; exit 0
fi
if [ -n "$default_image" ] && [ "${REVAULT_KIND_OFFLINE:-0}" != 1 ]; then
  # Cheap reachability test: Docker Hub's API root answers 401 (or 200) when reachable; here it
  # usually fails at DNS within milliseconds. Only then pay for the real (large) pull.
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 https://registry-1.docker.io/v2/ || true)
  if [ "$code" = 401 ] || [ "$code" = 200 ]; then
    log "registry reachable: pulling kind's default image $default_image"
    if docker pull "$default_image" >&2; then echo "$default_image"; exit 0; fi
    log "pull failed; building the offline image instead"
  else
    log "no container registry reachable: building the offline node image"
  fi
fi

# 4. build offline
start=$(now)
W=$KIND_CACHE/build        # docker build context + image tarballs (scratch, kept for debugging)
rm -rf "$W"; mkdir -p "$W/base" "$W/node" "$W/kube-proxy" "$W/imgs" "$KIND_CACHE/bin"

# 4a. Debian rootfs -> docker image. debootstrap only needs the Debian mirror (a package
# registry); the directory is cached so a rebuild skips the ~2-3 min it takes.
ROOTFS=$KIND_CACHE/rootfs/bookworm
if ! docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
  if [ ! -x "$ROOTFS/bin/bash" ]; then
    need_cmd debootstrap hack/k8s-tools.sh
    log "debootstrap bookworm from $DEBIAN_MIRROR (2-3 min)"
    rm -rf "$ROOTFS.tmp"; mkdir -p "$(dirname "$ROOTFS")"
    debootstrap --variant=minbase bookworm "$ROOTFS.tmp" "$DEBIAN_MIRROR" >"$KIND_CACHE/debootstrap.log" 2>&1 ||
      { tail -20 "$KIND_CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $KIND_CACHE/debootstrap.log)"; }
    rm -rf "$ROOTFS"; mv "$ROOTFS.tmp" "$ROOTFS"
  fi
  log "docker import $DEBIAN_IMAGE"
  tar -C "$ROOTFS" -c . | docker import - "$DEBIAN_IMAGE" >/dev/null
fi

# The legacy builder: the docker CLI here has no buildx plugin, and nothing below needs BuildKit.
build() { # TAG DOCKERFILE CONTEXT FROM-IMAGE [--build-arg ...]
  local tag=$1 df=$2 ctx=$3 from=$4; shift 4
  log "docker build $tag"
  DOCKER_BUILDKIT=0 docker build -t "$tag" -f "$df" --build-arg "BASE_IMAGE=$from" "$@" "$ctx" \
    >"$KIND_CACHE/docker-build.log" 2>&1 ||
    { tail -30 "$KIND_CACHE/docker-build.log" >&2; die "docker build $tag failed (log: $KIND_CACHE/docker-build.log)"; }
}

# 4b. kind base image: kind's own files (entrypoint, systemd units, containerd config).
BASE_IMAGE=revault.local/kind-base:$recipe
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  cp -r "$KIND_DIR/images/base/files" "$W/base/files"; chmod -R u+w "$W/base/files"
  build "$BASE_IMAGE" "$HACK_DIR/kind/base.Dockerfile" "$W/base" "$DEBIAN_IMAGE"
fi

# 4c. the Kubernetes binaries (a no-op when cached), then every image kubeadm will ask for,
#     named exactly as kubeadm expects them.
"$HACK_DIR/k8s-binaries.sh" all >/dev/null
mapfile -t wanted < <("$K8S_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)
[ ${#wanted[@]} -ge 6 ] || die "kubeadm config images list gave: ${wanted[*]}"
if [ ! -x "$KIND_CACHE/bin/coredns" ] ||
   ! go version -m "$KIND_CACHE/bin/coredns" 2>/dev/null | grep -q "mod.*github.com/coredns/coredns.*$COREDNS_VERSION"; then
  log "go install coredns $COREDNS_VERSION"
  GOBIN=$KIND_CACHE/bin CGO_ENABLED=0 go install -trimpath -ldflags '-s -w' "github.com/coredns/coredns@$COREDNS_VERSION" ||
    die "go install github.com/coredns/coredns@$COREDNS_VERSION failed"
fi
log "go build pause"
(cd "$HACK_DIR/kind/pause" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$KIND_CACHE/bin/pause" main.go)

mk() { python3 "$HACK_DIR/mkimage.py" "$@" >/dev/null || die "mkimage.py $1 failed"; }
for ref in "${wanted[@]}"; do
  name=${ref##*/}; name=${name%%:*}          # registry.k8s.io/kube-apiserver:v1.33.13 -> kube-apiserver
  out=$W/imgs/$name.tar
  case $name in
    kube-apiserver|kube-controller-manager|kube-scheduler|etcd)
      # Static pods run the binary by name and read root-owned PKI: root, binary on PATH.
      mk --user 0:0 "$ref" "$out" "/usr/local/bin/$name" "$K8S_BIN/$name:/usr/local/bin/$name" ;;
    coredns)
      # Root instead of upstream's file capability for binding :53 (mkimage sets no xattrs).
      [ "${ref##*:}" = "$COREDNS_VERSION" ] || die "kubeadm wants $ref but COREDNS_VERSION=$COREDNS_VERSION"
      mk --user 0:0 "$ref" "$out" /coredns "$KIND_CACHE/bin/coredns:/coredns" ;;
    pause)
      mk --user 65535:65535 "$ref" "$out" /pause "$KIND_CACHE/bin/pause:/pause" ;;
    kube-proxy)
      cp "$K8S_BIN/kube-proxy" "$W/kube-proxy/"
      build "$ref" "$HACK_DIR/kind/kube-proxy.Dockerfile" "$W/kube-proxy" "$DEBIAN_IMAGE"
      docker save -o "$out" "$ref" ;;
    *) die "don't know how to make image $ref (kubeadm $K8S_VERSION wants it)" ;;
  esac
done
log "control-plane images: $(cd "$W/imgs" && echo *.tar)"

# 4d. node image = base + kube binaries, then preload the images into its containerd. This
# VM lacks CAP_SYS_RESOURCE: containerd must clamp oom_score_adj instead of failing.
cp "$K8S_BIN/kubeadm" "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$W/node/"
sed 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
  "$KIND_DIR/images/base/files/etc/containerd/config.toml" > "$W/node/config.toml"
grep -q 'restrict_oom_score_adj = true' "$W/node/config.toml" || die "kind's containerd config changed: cannot set restrict_oom_score_adj"
PRE_IMAGE=revault.local/kind-node-pre:$recipe
build "$PRE_IMAGE" "$HACK_DIR/kind/node.Dockerfile" "$W/node" "$BASE_IMAGE" --build-arg "K8S_VERSION=$K8S_VERSION"

log "preloading images into the node's containerd"
ctr_name=revault-kind-node-build
docker rm -f "$ctr_name" >/dev/null 2>&1 || true
# --no-unpack: unpacking needs an overlay snapshotter, which does not nest on the image's
# overlayfs; kind's containerd unpacks on first use (discard_unpacked_layers is on anyway).
docker run --name "$ctr_name" --privileged -v "$W/imgs:/imgs:ro" --entrypoint /bin/bash "$PRE_IMAGE" -c '
  containerd >/tmp/containerd.log 2>&1 &
  for i in $(seq 30); do ctr version >/dev/null 2>&1 && break; sleep 1; done
  for t in /imgs/*.tar; do ctr -n k8s.io images import --no-unpack --all-platforms "$t" >/dev/null || exit 1; done
  ctr -n k8s.io images ls -q
  kill %1; wait' >"$KIND_CACHE/preload.log" 2>&1 ||
  { cat "$KIND_CACHE/preload.log" >&2; die "preloading images into the node image failed"; }
for ref in "${wanted[@]}"; do
  grep -qx "$ref" "$KIND_CACHE/preload.log" || die "image $ref missing after preload (see $KIND_CACHE/preload.log)"
done
docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change "LABEL io.revault.kind-node=offline io.revault.recipe=$recipe" \
  "$ctr_name" "$NODE_IMAGE" >/dev/null
docker rm "$ctr_name" >/dev/null
docker rmi "$PRE_IMAGE" >/dev/null 2>&1 || true

# 4e. cache the image so a later run (or a fresh dockerd) only `docker load`s it.
log "docker save -> $ARCHIVE"
rm -f "$KIND_CACHE"/kind-node-*.tar       # older recipes are stale
docker save -o "$ARCHIVE.tmp" "$NODE_IMAGE" && mv "$ARCHIVE.tmp" "$ARCHIVE"
rm -rf "$W"
log "built $NODE_IMAGE in $(( $(now) - start ))s ($(du -h "$ARCHIVE" | cut -f1) archive)"
echo "$NODE_IMAGE"
