#!/usr/bin/env bash
# Builds and runs one reproduction against an XNNPACK build made by xnnpack-sys (headers,
# internal headers and static libraries), by default the newest one in the per-user cache that
# was built for the chosen architecture. XNNPACK's thread-pool calls are served by src/pool.c
# (run on the calling thread: no pool is passed), as in xnnblob.
#   sys/xnnpack-sys/repro/run.sh [--target aarch64-unknown-linux-gnu] [NAME] [BUILD_DIR]
# NAME is a .c file here without its suffix: qb4w_kernels (the default; x86-64 only),
# qb4w_maddubs (x86-64 only), f32_qc4w_odd_k, f16_operators or memory_plan. With --target aarch64-unknown-linux-gnu the program is cross-compiled with
# Debian's aarch64-linux-gnu-gcc and run under qemu-aarch64; QEMU_CPU chooses the emulated CPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
target=host
if [ "${1:-}" = --target ]; then
  target=${2:?--target needs a target triple}
  shift 2
fi
name=${1:-qb4w_kernels}
case "$target" in
  host) cc=cc machine="$(cc -dumpmachine | cut -d- -f1)"; run=() ;;
  aarch64-unknown-linux-gnu) cc=aarch64-linux-gnu-gcc machine=aarch64; run=(qemu-aarch64 -L /usr/aarch64-linux-gnu) ;;
  *) echo "unsupported target $target (host or aarch64-unknown-linux-gnu)" >&2; exit 2 ;;
esac
[ -f "$here/$name.c" ] || { echo "no reproduction $here/$name.c" >&2; exit 2; }

# The ELF machine of a build's libcpuinfo.a, as readelf names it (AArch64, Advanced Micro Devices X86-64).
build_machine() { readelf -h "$1/lib/libcpuinfo.a" 2>/dev/null | sed -n 's/^ *Machine: *//p' | head -1; }
wanted() {
  case "$machine:$(build_machine "$1")" in
    aarch64:AArch64 | x86_64:*X86-64) return 0 ;;
    *) return 1 ;;
  esac
}
cache=${XNNBLOB_XNNPACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/xnnblob}
build=${2:-}
if [ -z "$build" ]; then
  for d in $(ls -1dt "$cache"/xnnpack-*/ 2>/dev/null); do
    if [ -f "$d/BUILD_OK" ] && wanted "$d"; then build=$d; break; fi
  done
fi
[ -n "$build" ] && [ -f "$build/include/internal/xnnpack/config.h" ] || {
  echo "no $machine XNNPACK build with internal headers (build the workspace for it first, or pass BUILD_DIR)" >&2
  exit 2
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
libs=("$build/lib/libXNNPACK.a" "$build/lib/libmicrokernels-prod.a" "$build/lib/libcpuinfo.a")
# Builds from before xnnblob served the thread pool itself also hold pthreadpool.
[ -f "$build/lib/libpthreadpool.a" ] && libs+=("$build/lib/libpthreadpool.a") ||
  libs=("$here/../src/pool.c" "${libs[@]}")
"$cc" -O1 -std=c11 -I"$build/include" -I"$build/include/internal" "$here/$name.c" -o "$out/$name" \
  "${libs[@]}" -lstdc++ -lm -lpthread
echo "XNNPACK build: $build"
echo "target: $target${QEMU_CPU:+ (QEMU_CPU=$QEMU_CPU)}"
"${run[@]}" "$out/$name"
