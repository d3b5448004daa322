"""The console scripts: each runs the program of the same name in the package's bin/, with the
same arguments (the process becomes that program, so its exit status is the script's)."""

import os
import sys

from . import bin_dir


def _exec(name):
    path = os.path.join(bin_dir(), name)
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.exit("xnnblob: cannot run %s: %s" % (path, e))


def xnnblob():
    _exec("xnnblob")


def et_run():
    _exec("xnnblob-et-run")
