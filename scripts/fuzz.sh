#!/usr/bin/env bash
# Builds and runs xnnblob's coverage-guided fuzz targets (fuzz/) on the stable toolchain: no
# nightly and no cargo-fuzz, only cargo and libfuzzer-sys with the coverage instrumentation asked
# of rustc by hand (see docs/fuzzing.md).
#
#   scripts/fuzz.sh TARGET [libFuzzer args...]  build, then fuzz TARGET (until stopped, unless the
#                                               args say -runs=N or -max_total_time=S)
#   scripts/fuzz.sh all [libFuzzer args...]     every target in turn, with the same args
#   scripts/fuzz.sh build                       build every target; print the binaries' directory
#   scripts/fuzz.sh corpus                      rewrite the checked-in seeds (fuzz/corpus/)
#   scripts/fuzz.sh list                        the targets
#
# A run reads the checked-in seeds (fuzz/corpus/TARGET, never written) and keeps what it finds
# in fuzz/target/corpus/TARGET; crashes go to fuzz/artifacts/TARGET/. Builds are offline once
# fuzz/Cargo.lock's crates are fetched (`cargo fetch --manifest-path fuzz/Cargo.toml`).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
fuzz=$repo/fuzz
targets=(ptd pte cache_file cache_lookups payload graph_verifier plan state capi)

# With --target, RUSTFLAGS reach the targets' crates only, not build scripts or proc macros,
# which would otherwise be instrumented too and fail to link without libFuzzer.
cargo=${CARGO:-cargo}
host=$("${RUSTC:-rustc}" -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=$fuzz/target
# Either would override RUSTFLAGS.
unset CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
# The instrumentation libFuzzer needs (what cargo-fuzz passes, less its nightly-only sanitizer):
# edge counters with their PC table for coverage, comparison tracing for its value profile and
# dictionary; plus the checks a release build drops.
coverage_flags=(
  --cfg fuzzing
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cdebug-assertions
  -Coverflow-checks
)
bin_dir=$fuzz/target/$host/release

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

build() {
  local bins=() t
  for t in "${targets[@]}"; do bins+=(--bin "$t"); done
  RUSTFLAGS="${coverage_flags[*]}" "$cargo" build --manifest-path "$fuzz/Cargo.toml" --release \
    --locked --target "$host" "${bins[@]}"
}

run() { # run TARGET [args...]
  local target=$1
  shift
  local found=$fuzz/target/corpus/$target artifacts=$fuzz/artifacts/$target
  mkdir -p "$found" "$artifacts"
  # The targets that open paths write each input to a file (and capi's cache saves sync it):
  # in memory when the machine has a tmpfs there, unless TMPDIR says otherwise.
  if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    export TMPDIR=/dev/shm
  fi
  echo "fuzz.sh: $target ($bin_dir/$target $found $fuzz/corpus/$target $*)" >&2
  "$bin_dir/$target" -artifact_prefix="$artifacts/" "$@" "$found" "$fuzz/corpus/$target"
}

is_target() {
  local t
  for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  return 1
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  list) printf '%s\n' "${targets[@]}" ;;
  build)
    build
    echo "$bin_dir"
    ;;
  corpus)
    # A plain build: the writer is no fuzz target and links no libFuzzer.
    RUSTFLAGS= "$cargo" run --manifest-path "$fuzz/Cargo.toml" --release --locked \
      --bin write_corpus -- "$fuzz/corpus"
    ;;
  all)
    build
    for t in "${targets[@]}"; do run "$t" "$@"; done
    ;;
  -h | --help | help) usage ;;
  *)
    is_target "$command" || { echo "fuzz.sh: no target $command (try: list)" >&2; exit 2; }
    build
    run "$command" "$@"
    ;;
esac
