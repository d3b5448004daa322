use std::env;

fn main() {
    let mut build = cxx_build::bridge("src/ffi.rs");
    build
        .std("c++17")
        .include("cpp/include")
        .file("cpp/src/xnnblob.cc")
        .file("cpp/src/delegate.cc")
        .file("cpp/examples/minimal_delegate.cc")
        .file("cpp/tests/delegate_checks.cc")
        .file("cpp/tests/program_run.cc")
        .file("cpp/tests/stateful_checks.cc")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra");
    // xnnpack-sys publishes its header directories (DEP_XNNPACK_INCLUDE).
    if let Some(dirs) = env::var_os("DEP_XNNPACK_INCLUDE") {
        for dir in env::split_paths(&dirs) {
            build.include(dir);
        }
    }
    build.compile("xnnblob-cxx");
    for path in ["src/ffi.rs", "cpp"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
