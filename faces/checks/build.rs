//! Compiles C and C++ written as the faces' users write it: the C++ checks and the documented
//! example against `xnnblob-cxx`'s headers and generated bridge header, and the C checks (with
//! `examples/c_xnnpack` as a library) as C99 against `xnnblob.h` and XNNPACK's header.

use std::env;
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let repo = root.join("../..");
    let split = |var: &str| -> Vec<PathBuf> {
        env::var_os(var)
            .map(|dirs| env::split_paths(&dirs).collect())
            .unwrap_or_default()
    };
    // Published by the crates this one depends on directly (their `links` metadata).
    let bridge_include = split("DEP_XNNBLOB_CXXBRIDGE_DIR0");
    let xnnpack_include = split("DEP_XNNPACK_INCLUDE");

    cxx_build::bridge("src/lib.rs")
        .std("c++17")
        .include(repo.join("faces/cxx/include"))
        .includes(&bridge_include)
        .includes(&xnnpack_include)
        .file("hooks/delegate_checks.cc")
        .file("hooks/program_run.cc")
        .file("hooks/stateful_checks.cc")
        .file(repo.join("faces/cxx/examples/minimal_delegate.cc"))
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .compile("xnnblob-cpp-checks");

    cc::Build::new()
        .std("c99")
        .include(repo.join("faces/capi/include"))
        .includes(&xnnpack_include)
        .define("XNNBLOB_EXAMPLE_AS_LIBRARY", None)
        .file(repo.join("examples/c_xnnpack/c_xnnpack.c"))
        .file("hooks/c_map_check.c")
        .file("hooks/c_identity_check.c")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .compile("xnnblob-c-checks");

    for path in [
        "src/lib.rs",
        "hooks",
        "../cxx/examples/minimal_delegate.cc",
        "../cxx/include",
        "../capi/include",
        "../../examples/c_xnnpack",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
