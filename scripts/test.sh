#!/usr/bin/env bash
# The test loops (README, "Tests"):
#   scripts/test.sh fast   every test but the slow ones in scripts/slow-tests.txt (the inner loop)
#   scripts/test.sh slow   only those: they build and run other programs (fuzzers, installs, qemu)
#   scripts/test.sh        both, one after the other: the whole suite, as CI runs it
# Extra arguments go to cargo test (before `--`), e.g. `scripts/test.sh fast --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
[ $# -gt 0 ] && shift
slow=()
while read -r package target name; do
  [ -z "${package:-}" ] || [ "${package:0:1}" = "#" ] || slow+=("$package $target $name")
done <scripts/slow-tests.txt
fast() {
  local skips=()
  for s in "${slow[@]}"; do
    read -r _ _ name <<<"$s"
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
case "$mode" in
  fast) fast "$@" ;;
  slow) slow_tests "$@" ;;
  all) fast "$@" && slow_tests "$@" ;;
  *) echo "usage: scripts/test.sh [fast|slow|all] [cargo test options]" >&2; exit 2 ;;
esac
