#!/usr/bin/env bash
# The test loops (README, "Tests"):
#   scripts/test.sh fast   every test but the slow ones in scripts/slow-tests.txt (the inner loop)
#   scripts/test.sh slow   only those: they build and run other programs (fuzzers, installs, qemu)
#   scripts/test.sh        both, one after the other: the whole suite, as CI runs it
#   scripts/test.sh sanitize   the fast loop with XNNPACK and xnnblob's C and C++ under
#                              AddressSanitizer and UndefinedBehaviorSanitizer (CI runs it)
# Extra arguments go to cargo test (before `--`), e.g. `scripts/test.sh fast --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
[ $# -gt 0 ] && shift
slow=()
while read -r package target name; do
  [ -z "${package:-}" ] || [ "${package:0:1}" = "#" ] || slow+=("$package $target $name")
done <scripts/slow-tests.txt
# Names the fast loop leaves out besides the slow tests (the sanitizer loop's).
more_skips=()
fast() {
  local skips=()
  for s in "${slow[@]}"; do
    read -r _ _ name <<<"$s"
    skips+=(--skip "$name")
  done
  for name in "${more_skips[@]}"; do
    skips+=(--skip "$name")
  done
  cargo test --workspace "$@" -- "${skips[@]}"
}
# Seconds one slow test may take, its build included (a fresh clone builds for aarch64 first).
slow_limit=${XNNBLOB_SLOW_TEST_LIMIT:-1200}
slow_tests() {
  local log
  log=$(mktemp)
  for s in "${slow[@]}"; do
    read -r package target name <<<"$s"
    local start=$SECONDS status=0
    # Each takes minutes at most (the slowest, the suite under qemu, about 2): a hang is killed
    # with its process group and said, rather than taking a whole CI run with it.
    timeout -k 30 "$slow_limit" cargo test -p "$package" --test "$target" "$@" -- --exact "$name" 2>&1 | tee "$log" ||
      status=$?
    echo "scripts/test.sh: $name took $((SECONDS - start)) s"
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
      echo "scripts/test.sh: $s did not finish in $slow_limit s and was killed" >&2
      rm -f "$log"
      exit 1
    fi
    [ "$status" = 0 ] || { echo "scripts/test.sh: $s failed" >&2; rm -f "$log"; exit "$status"; }
    # A name that no longer matches would run nothing and pass: each must run exactly one test.
    grep -q "test result: ok. 1 passed" "$log" || { echo "scripts/test.sh: $s ran no test" >&2; rm -f "$log"; exit 1; }
  done
  rm -f "$log"
}
# XNNPACK (cached apart: CMake's flags are part of its build's key), src/pool.c,
# src/kernel_info.c and the faces' C and C++ compiled with both sanitizers, through the CFLAGS and
# CXXFLAGS that CMake and the cc crate read, and the sanitizers' runtimes linked first into every
# test program by scripts/sanitize-link.sh (rustc's stable channel has no sanitizers, so Rust's
# own code is built as usual). --target keeps that linker to the test programs and their
# libraries; a build script that runs XNNPACK gets the runtimes from xnnpack-sys, later on its
# link line, so ASan is told not to insist on coming first. Its own target directory keeps these
# builds apart from the plain ones. Any report fails the test it is in.
# UBSan's alignment check is off: XNNPACK's SSE kernels load 8 bytes of floats with
# _mm_load_sd, which GCC's emmintrin.h spells as a dereference of a double pointer (movsd has no
# alignment requirement). ASan leaves SIGBUS to the program, whose handler the tests check.
# The tests in scripts/sanitize-skips.txt cannot run under ASan (it says why); the fast loop
# runs them.
sanitize() (
  local flags="-fsanitize=address,undefined -fno-sanitize=alignment -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  local host name _
  host=$(rustc -vV | sed -n 's/^host: //p')
  while read -r name _; do
    [ -z "${name:-}" ] || [ "${name:0:1}" = "#" ] || more_skips+=("$name")
  done <scripts/sanitize-skips.txt
  export CFLAGS="$flags" CXXFLAGS="$flags"
  export "CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_LINKER=$PWD/scripts/sanitize-link.sh"
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:verify_asan_link_order=0:handle_sigbus=0}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  export CARGO_TARGET_DIR="${XNNBLOB_SANITIZE_TARGET_DIR:-target/sanitize}"
  fast --target "$host" "$@"
)
case "$mode" in
  fast) fast "$@" ;;
  slow) slow_tests "$@" ;;
  all) fast "$@" && slow_tests "$@" ;;
  sanitize) sanitize "$@" ;;
  *) echo "usage: scripts/test.sh [fast|slow|all|sanitize] [cargo test options]" >&2; exit 2 ;;
esac
