#!/usr/bin/env bash
# Installs the Debian packages that the README's commands need, and does nothing when every one is
# there. A package counts as present only when dpkg says it is installed AND the file its user loads
# exists: `libclang-cpp14` ships /usr/lib/llvm-14/lib/libclang-cpp.so.14, which no glob for
# "libclang*" should mistake for the libclang that bindgen loads.
#
# What needs what:
#   cmake, ninja-build     build XNNPACK (third_party/xnnpack-sys/build.rs)
#   libclang-dev           bindgen loads libclang to read xnnpack.h
#   g++                    XNNPACK's C++ sources and the cxx bridge (build.rs)
#   xz-utils               unpacks Debian's .orig.tar.xz source tarballs
#   patch                  applies third_party/xnnpack-sys/patches/*.patch to XNNPACK's sources
#   binutils               nm lists the microkernels the XNNPACK build defines (xnnpack-sys)
#   debian-archive-keyring the private apt configuration that fetches those tarballs checks their lists with it
#   ca-certificates        cargo and apt reach the package registries over TLS
#   qemu-user              tests re-run the quantized checks on an emulated AVX2-only CPU (x86-64 only)
#   python3-venv           third_party/executorch-sys pip-installs ExecuTorch 1.5.1's wheel (its C++
#                          runtime) with a throw-away venv
set -euo pipefail

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

dpkg_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# The shared libclang that clang-sys (bindgen's loader) would accept: named libclang.so,
# libclang-N.so or libclang(-N).so.M, never libclang-cpp, and exporting the C API.
libclang_file() {
  local dirs=() d f
  [ -n "${LIBCLANG_PATH:-}" ] && dirs+=("$LIBCLANG_PATH")
  for d in /usr/lib/llvm-*/lib "/usr/lib/$multiarch" /usr/lib /usr/local/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
  for d in "${dirs[@]}"; do
    for f in "$d"/libclang.so "$d"/libclang-*.so "$d"/libclang.so.* "$d"/libclang-*.so.*; do
      case "${f##*/}" in libclang-cpp*) continue ;; esac
      [ -e "$f" ] && grep -qa clang_createIndex "$f" && { echo "$f"; return 0; }
    done
  done
  return 1
}

# missing PACKAGE: prints PACKAGE when it is not installed or the file its user needs is absent.
missing() {
  local pkg=$1
  # Any python3 that can make a venv with pip will do (Debian's, or one installed by hand).
  if [ "$pkg" = python3-venv ] && python3 -c 'import venv, ensurepip' 2>/dev/null; then return; fi
  dpkg_installed "$pkg" || { echo "$pkg"; return; }
  case $pkg in
    cmake) command -v cmake >/dev/null && cmake --version >/dev/null 2>&1 || echo "$pkg" ;;
    ninja-build) command -v ninja >/dev/null && ninja --version >/dev/null 2>&1 || echo "$pkg" ;;
    libclang-dev) libclang_file >/dev/null || echo "$pkg" ;;
    g++) command -v g++ >/dev/null || echo "$pkg" ;;
    xz-utils) command -v xz >/dev/null || echo "$pkg" ;;
    patch) command -v patch >/dev/null || echo "$pkg" ;;
    binutils) command -v nm >/dev/null || echo "$pkg" ;;
    debian-archive-keyring) [ -s /usr/share/keyrings/debian-archive-keyring.gpg ] || echo "$pkg" ;;
    ca-certificates) [ -s /etc/ssl/certs/ca-certificates.crt ] || echo "$pkg" ;;
    qemu-user) command -v qemu-x86_64 >/dev/null || echo "$pkg" ;;
    python3-venv) python3 -c 'import venv, ensurepip' 2>/dev/null || echo "$pkg" ;;
  esac
}

packages=(cmake ninja-build pkg-config libclang-dev g++ binutils xz-utils patch debian-archive-keyring ca-certificates python3-venv)
[ "$(uname -m)" = x86_64 ] && packages+=(qemu-user)

# Packages dpkg calls installed whose files are gone (a half-removed library, a hand-deleted file)
# are reinstalled, together with the packages that own the file their user loads.
owners_of_needed_files() {
  case $1 in
    libclang-dev) dpkg-query -S 'libclang*.so*' 2>/dev/null | grep -v 'libclang-cpp' | cut -d: -f1 | tr ',' '\n' ;;
  esac
}

need=()
reinstall=()
for p in "${packages[@]}"; do
  m=$(missing "$p")
  [ -n "$m" ] || continue
  if dpkg_installed "$p"; then
    reinstall+=("$p")
    while read -r owner; do [ -n "$owner" ] && reinstall+=("${owner// /}"); done < <(owners_of_needed_files "$p")
  else
    need+=("$p")
  fi
done

if [ $((${#need[@]} + ${#reinstall[@]})) -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "install-system-deps: missing ${need[*]} ${reinstall[*]}, and there is no apt-get to install them" >&2
    exit 1
  }
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "install-system-deps: missing ${need[*]}; run as root or install sudo" >&2
      exit 1
    }
    sudo="sudo"
  fi
  $sudo apt-get update -q
  if [ ${#need[@]} -gt 0 ]; then
    echo "install-system-deps: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
  if [ ${#reinstall[@]} -gt 0 ]; then
    mapfile -t reinstall < <(printf '%s\n' "${reinstall[@]}" | sort -u)
    echo "install-system-deps: installed but incomplete, reinstalling ${reinstall[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends --reinstall "${reinstall[@]}"
  fi
fi

# Check again: an install that "succeeded" but left a tool unusable is an error here, not later.
still=()
for p in "${packages[@]}"; do
  m=$(missing "$p")
  [ -n "$m" ] && still+=("$m")
done
if [ ${#still[@]} -gt 0 ]; then
  echo "install-system-deps: still missing after installing: ${still[*]}" >&2
  exit 1
fi
