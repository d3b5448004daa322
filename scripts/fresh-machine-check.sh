#!/usr/bin/env bash
# Proves the README's two commands on a new machine of this project's kind, not on this one:
# a Debian bookworm root made by `debootstrap --variant=minbase`, given what such a machine
# ships that matters here (g++, python3, python3-venv, git, ca-certificates, and libclang-cpp14,
# whose libclang-cpp.so.14 once fooled the install script), the host's Rust toolchain bind-mounted
# read-only, an empty cargo registry and an empty XNNPACK cache. In it, a fresh clone of this
# repository's HEAD runs the README's commands verbatim. Prints PASS or FAIL per command; exits
# non-zero when either fails.
#
# Needs root (debootstrap, chroot, mounts) and the network to Debian's archive and Rust's crate registry.
# The mirror is the host's own, read from its apt sources.
#
# Environment:
#   FRESH_ROOT=DIR   where to build the root (default: a new directory under /var/tmp)
#   FRESH_KEEP=1     keep the root afterwards (for a look inside)
#   RUSTUP_HOME, CARGO_HOME  the host toolchain to bind-mount (defaults: ~/.rustup, ~/.cargo)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { printf 'fresh-machine-check: %s\n' "$*"; }
die() { say "error: $*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts)"
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on the host"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
fi

# The first Debian archive the host's apt uses (never the security archive), as build.rs finds it.
mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    while read -r uri; do
      case $uri in *debian*) case $uri in *security*) ;; *) echo "$uri"; return 0 ;; esac ;; esac
    done < <(sed -n 's/^URIs:[[:space:]]*//p' "$f" | tr ' ' '\n')
  done
  if [ -f /etc/apt/sources.list ]; then
    while read -r uri; do
      case $uri in *debian*) case $uri in *security*) ;; *) echo "$uri"; return 0 ;; esac ;; esac
    done < <(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }' /etc/apt/sources.list)
  fi
  return 1
}
archive=$(mirror) || die "no Debian archive in the host's apt sources"

rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
[ -x "$cargo_home/bin/cargo" ] || die "no cargo at $cargo_home/bin (set CARGO_HOME)"
[ -d "$rustup_home/toolchains" ] || die "no Rust toolchains at $rustup_home (set RUSTUP_HOME)"

root=${FRESH_ROOT:-$(mktemp -d /var/tmp/xnnblob-fresh.XXXXXX)}
logs=$root.logs
mkdir -p "$root" "$logs"
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${FRESH_KEEP:-0}" != 1 ]; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
bind() { # bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounted+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}

say "debootstrap --variant=minbase bookworm into $root (logs in $logs)"
debootstrap --variant=minbase bookworm "$root" "$archive" >"$logs/debootstrap.log" 2>&1 ||
  { tail -20 "$logs/debootstrap.log"; die "debootstrap failed"; }

bind /proc "$root/proc"
bind /sys "$root/sys"
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
cp /etc/resolv.conf "$root/etc/resolv.conf"

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root USER=root LANG=C.UTF-8 TERM=dumb \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo \
    /bin/bash -c "$1"
}

say "installing what a new machine of this kind has: g++ python3 python3-venv git ca-certificates libclang-cpp14"
in_root 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  g++ python3 python3-venv git ca-certificates libclang-cpp14' >"$logs/base-packages.log" 2>&1 ||
  { tail -20 "$logs/base-packages.log"; die "installing the base packages failed"; }

# Every machine of this workplace trusts its local certificate authorities (TLS to the package
# registries passes through them); they are the machine's, not the project's, so they are copied.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  in_root 'update-ca-certificates' >"$logs/ca-certificates.log" 2>&1 ||
    { tail -20 "$logs/ca-certificates.log"; die "update-ca-certificates failed"; }
fi

# The host's toolchain, seen through an overlay so the host's stays untouched, with what a new
# machine has: the host target's standard library only. The set-up then has to add the aarch64
# one itself (rustup target add), as on a user's machine. cargo's registry and caches are the new
# machine's own (empty).
overlay=$root/var/tmp/rustup-overlay
mkdir -p "$overlay/upper" "$overlay/work" "$root/root/.rustup"
mount -t overlay overlay -o "lowerdir=$rustup_home,upperdir=$overlay/upper,workdir=$overlay/work" \
  "$root/root/.rustup" || die "cannot mount an overlay of $rustup_home"
mounted+=("$root/root/.rustup")
host_target=$(rustc -vV | sed -n 's/^host: //p')
python3 - "$root/root/.rustup/toolchains" "$host_target" <<'PY'
# Removes every standard library but the host's from each toolchain, with rustup's records of it
# (its components list, its manifest, its entry in multirust-config.toml).
import pathlib, re, shutil, sys
toolchains, host = pathlib.Path(sys.argv[1]), sys.argv[2]
# A toolchain that is a link (1.95.0 -> stable) names its target by an absolute path, which
# outside the new root is the host's own toolchain: only real directories are edited, and only
# below the overlay.
for toolchain in toolchains.iterdir():
    if toolchain.is_symlink() or not toolchain.is_dir():
        continue
    rustlib = toolchain / "lib" / "rustlib"
    if not rustlib.resolve().is_relative_to(toolchains.resolve()):
        sys.exit(f"fresh-machine-check: {rustlib} leads outside the overlay")
    for std in rustlib.glob("manifest-rust-std-*"):
        target = std.name.removeprefix("manifest-rust-std-")
        if target == host:
            continue
        shutil.rmtree(rustlib / target, ignore_errors=True)
        std.unlink()
        components = rustlib / "components"
        lines = components.read_text().splitlines(keepends=True)
        components.write_text("".join(l for l in lines if l.strip() != f"rust-std-{target}"))
        config = rustlib / "multirust-config.toml"
        if config.exists():
            entry = re.compile(r'\[\[components\]\]\npkg = "rust-std"\ntarget = "%s"\n[^\[]*' % re.escape(target))
            config.write_text(entry.sub("", config.read_text()))
        print(f"fresh-machine-check: {rustlib.parent.parent.name} without rust-std-{target}")
PY
bind "$cargo_home/bin" "$root/root/.cargo/bin" ro

commit=$(git -C "$repo" rev-parse HEAD)
say "cloning ${commit:0:7} (committed work only) into the new root"
git clone -q --no-hardlinks "$repo" "$root/root/xnnblob"
git -C "$root/root/xnnblob" checkout -q "$commit"
[ ! -e "$root/root/.cache" ] || die "the new root has a ~/.cache already"
aarch64_std='compgen -G "$(rustc --print target-libdir --target aarch64-unknown-linux-gnu)/libstd-*.rlib"'
! in_root "$aarch64_std" >/dev/null 2>&1 || die "the new root's toolchain has aarch64's standard library already"

# The README's two commands, verbatim (see README.md, "Set-up").
commands=(
  "./scripts/install-system-deps.sh && cargo build --release --workspace && cargo run --release"
  "./scripts/install-system-deps.sh && cargo test --workspace"
)
# What each command's log must show besides a zero exit (the demo's ExecuTorch half ran).
expects=(
  "xnnblob against ExecuTorch's own cache"
  ""
)
failed=0
for i in "${!commands[@]}"; do
  cmd=${commands[i]}
  grep -qF -- "$cmd" "$repo/README.md" || die "README.md no longer shows: $cmd"
  log="$logs/command-$((i + 1)).log"
  start=$SECONDS
  if in_root "cd /root/xnnblob && $cmd" >"$log" 2>&1 &&
    { [ -z "${expects[i]}" ] || grep -qF -- "${expects[i]}" "$log"; }; then
    say "PASS ($((SECONDS - start)) s): $cmd"
  else
    say "FAIL ($((SECONDS - start)) s): $cmd (log: $log); its last lines:"
    tail -40 "$log" | sed 's/^/    /'
    failed=1
  fi
done
# The set-up added the aarch64 standard library the new root lacked.
if [ "$failed" = 0 ] && [ "$host_target" = x86_64-unknown-linux-gnu ] && ! in_root "$aarch64_std" >/dev/null 2>&1; then
  say "FAIL: the README's commands left the new root without aarch64's standard library"
  failed=1
fi

if [ "$failed" = 0 ]; then
  # Lets CI skip the check until a set-up file changes again.
  "$repo/scripts/setup-digest.sh" "$commit" >"$repo/.ci/fresh-machine-check.passed"
  say "all README commands passed on a fresh root (${commit:0:7}; digest in .ci/fresh-machine-check.passed)"
fi
exit "$failed"
