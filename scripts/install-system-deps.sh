#!/usr/bin/env bash
# Installs the Debian packages that the README's commands need, and does nothing when every one is
# there. A package counts as present only when dpkg says it is installed AND the file its user loads
# exists: `libclang-cpp14` ships /usr/lib/llvm-14/lib/libclang-cpp.so.14, which no glob for
# "libclang*" should mistake for the libclang that bindgen loads.
#
# What needs what:
#   cmake, ninja-build     build XNNPACK (sys/xnnpack-sys/build.rs)
#   libclang-dev           bindgen loads libclang to read xnnpack.h
#   g++                    XNNPACK's C++ sources and the cxx bridge (build.rs)
#   xz-utils               unpacks Debian's .orig.tar.xz source tarballs
#   patch                  applies sys/xnnpack-sys/patches/*.patch to XNNPACK's sources
#   binutils               nm lists the microkernels the XNNPACK build defines (xnnpack-sys)
#   debian-archive-keyring the private apt configuration that fetches those tarballs checks their lists with it
#   ca-certificates        cargo and apt reach the package registries over TLS
#   qemu-user              tests re-run the quantized checks on an emulated AVX2-only CPU (x86-64 only)
#   python3-venv           sys/executorch-sys pip-installs ExecuTorch 1.5.1's wheel (its C++
#                          runtime) with a throw-away venv
#   python3-yaml           XNNPACK's test generator, for the slow test that runs XNNPACK's own
#                          GEMM tests on xnnblob's kernels (sys/xnnpack-sys/tests/xnnpack_own_tests.rs)
#
# On an x86-64 host, also what cross-building and emulated testing for 64-bit Arm Linux need (the
# README's test command runs part of the suite for aarch64 under qemu: tests/aarch64.rs);
# `--host-only` leaves these out, `--target aarch64-unknown-linux-gnu` asks for them by name:
#   gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu   the C and C++ cross compilers (XNNPACK, the cxx
#                          bridge) and the linker (.cargo/config.toml names it)
#   libc6-dev-arm64-cross  the target's libc, headers and dynamic loader (/usr/aarch64-linux-gnu)
#   qemu-user              qemu-aarch64, the runner .cargo/config.toml gives cargo for that target
#   the rust target        `rustup target add aarch64-unknown-linux-gnu`
#   qemu-user-binfmt, binfmt-support   only where the kernel's binfmt_misc can be mounted and
#                          written (not in every container): then aarch64 programs that tests spawn
#                          run directly, under qemu; checked by running one, and a warning, not an
#                          error, where it cannot work
set -euo pipefail

usage() {
  echo "usage: $0 [--host-only | --target aarch64-unknown-linux-gnu]" >&2
  exit 2
}
target=aarch64-unknown-linux-gnu
while [ $# -gt 0 ]; do
  case $1 in
    --target) [ $# -ge 2 ] || usage; target=$2; shift 2 ;;
    --target=*) target=${1#--target=}; shift ;;
    --host-only) target=""; shift ;;
    -h | --help) usage ;;
    *) usage ;;
  esac
done
cross=""
case $target in
  "") ;;
  aarch64-unknown-linux-gnu)
    # On an aarch64 host that target is the host's own: nothing to cross.
    [ "$(uname -m)" = aarch64 ] || cross=aarch64
    ;;
  *)
    echo "install-system-deps: --target $target is not supported (aarch64-unknown-linux-gnu is)" >&2
    exit 2
    ;;
esac

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
  # Likewise any python3 that imports yaml.
  if [ "$pkg" = python3-yaml ] && python3 -c 'import yaml' 2>/dev/null; then return; fi
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
    qemu-user) command -v qemu-x86_64 >/dev/null && { [ -z "$cross" ] || command -v qemu-aarch64 >/dev/null; } || echo "$pkg" ;;
    python3-venv) python3 -c 'import venv, ensurepip' 2>/dev/null || echo "$pkg" ;;
    python3-yaml) python3 -c 'import yaml' 2>/dev/null || echo "$pkg" ;;
    gcc-aarch64-linux-gnu) command -v aarch64-linux-gnu-gcc >/dev/null || echo "$pkg" ;;
    g++-aarch64-linux-gnu) command -v aarch64-linux-gnu-g++ >/dev/null || echo "$pkg" ;;
    libc6-dev-arm64-cross) [ -e /usr/aarch64-linux-gnu/include/stdio.h ] && [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || echo "$pkg" ;;
  esac
}

packages=(cmake ninja-build pkg-config libclang-dev g++ binutils xz-utils patch debian-archive-keyring ca-certificates python3-venv python3-yaml)
[ "$(uname -m)" = x86_64 ] && packages+=(qemu-user)
if [ "$cross" = aarch64 ]; then
  packages+=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross)
  [[ " ${packages[*]} " == *" qemu-user "* ]] || packages+=(qemu-user)
fi

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
  apt_updated=1
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

[ -n "$target" ] || exit 0

# The Rust standard library for the target.
libdir=$(rustc --print target-libdir --target "$target" 2>/dev/null || true)
if [ -z "$libdir" ] || ! compgen -G "$libdir/libstd-*.rlib" >/dev/null; then
  command -v rustup >/dev/null || {
    echo "install-system-deps: Rust has no standard library for $target, and there is no rustup to add it" >&2
    exit 1
  }
  echo "install-system-deps: rustup target add $target"
  rustup target add "$target"
fi
[ -n "$cross" ] || exit 0

# binfmt: whether the kernel starts aarch64 programs itself (through qemu) when a test spawns one.
# It needs binfmt_misc mounted and writable, which a container may refuse: then tests run such
# children through the runner instead, and this says so.
binfmt=/proc/sys/fs/binfmt_misc
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
[ -e "$binfmt/status" ] || $sudo mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
binfmt_note=""
if [ ! -w "$binfmt/register" ] && ! $sudo test -w "$binfmt/register" 2>/dev/null; then
  binfmt_note="the kernel's binfmt_misc cannot be mounted or written here"
else
  # binfmt-support does the registering: Debian's qemu-user-binfmt otherwise leaves it to
  # systemd-binfmt, which does not run in a container.
  binfmt_pkgs=()
  for p in qemu-user-binfmt binfmt-support; do dpkg_installed "$p" || binfmt_pkgs+=("$p"); done
  if [ ${#binfmt_pkgs[@]} -gt 0 ]; then
    [ -n "${apt_updated:-}" ] || $sudo apt-get update -q
    echo "install-system-deps: installing ${binfmt_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${binfmt_pkgs[@]}"
  fi
  # Their scripts skip registering when they think they run in a container, and a reboot forgets
  # what was registered: register here, whatever they did.
  [ -e "$binfmt/qemu-aarch64" ] || $sudo update-binfmts --enable qemu-aarch64 || true
  # Debian's qemu, started by binfmt, finds the target's dynamic loader and libraries under
  # /etc/qemu-binfmt/<arch>.
  [ -e /etc/qemu-binfmt/aarch64 ] || { $sudo mkdir -p /etc/qemu-binfmt && $sudo ln -s /usr/aarch64-linux-gnu /etc/qemu-binfmt/aarch64; }
  # Proven by running a program, not by the registration's presence.
  probe=$(mktemp -d)
  printf 'int main(void) { return 0; }\n' >"$probe/probe.c"
  if ! aarch64-linux-gnu-gcc "$probe/probe.c" -o "$probe/probe" 2>/dev/null || ! "$probe/probe" 2>/dev/null; then
    binfmt_note="an aarch64 program does not start by itself although binfmt_misc is writable"
  fi
  rm -rf "$probe"
fi
if [ -n "$binfmt_note" ]; then
  echo "install-system-deps: warning: $binfmt_note; aarch64 programs run only through" \
    "'qemu-aarch64 -L /usr/aarch64-linux-gnu' (cargo's runner for $target)" >&2
fi
