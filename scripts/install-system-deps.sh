#!/usr/bin/env bash
# Installs the Debian packages building XNNPACK needs (cmake, ninja, libclang for bindgen),
# and does nothing when they are already there.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null || compgen -G '/usr/lib/*/libclang*.so*' >/dev/null || need+=(libclang-dev)
command -v apt-get >/dev/null || { [ ${#need[@]} -eq 0 ] && exit 0; echo "missing ${need[*]} and no apt-get to install them" >&2; exit 1; }
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi
