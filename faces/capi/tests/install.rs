//! `scripts/install.sh` and the two consumers built against what it installs, outside cargo:
//! `examples/c_xnnpack` (C, raw XNNPACK with xnnblob's cache) with CMake and with pkg-config,
//! and `examples/cpp_delegate` (C++, the delegate API over a .ptd) with CMake. Each runs twice
//! in fresh processes: the first packs, the second packs nothing and prints identical outputs.
//! The same again for aarch64: `install.sh --target`, the consumers cross-built with Debian's
//! cross compilers and run under `qemu-aarch64`.

use xnnblob_test_support::cross;

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

/// What builds the consumers and runs them: the host's tools, or a cross toolchain and qemu.
struct Toolchain {
    /// The target given to `install.sh --target`, if not the host.
    target: Option<&'static str>,
    /// CMake's variables for it.
    cmake: Vec<String>,
    /// The C compiler for the pkg-config build.
    c_compiler: &'static str,
    /// What `readelf -h` says the installed libraries are for.
    machine: &'static str,
    /// A command that runs `program`.
    launch: fn(&Path) -> Command,
}

impl Toolchain {
    fn host() -> Self {
        Toolchain {
            target: None,
            cmake: Vec::new(),
            c_compiler: "cc",
            machine: if cfg!(target_arch = "aarch64") {
                "AArch64"
            } else {
                "X86-64"
            },
            launch: |program| Command::new(program),
        }
    }

    /// Debian's aarch64 cross compilers, CMake's cross-compiling variables, and `qemu-aarch64`
    /// on a Neoverse N1 (dot product kernels).
    fn aarch64() -> Self {
        Toolchain {
            target: Some(cross::TARGET),
            cmake: [
                "-DCMAKE_SYSTEM_NAME=Linux",
                "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
                "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
            ]
            .map(str::to_string)
            .to_vec(),
            c_compiler: "aarch64-linux-gnu-gcc",
            machine: "AArch64",
            launch: |program| cross::under_qemu("neoverse-n1", program),
        }
    }
}

/// Runs a consumer twice on a fresh cache file: (first run's output, second run's output).
fn cold_then_warm(
    toolchain: &Toolchain,
    program: &Path,
    args: &[&Path],
    cache: &Path,
) -> (String, String) {
    let launch = || run((toolchain.launch)(program).args(args).arg(cache));
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

fn cmake_build(toolchain: &Toolchain, example: &str, prefix: &Path, build: &Path) -> PathBuf {
    run(Command::new("cmake")
        .args(["-G", "Ninja", "-S"])
        .arg(repository().join("examples").join(example))
        .arg("-B")
        .arg(build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .args(&toolchain.cmake));
    run(Command::new("cmake").arg("--build").arg(build));
    let program = build.join(example);
    assert_machine(toolchain, &program);
    program
}

/// Asserts that the ELF file at `path` is for the toolchain's machine.
fn assert_machine(toolchain: &Toolchain, path: &Path) {
    let header = run(Command::new("readelf").arg("-h").arg(path));
    let machine = header
        .lines()
        .find_map(|l| l.trim().strip_prefix("Machine:"))
        .map(str::trim)
        .unwrap_or_default();
    assert!(
        machine.contains(toolchain.machine),
        "{}: built for {machine}, not {}",
        path.display(),
        toolchain.machine
    );
}

/// Installs with `toolchain`, checks what was installed, and builds and runs both consumers
/// against it, cold then warm.
fn install_and_consume(toolchain: &Toolchain) {
    let scratch = tempfile::Builder::new()
        .prefix("xnnblob-install-")
        .tempdir()
        .unwrap();
    let prefix = scratch.path().join("prefix");
    let mut install = Command::new(repository().join("scripts/install.sh"));
    install.arg(&prefix).arg("--debug");
    if let Some(target) = toolchain.target {
        install.args(["--target", target]);
    }
    let said = run(&mut install);
    assert!(
        said.contains(toolchain.target.unwrap_or("(debug)")),
        "install.sh said: {said}"
    );
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
        "lib/cmake/xnnblob/xnnblob-prepack.cmake",
        "bin/xnnblob",
    ] {
        assert!(prefix.join(installed).is_file(), "{installed} installed");
    }
    for library in ["libxnnblob.a", "libxnnblob.so", "libxnnblob_executorch.so"] {
        assert_machine(toolchain, &prefix.join("lib").join(library));
    }
    assert_machine(toolchain, &prefix.join("bin/xnnblob"));
    if toolchain.target.is_none() {
        prepack_with_the_package(&prefix, scratch.path());
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

    let c = cmake_build(toolchain, "c_xnnpack", &prefix, &scratch.path().join("c"));
    check_cold_then_warm(
        "c_xnnpack (CMake)",
        cold_then_warm(toolchain, &c, &[], &scratch.path().join("c.xbc")),
        2,
    );

    // The same C program built with pkg-config alone.
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "--static", "xnnblob"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let by_pkg_config = scratch.path().join("c_pkg_config");
    run(Command::new(toolchain.c_compiler)
        .args(["-std=c99", "-o"])
        .arg(&by_pkg_config)
        .arg(repository().join("examples/c_xnnpack/c_xnnpack.c"))
        .args(flags.split_whitespace()));
    assert_machine(toolchain, &by_pkg_config);
    check_cold_then_warm(
        "c_xnnpack (pkg-config)",
        cold_then_warm(
            toolchain,
            &by_pkg_config,
            &[],
            &scratch.path().join("pc.xbc"),
        ),
        2,
    );

    let cpp = cmake_build(
        toolchain,
        "cpp_delegate",
        &prefix,
        &scratch.path().join("cpp"),
    );
    let data = repository().join("tests/data/executorch");
    let (pte, ptd, input) = (
        data.join("mlp_xnn_external.pte"),
        data.join("mlp_xnn_external.ptd"),
        data.join("mlp.input.f32"),
    );
    check_cold_then_warm(
        "cpp_delegate",
        cold_then_warm(
            toolchain,
            &cpp,
            &[&pte, &ptd, &input],
            &scratch.path().join("cpp.xbc"),
        ),
        3,
    );
}

/// A CMake project that finds the installed package and calls its `xnnblob_prepack()`: the
/// build packs the program for this host's class with the installed `bin/xnnblob`.
fn prepack_with_the_package(prefix: &Path, scratch: &Path) {
    let data = repository().join("tests/data/executorch");
    let source = scratch.join("bundle-project");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(
        source.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.19)\n\
             project(bundle_only C)\n\
             find_package(xnnblob CONFIG REQUIRED)\n\
             add_custom_target(app ALL)\n\
             xnnblob_prepack(app PROGRAM \"{}\" DATA \"{}\" CPUS host)\n",
            data.join("mlp_xnn_external.pte").display(),
            data.join("mlp_xnn_external.ptd").display()
        ),
    )
    .unwrap();
    let build = scratch.join("bundle-build");
    run(Command::new("cmake")
        .args(["-G", "Ninja", "-S"])
        .arg(&source)
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    run(Command::new("cmake").arg("--build").arg(&build));
    let bundle = build.join("app-xnnblob-bundle/mlp_xnn_external.host.xbc");
    let stats = run(Command::new(prefix.join("bin/xnnblob"))
        .args(["cache", "stats"])
        .arg(&bundle));
    // The MLP's three packed weights, beside the constants the file keeps (its delegate's
    // identities among them).
    let count = |after| xnnblob_test_support::cache_files::stats_count(&stats, after);
    assert_eq!(count(" entries,") - count(" kept constants"), 3, "{stats}");
}

#[test]
fn c_and_cpp_consumers_build_against_the_installed_prefix() {
    install_and_consume(&Toolchain::host());
}

/// `install.sh --target aarch64-unknown-linux-gnu`: every installed library is an aarch64 one,
/// and the same consumers, cross-built against the prefix, run under qemu cold then warm.
#[test]
fn an_aarch64_install_serves_cross_built_consumers_that_run_under_qemu() {
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the aarch64 install is cross-built from an x86-64 host");
        return;
    }
    install_and_consume(&Toolchain::aarch64());
}

/// A target whose system libraries the install does not know is refused before anything is
/// built or created, saying why.
#[test]
fn an_android_target_is_refused_before_anything_is_built() {
    let scratch = tempfile::Builder::new()
        .prefix("xnnblob-install-")
        .tempdir()
        .unwrap();
    let prefix = scratch.path().join("prefix");
    let out = Command::new(repository().join("scripts/install.sh"))
        .arg(&prefix)
        .args(["--target", "aarch64-linux-android"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("aarch64-linux-android") && said.contains("only Linux GNU targets"),
        "{said}"
    );
    assert!(!prefix.exists(), "the prefix was created");
}
