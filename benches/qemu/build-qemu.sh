#!/usr/bin/env bash
# Builds a qemu-aarch64 that emulates SME2 and loads TCG plugins, from Debian's qemu sources,
# for `xnnblob-lab bench prefill --qemu`. Debian bookworm's qemu-user (7.2) emulates SME but not
# SME2; the newer qemu-user Debian packages are linked statically, and a static qemu loads no
# plugins. So this builds the linux-user aarch64 target alone (about 5 minutes on 2 cores).
#
#   benches/qemu/build-qemu.sh        prints the path of the built qemu-aarch64
#
# The source is Debian's orig tarball of qemu 10.2.2, fetched with apt (the host's mirror, a
# private list of sid's sources, the system's lists untouched) and checked against its sha256;
# XNNBLOB_QEMU_TARBALL=FILE takes it from FILE instead. Needs cc, ninja, pkg-config, glib's
# headers (libglib2.0-dev), dtc (device-tree-compiler) and python3 with venv; as root it installs
# the Debian packages that are missing. meson and pycotap, which Debian's tarball leaves out,
# go into a virtualenv of the build's own.
# Output: ${XDG_CACHE_HOME:-~/.cache}/xnnblob/qemu-10.2.2/qemu-aarch64.
set -euo pipefail

version=10.2.2
package_version=1:10.2.2+ds-1
tarball=qemu_10.2.2+ds.orig.tar.xz
sha256=be05230fe47a6937cd29f28f562932c8125f9c93c2a82c625198f7a4aa601dfb

say() { printf 'build-qemu: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

dest=${XDG_CACHE_HOME:-$HOME/.cache}/xnnblob/qemu-$version
if [ -x "$dest/qemu-aarch64" ] && "$dest/qemu-aarch64" --version | grep -q "version $version"; then
  echo "$dest/qemu-aarch64"
  exit 0
fi

missing=()
command -v cc >/dev/null || missing+=(gcc)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists glib-2.0 2>/dev/null || missing+=(libglib2.0-dev)
command -v dtc >/dev/null || missing+=(device-tree-compiler)
python3 -c 'import venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing Debian packages: ${missing[*]} (install them, or run this as root)"
  say "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$dest.build
rm -rf "$work"
mkdir -p "$work"

if [ -n "${XNNBLOB_QEMU_TARBALL:-}" ]; then
  cp "$XNNBLOB_QEMU_TARBALL" "$work/$tarball"
else
  # The first Debian archive the host's apt uses (never the security archive).
  archive=$(apt-get indextargets --format '$(REPO_URI)' | grep -v security | grep -m1 debian) ||
    die "no Debian archive in the host's apt sources"
  apt_dir=$work/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive sid main" >"$apt_dir/sources.list"
  apt_opts=(-q "-oDir::Etc::SourceList=$apt_dir/sources.list" -oDir::Etc::SourceParts=/dev/null
    "-oDir::State::Lists=$apt_dir/lists" "-oDir::Cache=$apt_dir/cache" -oAPT::Sandbox::User=root
    -oAcquire::Check-Valid-Until=false -oAcquire::Check-Date=false)
  say "fetching Debian's qemu $package_version sources"
  apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 || die "apt-get update failed (log: $work/apt.log)"
  # The mirror may answer 404 for the .dsc while the orig tarball arrives: the sha256 decides.
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only "qemu=$package_version" >>"$work/apt.log" 2>&1) || true
fi
[ -f "$work/$tarball" ] || die "no $tarball (log: ${apt_dir:-$work}/apt.log); give it as XNNBLOB_QEMU_TARBALL"
echo "$sha256  $work/$tarball" | sha256sum -c --quiet - || die "$tarball does not have sha256 $sha256"

say "building qemu-aarch64 $version (linux-user, plugins on)"
tar -C "$work" -xf "$work/$tarball"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q 'meson==1.5.0' 'pycotap==1.3.1' >"$work/pip.log" 2>&1 ||
  die "pip could not install meson and pycotap (log: $work/pip.log)"
mkdir -p "$work/build"
(
  cd "$work/build"
  "../qemu-$version/configure" --target-list=aarch64-linux-user --enable-plugins \
    --disable-system --disable-tools --disable-docs --disable-werror --disable-install-blobs \
    --python="$work/venv/bin/python3" >configure.log 2>&1
) || die "qemu's configure failed (log: $work/build/configure.log)"
ninja -C "$work/build" qemu-aarch64 >"$work/build/ninja.log" 2>&1 ||
  die "building qemu-aarch64 failed (log: $work/build/ninja.log)"
install -D -m 755 "$work/build/qemu-aarch64" "$dest/qemu-aarch64"
rm -rf "$work"
echo "$dest/qemu-aarch64"
