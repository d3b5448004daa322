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
slow_tests() {
  local log
  log=$(mktemp)
  for s in "${slow[@]}"; do
    read -r package target name <<<"$s"
    cargo test -p "$package" --test "$target" "$@" -- --exact "$name" 2>&1 | tee "$log"
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
