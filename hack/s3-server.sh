#!/usr/bin/env bash
# The S3-compatible server the durable tier is tested against: versitygw (Versity S3 Gateway,
# Apache-2.0) with its POSIX backend, built from the Go module proxy at VERSITYGW_VERSION
# (hack/lib.sh) into $REVAULT_CACHE/bin. MinIO's community edition is archived; versitygw is a
# single static binary, keeps objects as plain files, and implements conditional writes and
# Object Lock, which the remote uses.
#
# usage: hack/s3-server.sh install   install it if missing (path: last line); idempotent
#        hack/s3-server.sh e2e-image     the server as an image archive for the kind cluster (no
#                                    registry; hack/mkimage.py): path of its .env file, last line
#        hack/s3-server.sh run DIR [ADDR]
#                                    serve DIR/root (object versions in DIR/versions) on ADDR (default 127.0.0.1:7070) in the
#                                    foreground, with the test credentials below
#
# Tests start their own servers (worker/remote/tests) from the installed binary; they find it
# at $REVAULT_S3_SERVER or $REVAULT_CACHE/bin/versitygw.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VGW=$TOOLS_BIN/versitygw

install_vgw() {
  (
    with_lock versitygw
    local have
    # The version, and whether it is static: the e2e image holds the bare binary, with no libc
    # beside it, so a cgo build (e.g. installed by hand) is rebuilt.
    have=$(go version -m "$VGW" 2>/dev/null |
      awk '$1 == "mod" {v = $3} $2 == "CGO_ENABLED=0" {s = "static"} END {print v "/" s}' || true)
    if [ "$have" != "$VERSITYGW_VERSION/static" ]; then
      log "go install versitygw $VERSITYGW_VERSION${have:+ (had $have)}"
      mkdir -p "$TOOLS_BIN"
      GOBIN=$TOOLS_BIN CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
        "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" ||
        die "go install versitygw@$VERSITYGW_VERSION failed (the Go proxy is a filtered mirror: is it available?)"
    fi
  )
}

# The e2e suite's in-cluster S3 server (e2e/remote_test.go): the static binary in an image of
# its own, run as root so it can write a hostPath directory.
e2e_image() {
  install_vgw
  local images=$REVAULT_CACHE/images tag name archive
  mkdir -p "$images"
  tag=$VERSITYGW_VERSION-$(cat "$VGW" "$HACK_DIR/mkimage.py" | sha256sum | cut -c1-8)
  name=revault.local/versitygw:$tag
  archive=$images/versitygw-$tag.tar
  if [ ! -s "$archive" ]; then
    python3 "$HACK_DIR/mkimage.py" --user 0:0 --label org.opencontainers.image.title=versitygw \
      "$name" "$archive.new" /versitygw "$VGW:/versitygw" >/dev/null
    mv "$archive.new" "$archive"
    find "$images" -maxdepth 1 -name 'versitygw-*.tar' ! -name "versitygw-$tag.tar" -delete
  fi
  printf 'S3_IMAGE=%s\nS3_ARCHIVE=%s\n' "$name" "$archive" > "$images/s3.env"
  echo "$images/s3.env"
}

case ${1:-install} in
  install)
    install_vgw
    echo "$VGW"
    ;;
  e2e-image) e2e_image ;;
  run)
    [ $# -ge 2 ] || die "usage: $0 run DIR [ADDR]"
    install_vgw
    mkdir -p "$2/root" "$2/versions"
    exec "$VGW" --access revault-test --secret revault-test-secret --port "${3:-127.0.0.1:7070}" \
      posix --versioning-dir "$2/versions" "$2/root"
    ;;
  *) die "usage: $0 install | e2e-image | run DIR [ADDR]" ;;
esac
