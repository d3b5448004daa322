//! Compiles the cxx bridge (`src/ffi.rs`) and the C++ delegate API (`src/*.cc`) against
//! XNNPACK's headers. Its generated header keeps the path C++ code includes it by,
//! `xnnblob/src/ffi.rs.h`.

use std::env;

fn main() {
    cxx_build::CFG.include_prefix = "xnnblob";
    let mut build = cxx_build::bridge("src/ffi.rs");
    // xnnpack-sys publishes its header directories to its direct dependents.
    let xnnpack_include: Vec<_> = env::var_os("DEP_XNNPACK_INCLUDE")
        .map(|dirs| env::split_paths(&dirs).collect())
        .unwrap_or_default();
    build
        .std("c++17")
        .include("include")
        .includes(&xnnpack_include)
        .file("src/xnnblob.cc")
        .file("src/delegate.cc")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .compile("xnnblob-cxx");
    for path in ["src/ffi.rs", "src/xnnblob.cc", "src/delegate.cc", "include"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
