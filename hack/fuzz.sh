#!/usr/bin/env bash
# Fuzzes the engine's decoders with cargo-fuzz (libFuzzer) on stable Rust (docs/fuzzing.md).
#
#   hack/fuzz.sh                 every target for FUZZ_SECONDS (default 15) each: `make test-fuzz`
#   hack/fuzz.sh catalog recipe  only these targets
#   FUZZ_SECONDS=600 hack/fuzz.sh   the long run: `make fuzz`
#
# Builds the targets in worker/fuzz without a sanitizer (libFuzzer needs only the coverage
# instrumentation, which stable rustc has), writes seeds made by the engine, then runs each
# target with a memory limit, an input-size limit and a per-input timeout. Prints executions,
# exec/s and coverage per target. A crash, timeout or out-of-memory input fails the run; its
# reproducer is kept under $REVAULT_CACHE/fuzz/artifacts/<target>/ and copied to
# worker/fuzz/regressions/<target>/, where tests/fuzz_regressions.rs replays it once fixed.
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
FUZZ_RSS_MB=${FUZZ_RSS_MB:-2048}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-10}       # seconds one input may take
FUZZ_MAX_LEN=${FUZZ_MAX_LEN:-131072}   # bytes; the largest seed is well under this

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REVAULT_CACHE=${REVAULT_CACHE:-$HOME/.cache/revault}
FUZZ_CACHE=$REVAULT_CACHE/fuzz
# The seed writer and the RocksDB archive come from the worker's own (cached) release build, as
# under make; run by hand, without this, they would compile RocksDB again into worker/target.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REVAULT_CACHE/target}
# Instrumented builds get their own target dir (and not a shared CARGO_BUILD_BUILD_DIR).
FUZZ_TARGET_DIR=$FUZZ_CACHE/target
export PATH=$REVAULT_CACHE/bin:$HOME/.cargo/bin:$PATH

log() { printf 'fuzz: %s\n' "$*" >&2; }
die() { printf 'fuzz: ERROR: %s\n' "$*" >&2; exit 1; }

ALL_TARGETS=(tar_source catalog recipe container records transfer remote)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [ -f "$ROOT/worker/fuzz/fuzz_targets/$t.rs" ] || die "no fuzz target $t (targets: ${ALL_TARGETS[*]})"
done

# cargo-fuzz, pinned, from crates.io into $REVAULT_CACHE/bin (once).
if [ "$(cargo-fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $REVAULT_CACHE/bin"
  CARGO_TARGET_DIR=$REVAULT_CACHE/cargo-install \
    cargo install --quiet --locked --version "$CARGO_FUZZ_VERSION" --root "$REVAULT_CACHE" cargo-fuzz
fi

cd "$ROOT/worker"
# The fuzz crate has its own lock (it is not in the worker's workspace); it must pin what the
# worker pins. cargo-fuzz has no --locked, so check it here.
cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null 2>&1 ||
  die "worker/fuzz/Cargo.lock is out of date: run 'cd worker/fuzz && cargo update -p revault-engine' and commit it"

log "writing seeds (real stores, containers and tar streams made by the engine)"
rm -rf "$FUZZ_CACHE/seeds"
FUZZ_SEEDS_DIR=$FUZZ_CACHE/seeds cargo test --quiet --release --locked -p revault-engine \
  --test fuzz_regressions -- --ignored write_fuzz_seeds >/dev/null

# RocksDB's C++ is never instrumented (only Rust code is) and takes the better part of an hour
# to compile on two busy cores: link the archive the worker's release build made, when it is of
# the version the fuzz crate's lock pins. Without one, the fuzz build compiles it (once).
rocksdb_version=$(sed -n '/^name = "librocksdb-sys"$/{n;s/^version = "\(.*\)"$/\1/p}' fuzz/Cargo.lock)
for out in ${CARGO_BUILD_BUILD_DIR:-} "$CARGO_TARGET_DIR" "$REVAULT_CACHE/target"; do
  for a in "$out"/*/release/build/librocksdb-sys-*/out/librocksdb.a; do
    # Its build script's output names the crate's source directory, which carries the version.
    [ -f "$a" ] && grep -q "^cargo:cargo_manifest_dir=.*/librocksdb-sys-${rocksdb_version//./[.]}\$" \
      "${a%/out/librocksdb.a}/output" || continue
    lib=$FUZZ_CACHE/rocksdb-$rocksdb_version
    mkdir -p "$lib"
    cmp -s "$a" "$lib/librocksdb.a" || cp "$a" "$lib/librocksdb.a"
    export ROCKSDB_LIB_DIR=$lib ROCKSDB_STATIC=1
    log "linking RocksDB $rocksdb_version from the worker's build ($a)"
    break 2
  done
done

log "building the targets (cargo fuzz build --sanitizer none)"
mkdir -p "$FUZZ_CACHE/logs"
if ! env -u CARGO_BUILD_BUILD_DIR cargo-fuzz build --sanitizer none --fuzz-dir fuzz \
    --target-dir "$FUZZ_TARGET_DIR" >"$FUZZ_CACHE/logs/build.log" 2>&1; then
  tail -40 "$FUZZ_CACHE/logs/build.log" >&2
  die "the fuzz build failed (log: $FUZZ_CACHE/logs/build.log)"
fi
BIN_DIR=$FUZZ_TARGET_DIR/x86_64-unknown-linux-gnu/release
for t in "${targets[@]}"; do [ -x "$BIN_DIR/$t" ] || die "the build left no $BIN_DIR/$t"; done

# Inputs that once failed are replayed first, by the instrumented binaries (overflow checks on,
# unlike the release build of tests/fuzz_regressions.rs): a fix that regressed fails here.
for t in "${targets[@]}"; do
  reg=$ROOT/worker/fuzz/regressions/$t
  [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ] || continue
  "$BIN_DIR/$t" -rss_limit_mb="$FUZZ_RSS_MB" -timeout="$FUZZ_TIMEOUT" "$reg"/* \
    >"$FUZZ_CACHE/logs/$t.replay.log" 2>&1 || {
    grep -vE '^(INFO:|Running:|Executed)' "$FUZZ_CACHE/logs/$t.replay.log" | tail -30 >&2
    die "$t: an input in worker/fuzz/regressions/$t fails again"
  }
  log "$t: replayed $(ls "$reg" | wc -l) regression inputs"
done

# stat NAME LOG: a libFuzzer final statistic (-print_final_stats=1).
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

failed=()
summary=$(printf '%-11s %12s %9s %7s %7s %7s  %s\n' target executions exec/s cov ft corpus result)
for t in "${targets[@]}"; do
  corpus=$FUZZ_CACHE/corpus/$t      # grows from run to run: later runs start deeper
  artifacts=$FUZZ_CACHE/artifacts/$t
  logf=$FUZZ_CACHE/logs/$t.log
  mkdir -p "$corpus" "$artifacts" "$(dirname "$logf")"
  seeds=()
  [ -d "$FUZZ_CACHE/seeds/$t" ] && seeds=("$FUZZ_CACHE/seeds/$t")
  log "$t: ${FUZZ_SECONDS}s (log: $logf)"
  rc=0
  # The container target writes its files under TMPDIR; an input that crashes leaves them.
  rm -rf "$FUZZ_CACHE/tmp" && mkdir -p "$FUZZ_CACHE/tmp"
  TMPDIR=$FUZZ_CACHE/tmp "$BIN_DIR/$t" "$corpus" "${seeds[@]}" \
    -max_total_time="$FUZZ_SECONDS" -rss_limit_mb="$FUZZ_RSS_MB" -timeout="$FUZZ_TIMEOUT" \
    -max_len="$FUZZ_MAX_LEN" -artifact_prefix="$artifacts/" -print_final_stats=1 \
    >"$logf" 2>&1 || rc=$?
  # The last status line: "#N <event> cov: C ft: F corp: K/..."
  last=$(grep -E '^#[0-9]+' "$logf" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  execs=$(stat number_of_executed_units "$logf")
  rate=$(stat average_exec_per_sec "$logf")
  result=ok
  if [ "$rc" -ne 0 ]; then
    found=$(grep -oE "(crash|timeout|oom|leak|slow-unit)-[0-9a-f]+" "$logf" | tail -1 || true)
    result="FAILED (exit $rc)"
    failed+=("$t")
    echo "---- $t: the fuzzer stopped (exit $rc); the end of $logf:" >&2
    grep -vE '^(#[0-9]+|INFO:|stat::)' "$logf" | tail -40 >&2
    if [ -n "$found" ] && [ -f "$artifacts/$found" ]; then
      mkdir -p "$ROOT/worker/fuzz/regressions/$t"
      cp "$artifacts/$found" "$ROOT/worker/fuzz/regressions/$t/$found"
      result="FOUND $found"
      echo "---- reproducer: $artifacts/$found, copied to worker/fuzz/regressions/$t/$found" >&2
      echo "     replay it: $BIN_DIR/$t $artifacts/$found" >&2
    fi
  fi
  summary+=$'\n'$(printf '%-11s %12s %9s %7s %7s %7s  %s' "$t" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")
done

echo "fuzz: ${FUZZ_SECONDS}s per target, -rss_limit_mb=$FUZZ_RSS_MB -timeout=$FUZZ_TIMEOUT -max_len=$FUZZ_MAX_LEN"
echo "$summary"
if [ ${#failed[@]} -gt 0 ]; then
  die "the fuzzer found a failing input in: ${failed[*]} (see above; docs/fuzzing.md says what to do)"
fi
