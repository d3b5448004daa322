#!/usr/bin/env bash
# Installs xnnblob for C and C++ projects under PREFIX:
#   lib/libxnnblob.a            the C ABI, the C++ delegate API, XNNPACK and pthreadpool
#   lib/libxnnblob.so           the C ABI only (its XNNPACK stays private)
#   lib/libxnnblob_executorch.so  the drop-in XnnpackBackend for ExecuTorch's runtime
#   include/xnnblob.h           C; include/xnnblob/*.h (C++, with the cxx bridge's headers);
#   include/xnnblob/xnnpack/    the XNNPACK headers libxnnblob.a was built with
#   lib/pkgconfig/              xnnblob.pc (the static library), xnnblob-shared.pc
#   lib/cmake/xnnblob/          find_package(xnnblob): xnnblob::xnnblob (static),
#                               xnnblob::shared, xnnblob::executorch_backend, and the
#                               xnnblob_prepack() function (cmake/xnnblob-prepack.cmake)
#   bin/xnnblob                 the command line (prepack, run, inspect, cache, bench)
#   bin/xnnblob-et-run          ExecuTorch's runtime with either backend (bench --peer uses it)
#   lib/cmake/xnnblob/xnnblob-versions.cmake  the versions built with: xnnblob's (the workspace
#                               Cargo.toml's), ExecuTorch's and XNNPACK's
#
# The package files name no absolute path: CMake's are relative to their own directory,
# pkg-config's to ${pcfiledir}, so the prefix can be moved (the wheel, scripts/build-wheels.sh,
# is this install in a Python package).
#
#   scripts/install.sh PREFIX [--debug] [--target TRIPLE]
#
# --target installs a cross build, for a Linux GNU target that cargo can build for here
# (aarch64-unknown-linux-gnu with the cross toolchain ./scripts/install-system-deps.sh installs):
# the libraries and XNNPACK's headers are the target's, the package files are the same.
#
# cargo-c is not used: it builds cargo itself as a library (minutes, plus OpenSSL headers) on
# every fresh machine, and xnnblob's install also needs its C++ headers and XNNPACK's, which
# cargo-c does not know about.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/install.sh PREFIX [--debug] [--target TRIPLE]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
prefix_arg=$1
shift
profile=release
cargo_profile=(--release)
target=
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=debug; cargo_profile=() ;;
    --target)
      [ $# -ge 2 ] || { echo "install: --target needs a target triple; $usage" >&2; exit 2; }
      target=$2
      shift ;;
    *) echo "install: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
cargo_target=()
if [ -n "$target" ]; then
  # The link flags below are a Linux GNU target's (glibc, libstdc++, libgcc_s). Android's
  # differ (bionic, libc++, liblog) and have not been tried: see docs/install.md.
  case "$target" in
    *-linux-gnu*) ;;
    *) echo "install: --target $target: only Linux GNU targets are installed (Android has not been tried: its system libraries differ)" >&2
       exit 2 ;;
  esac
  libdir=$(rustc --print target-libdir --target "$target" 2>/dev/null || true)
  if [ -z "$libdir" ] || ! compgen -G "$libdir/libstd-*.rlib" >/dev/null; then
    echo "install: Rust has no standard library for $target (rustup target add $target; ./scripts/install-system-deps.sh adds aarch64-unknown-linux-gnu)" >&2
    exit 1
  fi
  cargo_target=(--target "$target")
fi
prefix=$(mkdir -p "$prefix_arg" && cd "$prefix_arg" && pwd)

messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
cargo build "${cargo_profile[@]}" "${cargo_target[@]}" -p xnnblob-capi -p xnnblob-executorch \
  -p xnnblob-cli --message-format=json-render-diagnostics >"$messages"

# Where the build put things, from cargo's own messages and metadata.
read -r target_dir capi_out executorch_version version < <(python3 - "$messages" <<'PY'
import json, subprocess, sys
out_dir = None
executorch_version = None
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and "xnnblob-capi" in m.get("package_id", "") \
            or m.get("reason") == "build-script-executed" and "/faces/capi#" in m.get("package_id", ""):
        out_dir = m["out_dir"]
    # executorch-sys says the version it is built against to rustc (its VERSION constant).
    if m.get("reason") == "build-script-executed":
        for name, value in m.get("env", []):
            if name == "XNNBLOB_EXECUTORCH_VERSION":
                executorch_version = value
meta = json.loads(subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps"]))
if out_dir is None:
    sys.exit("install: cargo reported no build script run for xnnblob-capi")
if executorch_version is None:
    sys.exit("install: cargo reported no ExecuTorch version from executorch-sys")
# The workspace's one version (Cargo.toml's [workspace.package]), as the core crate has it.
version = next(p["version"] for p in meta["packages"] if p["name"] == "xnnblob")
print(meta["target_directory"], out_dir, executorch_version, version)
PY
)
# Cargo puts a cross build below a directory named after its target.
built="$target_dir/${target:+$target/}$profile"
cxxbridge=$(sed -n 's/^cxxbridge_include=//p' "$capi_out/install-headers.txt")
xnnpack_include=$(sed -n 's/^xnnpack_include=//p' "$capi_out/install-headers.txt")
xnnpack_version=$(sed -n 's/^xnnpack_version=//p' "$capi_out/install-headers.txt")

install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/xnnblob" "$prefix/include/xnnblob/src" \
  "$prefix/include/xnnblob/xnnpack" "$prefix/include/rust" "$prefix/bin"
install -m 755 "$built/xnnblob" "$built/xnnblob-et-run" "$prefix/bin/"
install -m 644 cmake/xnnblob-prepack.cmake "$prefix/lib/cmake/xnnblob/"
# Cargo names the C face's libraries after its crate (libxnnblob_capi); users link -lxnnblob.
install -m 644 "$built/libxnnblob_capi.a" "$prefix/lib/libxnnblob.a"
install -m 755 "$built/libxnnblob_capi.so" "$prefix/lib/libxnnblob.so"
install -m 755 "$built/libxnnblob_executorch.so" "$prefix/lib/"
install -m 644 faces/capi/include/xnnblob.h "$prefix/include/"
install -m 644 faces/cxx/include/xnnblob/delegate.h faces/cxx/include/xnnblob/named_data.h \
  faces/cxx/include/xnnblob/memory_bank.h faces/cxx/include/xnnblob/xnnblob.h "$prefix/include/xnnblob/"
install -m 644 "$cxxbridge/xnnblob/src/ffi.rs.h" "$prefix/include/xnnblob/src/"
install -m 644 "$cxxbridge/rust/cxx.h" "$prefix/include/rust/"
IFS=: read -ra xnnpack_dirs <<<"$xnnpack_include"
for dir in "${xnnpack_dirs[@]}"; do
  for header in xnnpack.h pthreadpool.h; do
    if [ -f "$dir/$header" ]; then install -m 644 "$dir/$header" "$prefix/include/xnnblob/xnnpack/"; fi
  done
done
[ -f "$prefix/include/xnnblob/xnnpack/xnnpack.h" ] || { echo "install: no xnnpack.h in $xnnpack_include" >&2; exit 1; }

# What a Rust static library needs from the system on Linux, and the C++ runtime for the
# delegate API.
system_libs="-lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

# pkg-config's own ${pcfiledir} (the .pc file's directory) keeps the modules relocatable.
# Two modules: xnnblob, the static library with XNNPACK and the C++ API (named explicitly, so a
# linker that finds libxnnblob.so too does not pick it); xnnblob-shared, the C ABI alone.
cat >"$prefix/lib/pkgconfig/xnnblob.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: xnnblob
Description: Fast, lean on-device model loading for XNNPACK: a persistent packed-weight cache and ExecuTorch named data (static, with XNNPACK)
Version: $version
Libs: \${libdir}/libxnnblob.a $system_libs
Cflags: -I\${includedir} -I\${includedir}/xnnblob/xnnpack
PC
cat >"$prefix/lib/pkgconfig/xnnblob-shared.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: xnnblob-shared
Description: xnnblob's C ABI as a shared library (its XNNPACK is private)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lxnnblob
Cflags: -I\${includedir}
PC

cat >"$prefix/lib/cmake/xnnblob/xnnblob-config-version.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

cat >"$prefix/lib/cmake/xnnblob/xnnblob-versions.cmake" <<CMAKE
# Written by scripts/install.sh: what this install was built with.
set(xnnblob_VERSION "$version")
set(xnnblob_EXECUTORCH_VERSION "$executorch_version")
set(xnnblob_XNNPACK_VERSION "$xnnpack_version")
set(xnnblob_TARGET "${target:-$(rustc -vV | sed -n 's/^host: //p')}")
CMAKE

# Which xnnblob_prepack() tool the installed command is: this host's, or the target's (an
# aarch64 install's command packs the aarch64 classes under qemu-aarch64).
if [ -z "$target" ]; then tool_variable=XNNBLOB_COMMAND; else tool_variable=XNNBLOB_AARCH64_COMMAND; fi
cat >"$prefix/lib/cmake/xnnblob/xnnblob-tools.cmake" <<CMAKE
# Written by scripts/install.sh: the installed bin/xnnblob is built for ${target:-this host}.
if(NOT $tool_variable)
  set($tool_variable "\${CMAKE_CURRENT_LIST_DIR}/../../../bin/xnnblob")
endif()
CMAKE

cat >"$prefix/lib/cmake/xnnblob/xnnblob-config.cmake" <<'CMAKE'
# xnnblob's CMake package (written by scripts/install.sh). Targets:
#   xnnblob::xnnblob            libxnnblob.a: the C ABI (xnnblob.h), the C++ delegate API
#                               (xnnblob/delegate.h) and the XNNPACK it carries (xnnpack.h)
#   xnnblob::shared             libxnnblob.so: the C ABI only
#   xnnblob::executorch_backend libxnnblob_executorch.so, kept on the link line: ExecuTorch's
#                               "XnnpackBackend", registered when the library loads
# Variables (xnnblob-versions.cmake): xnnblob_VERSION, xnnblob_EXECUTORCH_VERSION (the runtime
# the drop-in was built against, and refuses another), xnnblob_XNNPACK_VERSION, xnnblob_TARGET.
cmake_minimum_required(VERSION 3.16)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
get_filename_component(_xnnblob_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET xnnblob::xnnblob)
  add_library(xnnblob::xnnblob STATIC IMPORTED)
  set_target_properties(xnnblob::xnnblob PROPERTIES
    IMPORTED_LOCATION "${_xnnblob_prefix}/lib/libxnnblob.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_xnnblob_prefix}/include;${_xnnblob_prefix}/include/xnnblob/xnnpack"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;stdc++;gcc_s;util;rt;m;dl")
  add_library(xnnblob::shared SHARED IMPORTED)
  set_target_properties(xnnblob::shared PROPERTIES
    IMPORTED_LOCATION "${_xnnblob_prefix}/lib/libxnnblob.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_xnnblob_prefix}/include")
  add_library(xnnblob::executorch_backend INTERFACE IMPORTED)
  set_target_properties(xnnblob::executorch_backend PROPERTIES
    INTERFACE_LINK_LIBRARIES
      "-Wl,--push-state,--no-as-needed,${_xnnblob_prefix}/lib/libxnnblob_executorch.so,--pop-state"
    INTERFACE_LINK_OPTIONS "-Wl,-rpath,${_xnnblob_prefix}/lib")
endif()
include("${CMAKE_CURRENT_LIST_DIR}/xnnblob-versions.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/xnnblob-tools.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/xnnblob-prepack.cmake")
set(xnnblob_FOUND TRUE)
CMAKE

echo "installed xnnblob $version ($profile${target:+, $target}) under $prefix"
