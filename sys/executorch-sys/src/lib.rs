//! Where ExecuTorch 1.5.1's C++ runtime is: the build script finds or installs it (see its module
//! docs) and records the paths here, for build scripts (`DEP_EXECUTORCH_ROOT`, `_INCLUDE`, `_LIB`)
//! and for programs and tests that load its libraries at run time.

/// The ExecuTorch release everything here is built against (`executorch==VERSION`).
pub const VERSION: &str = env!("XNNBLOB_EXECUTORCH_VERSION");

/// The package root: `include/` and `lib/` below it.
pub const ROOT: &str = env!("XNNBLOB_EXECUTORCH_ROOT");

/// The headers (`-I` this, and this plus [`C10_INCLUDE_SUFFIX`]).
pub const INCLUDE_DIR: &str = env!("XNNBLOB_EXECUTORCH_INCLUDE");

/// `libexecutorch.so`, `libexecutorch_kernels_optimized.so`, `libexecutorch_backend_xnnpack.so`.
pub const LIB_DIR: &str = env!("XNNBLOB_EXECUTORCH_LIB");

/// ExecuTorch's headers include c10's by a path relative to this directory under [`INCLUDE_DIR`].
pub const C10_INCLUDE_SUFFIX: &str = "executorch/runtime/core/portable_type/c10";

/// The preprocessor definitions a consumer of this ExecuTorch compiles with (space-separated), as
/// its CMake package gives them: c10 from ExecuTorch's own copy, the event tracer the libraries
/// were built with, and the thread pool where one ships.
pub const DEFINES: &str = env!("XNNBLOB_EXECUTORCH_DEFINES");

/// ExecuTorch's own XNNPACK backend library (the peer), as a path.
pub fn executorch_xnnpack_backend() -> std::path::PathBuf {
    std::path::Path::new(LIB_DIR).join("libexecutorch_backend_xnnpack.so")
}
