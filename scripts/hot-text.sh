#!/usr/bin/env bash
# Regenerates faces/executorch/hot-text.ld, the linker script that puts the functions of
# libxnnblob_executorch.so a launch runs first in its text, together.
#
# Why: the kernel maps a library's code 64 KiB at a time around each page a call first touches
# (fault-around), so code that runs at load and execute, scattered among code that does not,
# made every 64 KiB of the library's Rust code resident: 1.1 MiB where ExecuTorch's own backend
# holds 0.7 (issue 39, the decoder's cold peak under the mmap loader).
#
# How: callgrind lists the functions that run in a cold launch and in the warm launch after it
# of an exported program, inside ExecuTorch's runtime (xnnblob-et-run, mmap loader, two
# tokens); their sections are named, in the order found, first in the text (LLD puts them at
# the start of .text, GNU ld in a .text section of their own before it). The hashes rustc puts
# in symbol names are wildcards, so that the script matches in any checkout and after a change of
# compiler, dependency or flags. A function the script does not name stays where it was: a stale
# script costs memory, never correctness (faces/executorch/tests/hot_text.rs says when it is
# stale). XNNPACK is built with a section per function (sys/xnnpack-sys/build.rs), so its functions
# that ran are named by their sections too. rustc bundles XNNPACK's archives into xnnpack-sys's
# rlib, so a pattern naming an archive would match nothing: sections are named in any file. The
# code of an object without a section per function (assembly, an XNNPACK built elsewhere) stays
# where it is; glibc's `atexit`, linked into the library from libc_nonshared.a, moves by its
# object. The PLT goes before the text, beside the named code (LLD puts it after the text; GNU
# ld before, as here).
#
# The script is made for the CPU it runs on: XNNPACK's functions are also taken from a launch
# under gdb, natively (below). What the script named before is kept after them, so running it
# on a second kind of CPU adds that CPU's microkernels to the first's. On a CPU it was never run
# on, the microkernels XNNPACK picks there stay where they lie, which costs a few 64 KiB windows
# and nothing else.
#
# Needs valgrind, gdb (without it, the native pass is skipped) and exported programs with their
# io.json, and their .ptd where they have one (default: the bench's decoder,
# `scripts/export-executorch-fixtures.sh --bench`). Several programs are launched in one process,
# in the order given, so the first one's functions come first: the decoder, then programs whose
# weights lie in a .ptd (tests/data/executorch/export), whose constants, convolutions and packing
# a decoder does not run.
# Usage: scripts/hot-text.sh [PROGRAM.pte...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$HOME/.cache/xnnblob/bench-exports/bench_llama_8da4w.pte"
for pte in "$@"; do
  [ -f "$pte" ] && [ -f "${pte%.pte}.io.json" ] ||
    { echo "hot-text: need $pte and ${pte%.pte}.io.json" >&2; exit 1; }
done
command -v valgrind > /dev/null || { echo "hot-text: needs valgrind" >&2; exit 1; }
script=$root/faces/executorch/hot-text.ld
work=$(mktemp -d /tmp/xnnblob-hot-text.XXXXXX)
# The script as it was comes back unless a new one is written.
cp "$script" "$work/previous.ld"
trap 'cp "$work/previous.ld" "$script"; rm -rf "$work"' EXIT
# Profiled as laid out without a script, so that a stale or broken one cannot stop this.
printf 'SECTIONS {\n  .text : {\n  }\n} INSERT AFTER .init;\n' > "$script"
(cd "$root" && cargo build --release -p xnnblob-executorch)
runner=$root/target/release/xnnblob-et-run

# Each program with its data and its inputs; one with a single step recorded runs it twice.
programs=()
for pte in "$@"; do
  programs+=("$pte")
  [ -f "${pte%.pte}.ptd" ] && programs+=(--data "${pte%.pte}.ptd")
  read -r n steps < <(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['steps']
print(len(s[0]['inputs']), len(s))" "${pte%.pte}.io.json")
  step='{step}'
  [ "$steps" -gt 1 ] || step=0
  for ((i = 0; i < n; i++)); do
    programs+=(--input "${pte%.pte}.s$step.in$i.bin")
  done
done
# The first launch packs (valgrind's CPU is its own, so it finds no cache of this machine's);
# the second finds everything packed.
for launch in cold warm; do
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/$launch.out" \
    "$runner" "${programs[@]}" --steps 2 --load-mode mmap --backend xnnblob \
    --cache "$work/cache" > "$work/$launch.log" 2>&1 ||
    { cat "$work/$launch.log" >&2; exit 1; }
done

# callgrind's CPU has no AVX-512 (nor what an aarch64 host has beyond NEON), so the profile names
# the microkernels XNNPACK picks for such a CPU, and the ways of splitting work they take, not
# those of this machine. A launch under gdb, stopping once at the first call of each of
# XNNPACK's, pthreadpool's and cpuinfo's functions, names what runs natively too. Without gdb,
# the script names only callgrind's (the rest stay where they lie).
: > "$work/native.txt"
if command -v gdb > /dev/null; then
  nm --defined-only "$root/target/release/libxnnblob_executorch.so" |
    awk '$2 ~ /^[tT]$/ && $3 ~ /^(xnn_|pthreadpool_|cpuinfo_)/ {print $3}' | sort -u > "$work/kernels.txt"
  cat > "$work/kernels.py" <<PY
import gdb
ran = []
class FirstCall(gdb.Breakpoint):
    def stop(self):
        # ExecuTorch's thread pool library defines pthreadpool's and cpuinfo's names too: only a
        # call into this library counts.
        where = gdb.solib_name(gdb.selected_frame().pc()) or ""
        if "libxnnblob_executorch" in where:
            ran.append(self.location)
            # One stop is enough, and the microkernels are called thousands of times.
            self.enabled = False
        return False
for command in ("set breakpoint pending on", "set pagination off", "set confirm off"):
    gdb.execute(command)
for name in open("$work/kernels.txt").read().split():
    FirstCall(name, internal=True)
gdb.execute("run")
code = gdb.parse_and_eval("\$_exitcode")
if code.type.code == gdb.TYPE_CODE_VOID or int(code) != 0:
    raise gdb.GdbError("the launch under gdb did not exit cleanly")
open("$work/native.txt", "w").write("".join(k + "\\n" for k in ran))
PY
  gdb -batch -nx -x "$work/kernels.py" --args "$runner" "${programs[@]}" --steps 2 \
    --load-mode mmap --backend xnnblob --cache "$work/native-cache" > "$work/native.log" 2>&1 &&
    [ -s "$work/native.txt" ] || { cat "$work/native.log" >&2; exit 1; }
  echo "hot-text: $(wc -l < "$work/native.txt") of XNNPACK's functions ran natively"
else
  echo "hot-text: no gdb: the microkernels this CPU runs are not named" >&2
fi

# The C and C++ in the library, as the last builds link it: XNNPACK's static libraries and
# xnnpack-sys's own C, the face's C++ and cxx's (their static constructors lie in
# `.text.startup.NAME`, their cold parts in `.text.unlikely.NAME`: named by section, not by name).
# (ExecuTorch's libraries, also on the face's search path, are shared ones: no lib*.a is taken.)
mapfile -t archives < <(for crate in xnnpack-sys xnnblob-executorch cxx; do
  sed -n 's/^cargo:rustc-link-search=native=//p' \
    "$(ls -t "$root"/target/release/build/$crate-*/output | head -1)"
done | sort -u | while read -r dir; do ls "$dir"/lib*.a 2> /dev/null || true; done)
python3 - "$work/warm.out" "$work/cold.out" "$work/native.txt" "$work/previous.ld" "${archives[@]}" \
  > "$work/hot-text.ld" <<'PY'
import os, re, subprocess, sys

def executed(path):
    """The functions of libxnnblob_executorch.so that ran, in the order callgrind names them."""
    objects, functions, current, found = {}, {}, None, []
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, i, name = m.groups()
            if name:
                objects[i] = name
            if kind == "ob":
                current = objects.get(i)
            continue
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, i, name = m.groups()
            if name:
                functions[i] = name
            if kind == "fn" and current and "libxnnblob_executorch" in current:
                found.append(functions.get(i))
    return found

def pattern(symbol):
    """A section name pattern for the symbol, rustc's hashes as wildcards, or None if it cannot
    be named safely. The hashes depend on the compiler, the flags and where the crate's sources
    lie (cargo's metadata of a path package names its directory), so an exact name would match
    only in the checkout it was profiled in; the wildcards also take in the other instances of
    a generic function that ran, a little code that did not."""
    symbol = re.sub(r"'\d+$", "", symbol)  # callgrind's mark of a recursion level
    if symbol.startswith("0x") or not re.fullmatch(r"[A-Za-z0-9_$.]+", symbol):
        return None  # an address, or a character linker scripts read otherwise
    symbol = re.sub(r"\.llvm\.\d+$", "", symbol)  # ThinLTO's suffix of an internalised copy
    symbol = re.sub(r"17h[0-9a-f]{16}E$", "17h*", symbol)  # legacy mangling's hash
    symbol = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", symbol)  # v0 mangling's crate disambiguator
    return symbol if symbol.endswith("*") else symbol + "*"

def functions_in(archive):
    """(member, section, name) of each function `objdump -t` lists in the archive."""
    member = None
    listing = subprocess.run(["objdump", "-t", archive], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        m = re.match(r"^(\S+):\s+file format ", line)
        if m:
            member = m.group(1)
            continue
        parts = line.split()
        # "VALUE FLAGS... F SECTION SIZE [VISIBILITY] NAME" (XNNPACK's own functions are
        # hidden or internal).
        if len(parts) >= 6 and parts[-2] in (".hidden", ".internal", ".protected"):
            parts = parts[:-2] + parts[-1:]
        if member and len(parts) >= 5 and parts[-4] == "F":
            yield member, parts[-3], parts[-1]

# The section of each C function, where it has one of its own.
section_of = {}
for archive in sys.argv[5:]:
    for _, section, name in functions_in(archive):
        if section.startswith(".text."):
            section_of.setdefault(name, section)

# glibc's libc_nonshared.a puts `atexit` and the like in the library itself, in objects of one
# plain `.text`: those are named by archive and member (a system archive, linked as it is).
whole = {}
nonshared = subprocess.run(["cc", "-print-file-name=libc_nonshared.a"], capture_output=True,
                           text=True).stdout.strip()
if os.path.isabs(nonshared) and os.path.exists(nonshared):
    for member, section, name in functions_in(nonshared):
        if section == ".text":
            whole.setdefault(name, f"*libc_nonshared.a:{member}(.text)")

seen, lines = set(), []
native = open(sys.argv[3]).read().split()
for symbol in executed(sys.argv[1]) + executed(sys.argv[2]) + native:
    if not symbol:
        continue
    symbol = re.sub(r"'\d+$", "", symbol)  # callgrind's mark of a recursion level
    if symbol in section_of:
        line = f"    *({section_of[symbol]})"
    elif symbol in whole:
        line = f"    {whole[symbol]}"
    else:
        p = pattern(symbol)
        line = p and f"    *(.text.{p} .text.unlikely.{p})"
    if line and line not in seen:
        seen.add(line)
        lines.append(line)
# What the script named before and this run did not stays, after what this run named: the
# microkernels another CPU picks (the last script's machine ran AVX-512 ones where this one may
# run AVX2 ones), so that one script serves every CPU it was made on. A line that matches nothing
# in the library any more is dropped by hand; faces/executorch/tests/hot_text.rs fails when too
# many do.
for line in open(sys.argv[4]).read().splitlines():
    if line.startswith("    *") and line not in seen:
        seen.add(line)
        lines.append(line)
print("/* Generated by scripts/hot-text.sh: the functions a launch runs first, together (see there). */")
print("SECTIONS {")
print("  .text : {")
print("\n".join(lines))
print("  }")
print("} INSERT AFTER .init;")
# Calls from C and C++ to other libraries go through the PLT, which the linker puts after the
# text, far from the code above: one more 64 KiB of code resident. Before the text, it lies
# beside it.
print("SECTIONS {")
print("  .plt : ALIGN(16) { *(.plt) *(.iplt) }")
print("} INSERT BEFORE .text;")
PY
mv "$work/hot-text.ld" "$script"
cp "$script" "$work/previous.ld"
echo "hot-text: $(grep -c '^    \*' "$script") sections or objects named in $script"
