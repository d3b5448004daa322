"""xnnblob beside ExecuTorch's wheel: where its C/C++ SDK and programs are installed.

The wheel (scripts/build-wheels.sh, docs/wheel.md) holds no Python API of xnnblob's: it holds
the drop-in ``libxnnblob_executorch.so``, the C ABI (``libxnnblob.a``, ``libxnnblob.so``), their
headers, a CMake package and pkg-config files, and the ``xnnblob`` and ``xnnblob-et-run``
programs. This module says where they are, as CMake and build scripts need::

    cmake -DCMAKE_PREFIX_PATH="$(python -c 'import xnnblob; print(xnnblob.cmake_prefix_path())')"
"""

import importlib.util
import os

from ._build import EXECUTORCH_VERSION, TARGET, VERSION, XNNPACK_VERSION

__all__ = [
    "version",
    "executorch_version",
    "xnnpack_version",
    "target",
    "root",
    "bin_dir",
    "lib_dir",
    "include_dir",
    "cmake_dir",
    "pkgconfig_dir",
    "executorch_cmake_dir",
    "cmake_prefix_path",
]

#: xnnblob's version (the workspace Cargo.toml's).
version = VERSION
__version__ = VERSION
#: The ExecuTorch release the drop-in was built against; it refuses a runtime of another.
executorch_version = EXECUTORCH_VERSION
#: The XNNPACK built into the libraries (Debian's source version, which names its commit).
xnnpack_version = XNNPACK_VERSION
#: The Rust target triple the wheel was built for.
target = TARGET

_ROOT = os.path.dirname(os.path.abspath(__file__))


def root():
    """The installed package: bin/, lib/, include/ below it."""
    return _ROOT


def bin_dir():
    """``xnnblob`` and ``xnnblob-et-run`` (also on PATH as console scripts)."""
    return os.path.join(_ROOT, "bin")


def lib_dir():
    """``libxnnblob.a``, ``libxnnblob.so``, ``libxnnblob_executorch.so``."""
    return os.path.join(_ROOT, "lib")


def include_dir():
    """``xnnblob.h`` (C), ``xnnblob/*.h`` (C++), ``xnnblob/xnnpack/`` (XNNPACK's headers)."""
    return os.path.join(_ROOT, "include")


def cmake_dir():
    """The directory of ``xnnblob-config.cmake``: ``find_package(xnnblob)`` with this in
    ``CMAKE_PREFIX_PATH`` (or as ``xnnblob_DIR``)."""
    return os.path.join(_ROOT, "lib", "cmake", "xnnblob")


def pkgconfig_dir():
    """``xnnblob.pc`` and ``xnnblob-shared.pc``, for ``PKG_CONFIG_PATH``."""
    return os.path.join(_ROOT, "lib", "pkgconfig")


def executorch_cmake_dir():
    """ExecuTorch's CMake package (``executorch/share/cmake``) in the executorch wheel this
    Python finds. ExecuTorch's package has no module that says it, so it is found here."""
    spec = importlib.util.find_spec("executorch")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = os.path.join(location, "share", "cmake")
        if os.path.isfile(os.path.join(candidate, "executorch-config.cmake")):
            return candidate
    raise FileNotFoundError(
        "no executorch package with share/cmake/executorch-config.cmake is importable here "
        "(searched %s): pip install --no-deps executorch==%s" % (locations, EXECUTORCH_VERSION)
    )


def cmake_prefix_path():
    """``CMAKE_PREFIX_PATH`` for an app built against both packages: xnnblob's and
    ExecuTorch's CMake directories, separated by ``;``."""
    return ";".join([cmake_dir(), executorch_cmake_dir()])
