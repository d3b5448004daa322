fn main() {
    // Without the xnnpack feature the crate is the format layer: no C++ at all.
    #[cfg(feature = "xnnpack")]
    cxx_bridge();
}

/// The cxx bridge and the C++ delegate API, built against XNNPACK's headers.
#[cfg(feature = "xnnpack")]
fn cxx_bridge() {
    use std::env;
    let mut build = cxx_build::bridge("src/ffi.rs");
    build
        .std("c++17")
        .include("cpp/include")
        .file("cpp/src/xnnblob.cc")
        .file("cpp/src/delegate.cc")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra");
    // xnnblob's own C++ test hooks: only when its tests turn the feature on, so the library a
    // user builds carries none of them.
    if env::var_os("CARGO_FEATURE_TEST_HOOKS").is_some() {
        build
            .include("cpp/tests/include")
            .file("cpp/examples/minimal_delegate.cc")
            .file("cpp/tests/delegate_checks.cc")
            .file("cpp/tests/program_run.cc")
            .file("cpp/tests/stateful_checks.cc");
    }
    // xnnpack-sys publishes its header directories (DEP_XNNPACK_INCLUDE).
    let xnnpack_include: Vec<_> = env::var_os("DEP_XNNPACK_INCLUDE")
        .map(|dirs| env::split_paths(&dirs).collect())
        .unwrap_or_default();
    build.includes(&xnnpack_include);
    build.compile("xnnblob-cxx");
    // The C ABI's own C consumer (tests/c_abi.rs), as a C99 compiler sees cpp/include/xnnblob.h.
    #[cfg(feature = "test-hooks")]
    {
        cc::Build::new()
            .std("c99")
            .include("cpp/include")
            .includes(&xnnpack_include)
            .define("XNNBLOB_EXAMPLE_AS_LIBRARY", None)
            .file("examples/c_xnnpack/c_xnnpack.c")
            .file("cpp/tests/c_map_check.c")
            .flag_if_supported("-Wall")
            .flag_if_supported("-Wextra")
            .compile("xnnblob-c-checks");
    }
    for path in ["src/ffi.rs", "cpp", "examples/c_xnnpack"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
