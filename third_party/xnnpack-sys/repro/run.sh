#!/usr/bin/env bash
# Builds and runs qb4w_kernels.c against an XNNPACK build made by xnnpack-sys (headers, internal
# headers and static libraries), by default the newest one in the per-user cache.
#   third_party/xnnpack-sys/repro/run.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${XNNBLOB_XNNPACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/xnnblob}
build=${1:-$(ls -1dt "$cache"/xnnpack-*/ 2>/dev/null | while read -r d; do [ -f "$d/BUILD_OK" ] && echo "$d" && break; done)}
[ -n "$build" ] && [ -f "$build/include/internal/xnnpack/config.h" ] || {
  echo "no XNNPACK build with internal headers (build the workspace first, or pass BUILD_DIR)" >&2
  exit 2
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O1 -std=c11 -I"$build/include" -I"$build/include/internal" "$here/qb4w_kernels.c" -o "$out/qb4w_kernels" \
  "$build/lib/libXNNPACK.a" "$build/lib/libmicrokernels-prod.a" "$build/lib/libcpuinfo.a" \
  "$build/lib/libpthreadpool.a" -lstdc++ -lm -lpthread
echo "XNNPACK build: $build"
"$out/qb4w_kernels"
