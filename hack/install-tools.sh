#!/usr/bin/env bash
# Installs every build prerequisite for Revault, idempotently.
# Fast (well under a second) when everything is already present.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }

# clang + libclang: bindgen for the rocksdb crate; pkg-config for zstd-sys/lz4.
have clang || need_apt+=(clang)
[ -e /usr/lib/llvm-14/lib/libclang.so ] || ls /usr/lib/llvm-*/lib/libclang*.so >/dev/null 2>&1 || need_apt+=(libclang-dev)
have pkg-config || need_apt+=(pkg-config)
have cmake || need_apt+=(cmake)
# A font for the benchmark plots (revault-bench).
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# restic: the engine's retention is checked against restic's `forget` (tests/retention_restic.rs).
have restic || need_apt+=(restic)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-tools: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# Rust components used by `make lint`.
if have rustup; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
exit 0
