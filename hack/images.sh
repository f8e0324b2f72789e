#!/usr/bin/env bash
# Build Revault's container images from the static binaries, with no registry access, and save
# them as image archives (what `kind load image-archive`, `docker load` and
# `ctr -n k8s.io images import` take).
#
#   revault.local/revault:TAG            the worker image: the static `revault` binary (workers run
#                                        `revault serve`, backup/restore Jobs `revault push/pull`)
#   revault.local/revault-operator:TAG   the operator image: the static Go binary /manager
#
# The worker binary is a fully static glibc static-pie, not musl: RocksDB is C++ and Debian has no
# musl C++ toolchain (see worker/.cargo/config.toml). A static glibc binary runs on an empty base
# image all the same, DNS included (glibc's built-in files and dns resolvers; no NSS modules).
#
# usage: hack/images.sh        (`make images` builds the binaries first and runs this)
# env:   REVAULT_IMAGE_BUILDER  mkimage (default): hack/mkimage.py writes the archives directly,
#                               no daemon needed; docker: `docker build` of worker/Dockerfile and
#                               operator/Dockerfile (FROM scratch, so no registry either) and
#                               `docker save`. Both give the same filesystem and config.
#        REVAULT_IMAGE_REPO     repository prefix (default revault.local)
#        REVAULT_IMAGE_TAG      tag (default dev-<digest of the binaries>: every new build gets a
#                               new tag, so `helm upgrade` rolls the pods)
#        REVAULT_BIN            the worker binary (default: the release build under
#                               $CARGO_TARGET_DIR); the operator binary is operator/bin/manager
# Result: $REVAULT_CACHE/images/images.env (shell syntax: WORKER_IMAGE, WORKER_ARCHIVE,
#   OPERATOR_IMAGE, OPERATOR_ARCHIVE), whose path is the last line of stdout.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REVAULT_CACHE=${REVAULT_CACHE:-$HOME/.cache/revault}
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REVAULT_CACHE/target}
REVAULT_BIN=${REVAULT_BIN:-$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/revault}
OPERATOR_BIN=$ROOT/operator/bin/manager
BUILDER=${REVAULT_IMAGE_BUILDER:-mkimage}
REPO=${REVAULT_IMAGE_REPO:-revault.local}
OUT=$REVAULT_CACHE/images
STAGE=$OUT/stage

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: ERROR: %s\n' "$*" >&2; exit 1; }

case $BUILDER in mkimage|docker) ;; *) die "REVAULT_IMAGE_BUILDER must be mkimage or docker, got '$BUILDER'";; esac
[ -x "$REVAULT_BIN" ] || die "worker binary $REVAULT_BIN not found: run 'make build'"
[ -x "$OPERATOR_BIN" ] || die "operator binary $OPERATOR_BIN not found: run 'make build-operator'"
# Both images have nothing but the binary: it must not need a dynamic loader or libraries.
for b in "$REVAULT_BIN" "$OPERATOR_BIN"; do
  if readelf -lW "$b" | grep -q 'Requesting program interpreter'; then
    die "$b is dynamically linked; the images need static binaries"
  fi
done
start=$(date +%s)
mkdir -p "$STAGE/worker/rootfs/etc" "$STAGE/worker/rootfs/tmp" "$STAGE/operator"

# The worker binary carries line tables (for backtraces) that triple its size; the image gets
# a copy without them (symbols stay, so backtraces still name functions).
strip --strip-debug -o "$STAGE/worker/revault.new" "$REVAULT_BIN"
mv "$STAGE/worker/revault.new" "$STAGE/worker/revault"
cp "$OPERATOR_BIN" "$STAGE/operator/manager.new" && mv "$STAGE/operator/manager.new" "$STAGE/operator/manager"
# What mkimage.py puts in every image besides the binaries, for the docker build path.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  > "$STAGE/worker/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$STAGE/worker/rootfs/etc/group"
chmod 1777 "$STAGE/worker/rootfs/tmp"
rm -rf "$STAGE/operator/rootfs" && cp -a "$STAGE/worker/rootfs" "$STAGE/operator/rootfs"

digest() { cat "$@" | sha256sum | cut -c1-12; }
TAG=${REVAULT_IMAGE_TAG:-dev-$(digest "$STAGE/worker/revault" "$STAGE/operator/manager" \
  "$ROOT/worker/Dockerfile" "$ROOT/operator/Dockerfile" "$ROOT/hack/mkimage.py")}
WORKER_IMAGE=$REPO/revault:$TAG
OPERATOR_IMAGE=$REPO/revault-operator:$TAG
WORKER_ARCHIVE=$OUT/revault-$TAG.tar
OPERATOR_ARCHIVE=$OUT/revault-operator-$TAG.tar

# build NAME ARCHIVE COMPONENT ENTRYPOINT BINARY DEST
build() {
  local name=$1 archive=$2 comp=$3 entry=$4 bin=$5 dest=$6
  if [ -s "$archive" ] && [ "$(cat "$archive.builder" 2>/dev/null)" = "$BUILDER" ]; then
    log "ok: $name ($archive, cached)"; return 0
  fi
  case $BUILDER in
    mkimage)
      python3 "$ROOT/hack/mkimage.py" --label "org.opencontainers.image.title=$comp" \
        "$name" "$archive" "$entry" "$bin:$dest" >/dev/null ;;
    docker)
      docker build -q -t "$name" -f "$ROOT/$comp/Dockerfile" "$STAGE/$comp" >/dev/null ||
        die "docker build of $name failed"
      docker save -o "$archive.tmp" "$name" && mv "$archive.tmp" "$archive" ;;
  esac
  echo "$BUILDER" > "$archive.builder"
  log "built $name -> $archive ($(du -h "$archive" | cut -f1))"
}

if [ "$BUILDER" = docker ] && ! timeout 10 docker info >/dev/null 2>&1; then
  # No engine running: on our (root, Debian) machines start Debian's dockerd as the kind
  # scripts do; elsewhere the caller must provide one.
  [ "$(id -u)" -eq 0 ] || die "REVAULT_IMAGE_BUILDER=docker needs a running Docker engine"
  SCRIPT_NAME=images . "$ROOT/hack/lib.sh"
  ensure_dockerd
fi

build "$WORKER_IMAGE" "$WORKER_ARCHIVE" worker /usr/local/bin/revault "$STAGE/worker/revault" /usr/local/bin/revault
build "$OPERATOR_IMAGE" "$OPERATOR_ARCHIVE" operator /manager "$STAGE/operator/manager" /manager

# Keep the archives of the current build only (each is 10-30 MB).
find "$OUT" -maxdepth 1 -name 'revault*-dev-*.tar*' ! -name "*-$TAG.tar*" -delete

cat > "$OUT/images.env.new" <<EOF
WORKER_IMAGE=$WORKER_IMAGE
WORKER_ARCHIVE=$WORKER_ARCHIVE
OPERATOR_IMAGE=$OPERATOR_IMAGE
OPERATOR_ARCHIVE=$OPERATOR_ARCHIVE
EOF
mv "$OUT/images.env.new" "$OUT/images.env"
log "ok in $(( $(date +%s) - start ))s ($BUILDER): $WORKER_IMAGE $OPERATOR_IMAGE"
echo "$OUT/images.env"
