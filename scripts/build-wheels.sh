#!/usr/bin/env bash
# Builds xnnblob's wheels into OUTDIR: one for x86-64 Linux and one for aarch64 Linux
# (cross-built, as scripts/install.sh --target is), to be pip-installed beside ExecuTorch 1.5.1's
# wheel (docs/wheel.md):
#
#   scripts/build-wheels.sh OUTDIR [--target TRIPLE]...
#
# Each wheel is scripts/install.sh's install, made relocatable, in a Python package `xnnblob`,
# zipped by scripts/wheel.py. Why not maturin, scikit-build or setuptools-rust: the wheel is not a
# Python extension but a C/C++ SDK (three libraries, two programs, headers, CMake and pkg-config
# files) whose layout install.sh already makes and its tests already check; those backends would
# each need the layout described again in their own terms, and a build dependency fetched from
# a registry on every build machine. A wheel is a zip with three metadata files (PEP 427); the
# stdlib writes one, and scripts/wheel.py checks what it wrote (RECORD's hashes, RUNPATHs, no
# build path) before it keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/build-wheels.sh OUTDIR [--target TRIPLE]..."
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
outdir_arg=$1
shift
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      [ $# -ge 2 ] || { echo "build-wheels: --target needs a triple; $usage" >&2; exit 2; }
      targets+=("$2")
      shift ;;
    *) echo "build-wheels: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)
outdir=$(mkdir -p "$outdir_arg" && cd "$outdir_arg" && pwd)
repo=$(pwd)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# A target directory of its own: the libraries are linked with another RUNPATH and the paths in
# them remapped, so they must not mix with a development build's.
export CARGO_TARGET_DIR="$repo/target/wheel"
# The drop-in and the runner find ExecuTorch's libexecutorch.so in ExecuTorch's wheel in the same
# site-packages: from xnnblob/lib/ and xnnblob/bin/ that is ../../executorch/lib.
export XNNBLOB_EXECUTORCH_RPATH='$ORIGIN/../../executorch/lib'
# Rust's panic locations name source files: not by this machine's paths (applies to the target's
# code only, as --target is always given).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
export RUSTFLAGS="--remap-path-prefix=$repo=xnnblob --remap-path-prefix=$cargo_home=cargo"

for target in "${targets[@]}"; do
  prefix="$stage/$target"
  ./scripts/install.sh "$prefix" --target "$target"
  python3 scripts/wheel.py --prefix "$prefix" --target "$target" --out "$outdir" \
    --forbid "$repo" --forbid "$HOME" --forbid "$stage"
done
