#!/usr/bin/env python3
"""Writes xnnblob's wheel from a scripts/install.sh prefix (scripts/build-wheels.sh runs it).

    scripts/wheel.py --prefix PREFIX --target TRIPLE --out DIR [--forbid PATH]...

The wheel (PEP 427) is a zip: the package `xnnblob/` (python/xnnblob/*.py, a generated
`_build.py` with the versions, and the install's bin/, lib/, include/) and
`xnnblob-VERSION.dist-info/` with METADATA, WHEEL, entry_points.txt and RECORD (each file's
sha256, urlsafe base64 without padding, and size). Before the wheel is kept this script checks:
- every ELF file's RUNPATH is relative to $ORIGIN, and no ELF names an absolute library;
- no package file (and no ELF's dynamic section) holds a --forbid path (the build machine's);
- the platform tag is manylinux_2_N, N the newest glibc symbol version any ELF needs;
- the zip it wrote reads back, every member listed in RECORD with a matching hash.
Debug information is stripped from the binaries and libraries (the target's strip).

Only the standard library and binutils (readelf, strip) are used.
"""

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A fixed date for every member: the same inputs give the same wheel.
DATE = (2020, 1, 1, 0, 0, 0)


class WheelError(Exception):
    """Why no wheel was written."""


def run(args):
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise WheelError("%s failed (%d): %s" % (" ".join(args), done.returncode, done.stderr))
    return done.stdout


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def is_archive(path):
    with open(path, "rb") as f:
        return f.read(8) == b"!<arch>\n"


def versions(prefix):
    """The variables install.sh wrote into xnnblob-versions.cmake."""
    path = os.path.join(prefix, "lib/cmake/xnnblob/xnnblob-versions.cmake")
    found = {}
    with open(path) as f:
        for line in f:
            m = re.match(r'set\((xnnblob_\w+) "([^"]*)"\)', line.strip())
            if m:
                found[m.group(1)] = m.group(2)
    for name in ("xnnblob_VERSION", "xnnblob_EXECUTORCH_VERSION", "xnnblob_XNNPACK_VERSION",
                 "xnnblob_TARGET"):
        if not found.get(name):
            raise WheelError("%s sets no %s" % (path, name))
    return found


def strip_tool(target):
    arch = target.split("-")[0]
    if arch == os.uname().machine:
        return "strip"
    tool = "%s-linux-gnu-strip" % arch
    if shutil.which(tool) is None:
        raise WheelError("%s is not installed (scripts/install-system-deps.sh installs the "
                         "cross binutils)" % tool)
    return tool


def check_elf(path, name, forbid):
    """The newest GLIBC_2.N the ELF needs (N), after checking its dynamic section."""
    dynamic = run(["readelf", "-d", "-W", path])
    for line in dynamic.splitlines():
        m = re.search(r"\((RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", line)
        if m:
            for entry in m.group(2).split(":"):
                if not entry.startswith("$ORIGIN"):
                    raise WheelError("%s: %s %s is not relative to $ORIGIN" %
                                     (name, m.group(1), entry))
        m = re.search(r"\(NEEDED\)\s+Shared library: \[(.*)\]", line)
        if m and "/" in m.group(1):
            raise WheelError("%s needs %s by a path" % (name, m.group(1)))
    for path_text in forbid:
        if path_text in dynamic:
            raise WheelError("%s's dynamic section names %s" % (name, path_text))
    needed = 0
    for m in re.finditer(r"GLIBC_2\.(\d+)", run(["readelf", "-V", "-W", path])):
        needed = max(needed, int(m.group(1)))
    return needed


def leftover_paths(data, forbid):
    return [p for p in forbid if p.encode() in data]


def build(args):
    prefix = os.path.abspath(args.prefix)
    found = versions(prefix)
    version = found["xnnblob_VERSION"]
    arch = args.target.split("-")[0]
    if arch not in ("x86_64", "aarch64") or "-linux-gnu" not in args.target:
        raise WheelError("no manylinux tag for %s: x86-64 and aarch64 Linux GNU only" % args.target)
    if found["xnnblob_TARGET"] != args.target:
        raise WheelError("%s was installed for %s, not %s" %
                         (prefix, found["xnnblob_TARGET"], args.target))
    forbid = [os.path.abspath(p) for p in args.forbid if p and p != "/"]
    strip = strip_tool(args.target)

    files = []  # (name in the wheel, bytes, executable)
    glibc = 0
    notes = []
    with tempfile.TemporaryDirectory() as scratch:
        for top in ("bin", "lib", "include"):
            for dirpath, dirnames, filenames in os.walk(os.path.join(prefix, top)):
                dirnames.sort()
                for filename in sorted(filenames):
                    source = os.path.join(dirpath, filename)
                    name = "xnnblob/" + os.path.relpath(source, prefix)
                    executable = os.access(source, os.X_OK)
                    if is_elf(source) or is_archive(source):
                        copy = os.path.join(scratch, filename)
                        shutil.copyfile(source, copy)
                        run([strip, "--strip-debug", copy])
                        if is_elf(copy):
                            glibc = max(glibc, check_elf(copy, name, forbid))
                        with open(copy, "rb") as f:
                            data = f.read()
                        os.remove(copy)
                        left = leftover_paths(data, forbid)
                        if left:
                            # C and C++ objects built elsewhere (XNNPACK's, from its cache) may
                            # keep source paths in assertion messages: said, not fatal.
                            notes.append("%s still mentions %s in its strings" %
                                         (name, ", ".join(left)))
                    else:
                        with open(source, "rb") as f:
                            data = f.read()
                        left = leftover_paths(data, forbid)
                        if left:
                            raise WheelError("%s names %s" % (name, ", ".join(left)))
                    files.append((name, data, executable))
    if glibc == 0:
        raise WheelError("no ELF file in %s needs a GLIBC symbol version" % prefix)

    for filename in ("__init__.py", "_cli.py"):
        with open(os.path.join(REPO, "python/xnnblob", filename), "rb") as f:
            files.append(("xnnblob/" + filename, f.read(), False))
    build_py = (
        '"""Written by scripts/wheel.py: what this wheel was built from."""\n'
        "VERSION = %r\nEXECUTORCH_VERSION = %r\nXNNPACK_VERSION = %r\nTARGET = %r\n"
        % (version, found["xnnblob_EXECUTORCH_VERSION"], found["xnnblob_XNNPACK_VERSION"],
           args.target))
    files.append(("xnnblob/_build.py", build_py.encode(), False))

    tag = "py3-none-manylinux_2_%d_%s" % (glibc, arch)
    dist_info = "xnnblob-%s.dist-info" % version
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: xnnblob",
        "Version: " + version,
        "Summary: Fast XNNPACK model loading: a drop-in XnnpackBackend for ExecuTorch %s's "
        "C++ runtime, a persistent packed-weight cache, a C ABI, the xnnblob command"
        % found["xnnblob_EXECUTORCH_VERSION"],
        "License: BSD-3-Clause",
        "Requires-Python: >=3.8",
        # The drop-in runs in this ExecuTorch's libexecutorch.so and refuses another.
        "Requires-Dist: executorch==%s" % found["xnnblob_EXECUTORCH_VERSION"],
        "",
        "The C/C++ SDK and programs of xnnblob, built with XNNPACK %s. "
        "`import xnnblob; xnnblob.cmake_dir()` says where the CMake package is."
        % found["xnnblob_XNNPACK_VERSION"],
        "",
    ])
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: xnnblob scripts/wheel.py",
        "Root-Is-Purelib: false",
        "Tag: " + tag,
        "",
    ])
    entry_points = "\n".join([
        "[console_scripts]",
        "xnnblob = xnnblob._cli:xnnblob",
        "xnnblob-et-run = xnnblob._cli:et_run",
        "",
    ])
    for name, text in (("METADATA", metadata), ("WHEEL", wheel),
                       ("entry_points.txt", entry_points)):
        files.append((dist_info + "/" + name, text.encode(), False))

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data, _ in files:
        writer.writerow([name, "sha256=" + digest(data), len(data)])
    writer.writerow([dist_info + "/RECORD", "", ""])
    files.append((dist_info + "/RECORD", record.getvalue().encode(), False))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "xnnblob-%s-%s.whl" % (version, tag))
    partial = path + ".partial"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            info = zipfile.ZipInfo(name, DATE)
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    verify(partial, dist_info)
    os.replace(partial, path)
    for note in notes:
        print("wheel: note: " + note, file=sys.stderr)
    print("wheel: %s (%.1f MiB; needs glibc 2.%d)" %
          (path, os.path.getsize(path) / 2**20, glibc))
    return path


def digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def verify(path, dist_info):
    """Reads the wheel back: RECORD lists every member once, with its hash and size."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        if len(set(names)) != len(names):
            raise WheelError("%s has a member twice" % path)
        rows = list(csv.reader(io.StringIO(z.read(dist_info + "/RECORD").decode())))
        listed = {row[0] for row in rows}
        if listed != set(names):
            raise WheelError("%s: RECORD and the members differ: %s" %
                             (path, sorted(listed.symmetric_difference(names))))
        for name, hash_text, size in rows:
            if name == dist_info + "/RECORD":
                continue
            data = z.read(name)
            if hash_text != "sha256=" + digest(data) or int(size) != len(data):
                raise WheelError("%s: RECORD's hash or size of %s is wrong" % (path, name))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="a scripts/install.sh prefix")
    parser.add_argument("--target", required=True, help="the Rust target it was built for")
    parser.add_argument("--out", required=True, help="where the wheel goes")
    parser.add_argument("--forbid", action="append", default=[],
                        help="a path no package file may name (the build machine's)")
    try:
        build(parser.parse_args())
    except (WheelError, OSError) as e:
        sys.exit("wheel: %s" % e)


if __name__ == "__main__":
    main()
