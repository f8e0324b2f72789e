#!/usr/bin/env bash
# The previous release of Revault, built from its commit in this repository's history, for the
# e2e scenario that `helm upgrade`s from it (e2e/upgrade_test.go, docs/e2e.md scenario 16).
#
# There is no registry to pull last release's images from, so they are built here like ours:
# the chart, the static worker and operator binaries, and their images as archives, all from
# `git archive $PREVIOUS_COMMIT`. Everything is cached under $REVAULT_CACHE/previous/<commit>,
# so only the first run on a machine (or after the pin moves) builds anything.
#
# usage: hack/previous-release.sh
# Result: the path of an env file (last line of stdout) with PREVIOUS_VERSION, PREVIOUS_CHART,
#   PREVIOUS_WORKER_IMAGE, PREVIOUS_WORKER_ARCHIVE, PREVIOUS_OPERATOR_IMAGE,
#   PREVIOUS_OPERATOR_ARCHIVE. Exit 3: the commit is not in this clone (a shallow clone or a
#   source archive) and could not be fetched; the reason is on stderr.
#
# Releasing: when the chart's version moves on, point PREVIOUS_COMMIT at the commit the last
# release was cut from and PREVIOUS_VERSION at its chart version.
set -Eeuo pipefail

PREVIOUS_VERSION=0.1.0
PREVIOUS_COMMIT=213f125998c97a23819c564804d07261bc9b8ae9

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/hack/lib.sh"

OUT=$REVAULT_CACHE/previous/${PREVIOUS_COMMIT:0:12}
ENV_FILE=$OUT/previous.env
# One build at a time: another would clobber the sources, and the binary copied out of the
# shared target directory must be the one this run built.
with_lock previous-release
if [ -s "$ENV_FILE" ]; then
  log "ok: release $PREVIOUS_VERSION (${PREVIOUS_COMMIT:0:12}), cached"
  echo "$ENV_FILE"
  exit 0
fi
start=$(now)
if ! git -C "$ROOT" cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null; then
  # A shallow clone: its origin may still have the commit (a full clone is never made shallow).
  if [ "$(git -C "$ROOT" rev-parse --is-shallow-repository)" = true ]; then
    timeout 120 git -C "$ROOT" fetch -q --depth=1 origin "$PREVIOUS_COMMIT" 2>/dev/null || true
  fi
  if ! git -C "$ROOT" cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null; then
    log "commit $PREVIOUS_COMMIT (release $PREVIOUS_VERSION) is not in this clone's history and" \
        "could not be fetched: a clone with history ('git fetch --unshallow') builds it"
    exit 3
  fi
fi

SRC=$OUT/src
rm -rf "$SRC" && mkdir -p "$SRC"
git -C "$ROOT" archive "$PREVIOUS_COMMIT" | tar -x -C "$SRC"

# The worker: built in the shared CARGO_TARGET_DIR, so RocksDB and the other dependencies (same
# lock file, flags and target) are reused and only Revault's own crates compile. Their sources
# live at another path, so their artifacts sit beside ours instead of replacing them; only the
# final binary is copied to one place, which is ours again after the relink below.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REVAULT_CACHE/target}
export CARGO_TARGET_DIR PATH=$HOME/.cargo/bin:$PATH
BIN=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/revault
ours=$( [ -x "$BIN" ] && sha256sum < "$BIN" || true)
"$HACK_DIR/install-tools.sh"  # clang for RocksDB's bindings, on a machine that built nothing yet
log "building the worker of $PREVIOUS_VERSION (${PREVIOUS_COMMIT:0:12})"
(cd "$SRC/worker" && cargo build --release --locked -p revault) || die "building the previous worker failed"
# The binary must be the previous release's, not ours (the version tells them apart).
got=$("$BIN" --version)
[ "$got" = "revault $PREVIOUS_VERSION" ] || die "$BIN says '$got', not 'revault $PREVIOUS_VERSION'"
mkdir -p "$OUT/bin"
strip --strip-debug -o "$OUT/bin/revault" "$BIN"
if [ -z "$ours" ]; then
  # Nothing of ours was there: leave nothing that `make images` could take for ours.
  rm -f "$BIN"
else
  # Cargo links a fresh binary into place again, so this costs seconds, not a build.
  (cd "$ROOT/worker" && cargo build --release --locked -p revault) || die "relinking our worker failed"
  # (A different binary is still ours if our sources changed since it was built.)
  [ "$(sha256sum < "$BIN")" = "$ours" ] || log "our worker was rebuilt: its sources changed since the last build"
  [ "$("$BIN" --version)" != "revault $PREVIOUS_VERSION" ] || die "$BIN is still the previous release's"
fi

log "building the operator of $PREVIOUS_VERSION"
(cd "$SRC/operator" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/bin/manager" ./cmd) ||
  die "building the previous operator failed"

TAG=prev-${PREVIOUS_VERSION}-${PREVIOUS_COMMIT:0:12}
WORKER_IMAGE=revault.local/revault:$TAG
OPERATOR_IMAGE=revault.local/revault-operator:$TAG
python3 "$HACK_DIR/mkimage.py" --label "org.opencontainers.image.title=worker" \
  "$WORKER_IMAGE" "$OUT/revault.tar" /usr/local/bin/revault "$OUT/bin/revault:/usr/local/bin/revault" >/dev/null
python3 "$HACK_DIR/mkimage.py" --label "org.opencontainers.image.title=operator" \
  "$OPERATOR_IMAGE" "$OUT/revault-operator.tar" /manager "$OUT/bin/manager:/manager" >/dev/null

cat > "$ENV_FILE.new" <<EOF
PREVIOUS_VERSION=$PREVIOUS_VERSION
PREVIOUS_COMMIT=$PREVIOUS_COMMIT
PREVIOUS_CHART=$SRC/charts/revault
PREVIOUS_WORKER_IMAGE=$WORKER_IMAGE
PREVIOUS_WORKER_ARCHIVE=$OUT/revault.tar
PREVIOUS_OPERATOR_IMAGE=$OPERATOR_IMAGE
PREVIOUS_OPERATOR_ARCHIVE=$OUT/revault-operator.tar
EOF
mv "$ENV_FILE.new" "$ENV_FILE"
# Older pins' builds are of no further use.
find "$REVAULT_CACHE/previous" -mindepth 1 -maxdepth 1 ! -name "${PREVIOUS_COMMIT:0:12}" -exec rm -rf {} +
log "ok in $(( $(now) - start ))s: $WORKER_IMAGE $OPERATOR_IMAGE"
echo "$ENV_FILE"
