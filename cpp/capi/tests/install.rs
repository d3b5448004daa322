//! `scripts/install.sh` and the two consumers built against what it installs, outside cargo:
//! `examples/c_xnnpack` (C, raw XNNPACK with xnnblob's cache) with CMake and with pkg-config,
//! and `examples/cpp_delegate` (C++, the delegate API over a .ptd) with CMake. Each runs twice
//! in fresh processes: the first packs, the second packs nothing and prints identical outputs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a consumer twice on a fresh cache file: (first run's output, second run's output).
fn cold_then_warm(program: &Path, args: &[&Path], cache: &Path) -> (String, String) {
    let launch = || run(Command::new(program).args(args).arg(cache));
    let cold = launch();
    let warm = launch();
    (cold, warm)
}

/// "packed=N hits=M" and the output lines.
fn counters(output: &str) -> (u64, u64, Vec<&str>) {
    let mut lines = output.lines();
    let first = lines.next().unwrap();
    let field = |name: &str| -> u64 {
        first
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {first}"))
            .parse()
            .unwrap()
    };
    (field("packed"), field("hits"), lines.collect())
}

fn check_cold_then_warm(name: &str, (cold, warm): (String, String), weights: u64) {
    let (packed, hits, cold_outputs) = counters(&cold);
    assert_eq!((packed, hits), (weights, 0), "{name} cold:\n{cold}");
    let (packed, hits, warm_outputs) = counters(&warm);
    assert_eq!((packed, hits), (0, weights), "{name} warm:\n{warm}");
    assert!(!cold_outputs.is_empty());
    assert_eq!(cold_outputs, warm_outputs, "{name}: identical outputs");
}

fn cmake_build(example: &str, prefix: &Path, build: &Path) -> PathBuf {
    run(Command::new("cmake")
        .args(["-G", "Ninja", "-S"])
        .arg(repository().join("examples").join(example))
        .arg("-B")
        .arg(build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    run(Command::new("cmake").arg("--build").arg(build));
    build.join(example)
}

#[test]
fn c_and_cpp_consumers_build_against_the_installed_prefix() {
    let scratch = tempfile::Builder::new()
        .prefix("xnnblob-install-")
        .tempdir()
        .unwrap();
    let prefix = scratch.path().join("prefix");
    run(Command::new(repository().join("scripts/install.sh"))
        .arg(&prefix)
        .arg("--debug"));
    for installed in [
        "lib/libxnnblob.a",
        "lib/libxnnblob.so",
        "lib/libxnnblob_executorch.so",
        "include/xnnblob.h",
        "include/xnnblob/delegate.h",
        "include/xnnblob/src/ffi.rs.h",
        "include/rust/cxx.h",
        "include/xnnblob/xnnpack/xnnpack.h",
        "lib/pkgconfig/xnnblob.pc",
        "lib/cmake/xnnblob/xnnblob-config.cmake",
    ] {
        assert!(prefix.join(installed).is_file(), "{installed} installed");
    }
    // Test hooks stay out of what is installed.
    let bridge = std::fs::read_to_string(prefix.join("include/xnnblob/src/ffi.rs.h")).unwrap();
    assert!(!bridge.contains("cpp_delegate_checks"));
    assert!(!prefix.join("include/xnnblob/test_hooks.h").exists());
    // The shared library exports the C ABI and keeps XNNPACK private.
    let symbols = run(Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(prefix.join("lib/libxnnblob.so")));
    assert!(symbols.contains("xnnblob_cache_open_file"));
    assert!(!symbols.contains(" xnn_create_runtime"));

    let c = cmake_build("c_xnnpack", &prefix, &scratch.path().join("c"));
    check_cold_then_warm(
        "c_xnnpack (CMake)",
        cold_then_warm(&c, &[], &scratch.path().join("c.xbc")),
        2,
    );

    // The same C program built with pkg-config alone.
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "--static", "xnnblob"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let by_pkg_config = scratch.path().join("c_pkg_config");
    run(Command::new("cc")
        .args(["-std=c99", "-o"])
        .arg(&by_pkg_config)
        .arg(repository().join("examples/c_xnnpack/c_xnnpack.c"))
        .args(flags.split_whitespace()));
    check_cold_then_warm(
        "c_xnnpack (pkg-config)",
        cold_then_warm(&by_pkg_config, &[], &scratch.path().join("pc.xbc")),
        2,
    );

    let cpp = cmake_build("cpp_delegate", &prefix, &scratch.path().join("cpp"));
    let data = repository().join("tests/data/executorch");
    let (pte, ptd, input) = (
        data.join("mlp_xnn_external.pte"),
        data.join("mlp_xnn_external.ptd"),
        data.join("mlp.input.f32"),
    );
    check_cold_then_warm(
        "cpp_delegate",
        cold_then_warm(&cpp, &[&pte, &ptd, &input], &scratch.path().join("cpp.xbc")),
        3,
    );
}
