//! The CMake consumer in `examples/executorch_app`: an ExecuTorch app built with CMake against the
//! wheel's package from one source, linked with xnnblob's backend (shared, then static) and with
//! ExecuTorch's own. Each build runs a program cold and warm in fresh processes. The same again
//! cross-built for aarch64 against the aarch64 wheel's package and run under `qemu-aarch64`.

use xnnblob_test_support::close::relative_difference;
use xnnblob_test_support::cross;
use xnnblob_test_support::drop_in::programs::s;
use xnnblob_test_support::drop_in::{self, f32s};
use xnnblob_test_support::scratch;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The drop-in's runner, where cargo built it for these tests (the backend library is built
/// beside it).
const ET_RUN: &str = env!("CARGO_BIN_EXE_xnnblob-et-run");

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Configures and builds the example for one backend against the ExecuTorch package at
/// `executorch` (its root), with `more` cache variables; returns the executable.
fn build_app(
    backend: &str,
    library: &Path,
    dir: &Path,
    executorch: &Path,
    more: &[String],
) -> PathBuf {
    // Ninja: the setup installs it (for XNNPACK); make is not on a fresh machine.
    let configure = Command::new("cmake")
        .args(["-G", "Ninja"])
        .arg("-S")
        .arg(repository().join("examples/executorch_app"))
        .arg("-B")
        .arg(dir)
        .arg(format!(
            "-DCMAKE_PREFIX_PATH={}/share/cmake",
            executorch.display()
        ))
        .args(more)
        .arg(format!("-DXNNBLOB_BACKEND={backend}"))
        .arg(format!(
            "-DXNNBLOB_EXECUTORCH_LIBRARY={}",
            library.display()
        ))
        .output()
        .expect("cmake is installed by scripts/install-system-deps.sh");
    assert!(
        configure.status.success(),
        "configuring the example for {backend}: {}{}",
        String::from_utf8_lossy(&configure.stdout),
        String::from_utf8_lossy(&configure.stderr)
    );
    let build = Command::new("cmake")
        .arg("--build")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "building the example for {backend}: {}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    dir.join("executorch_app")
}

/// Runs the app by `launch` (the app itself, or qemu with the app) on `program`, with the cache
/// file `cache` and, when given, a bundle of read-only caches.
fn run_app(
    mut launch: Command,
    program: &str,
    output: &Path,
    cache: &Path,
    bundle: Option<&Path>,
) -> Vec<u8> {
    let data = repository().join("tests/data/executorch");
    let out = launch
        .arg(data.join(format!("{program}.pte")))
        .arg(data.join(format!("{program}.ptd")))
        .arg(data.join("mlp_qd8.input.f32"))
        .arg(output)
        .arg(cache)
        .args(bundle)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{launch:?} on {program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(output).unwrap()
}

const PROGRAM: &str = "mlp_qd8_qc8w_external";

/// The three builds: a name, the backend, and the library given as XNNBLOB_EXECUTORCH_LIBRARY.
fn builds(shared: &Path) -> [(&'static str, &'static str, PathBuf); 3] {
    [
        ("xnnblob", "xnnblob", shared.to_path_buf()),
        ("xnnblob-static", "xnnblob", shared.with_extension("a")),
        ("executorch", "executorch", shared.to_path_buf()),
    ]
}

/// Asserts that the build `name` links the backend it names and not the other: `linked` lists
/// its libraries (ldd's, or readelf's NEEDED entries).
fn links_its_backend(name: &str, linked: &str) {
    let ours = linked.contains("libxnnblob_executorch.so");
    let theirs = linked.contains("libexecutorch_backend_xnnpack.so");
    assert_eq!(
        (ours, theirs),
        (name == "xnnblob", name == "executorch"),
        "{name} build links:\n{linked}"
    );
}

/// Runs `PROGRAM` cold, then warm with the same cache file, each launched by `launch` (given the
/// app), and asserts what a warm launch must give.
fn cold_and_warm(name: &str, backend: &str, scratch: &Path, launch: impl Fn() -> Command) {
    let expected =
        std::fs::read(repository().join(format!("tests/data/executorch/{PROGRAM}.output_et.f32")))
            .unwrap();
    let cache = scratch.join(format!("{name}.cache"));
    let cold = run_app(
        launch(),
        PROGRAM,
        &scratch.join(format!("{name}.cold.f32")),
        &cache,
        None,
    );
    let size = std::fs::metadata(&cache).unwrap().len();
    let warm = run_app(
        launch(),
        PROGRAM,
        &scratch.join(format!("{name}.warm.f32")),
        &cache,
        None,
    );
    // A warm launch computes what the cold one did, bit for bit; both match ExecuTorch's
    // stored outputs within 1e-3 of their range (bit-identical on the machine that stored
    // them, but another CPU class may pick other quantized kernels).
    assert_eq!(warm, cold, "{name}: warm output differs from cold");
    let d = relative_difference(&f32s(&cold), &f32s(&expected));
    assert!(
        d <= 1e-3,
        "{name}: {d} of the range from ExecuTorch's stored output"
    );
    assert_eq!(
        std::fs::metadata(&cache).unwrap().len(),
        size,
        "{name} cache grew"
    );
    let magic = std::fs::read(&cache).unwrap()[..8].to_vec();
    // Whose cache file it is tells whose backend ran: xnnblob's starts with its magic.
    assert_eq!(
        magic.starts_with(b"XBPWC"),
        backend == "xnnblob",
        "{name} cache {magic:?}"
    );
}

#[test]
fn the_same_app_source_runs_with_either_backend_by_its_link_line() {
    let library = drop_in::backend_library(ET_RUN);
    let scratch = scratch("cmake-app");
    for (name, backend, library) in builds(&library) {
        let root = Path::new(executorch_sys::ROOT);
        let app = build_app(backend, &library, &scratch.join(name), root, &[]);
        let linked = Command::new("ldd").arg(&app).output().unwrap();
        links_its_backend(name, &String::from_utf8_lossy(&linked.stdout));
        cold_and_warm(name, backend, &scratch, || Command::new(&app));
    }
}

/// The same source cross-built for aarch64: CMake's cross-compiling variables, Debian's cross
/// g++, and the aarch64 wheel's package (the one executorch-sys fetched for the target) as what
/// find_package searches; each build runs under `qemu-aarch64` on a Neoverse N1.
#[test]
fn the_same_app_source_cross_built_for_aarch64_runs_under_qemu_with_either_backend() {
    // From an x86-64 host only, as tests/aarch64.rs.
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the aarch64 runs are cross-built from an x86-64 host");
        return;
    }
    let started = std::time::Instant::now();
    let drop_in = drop_in::aarch64_drop_in(ET_RUN);
    let built = started.elapsed();
    let root = &drop_in.executorch_root;
    let scratch = scratch("cmake-app-aarch64");
    let cross_compiling = [
        s("-DCMAKE_SYSTEM_NAME=Linux"),
        s("-DCMAKE_SYSTEM_PROCESSOR=aarch64"),
        s("-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++"),
        // The package below the root, and the cross toolchain's libraries.
        format!(
            "-DCMAKE_FIND_ROOT_PATH={};{}",
            root.display(),
            cross::SYSROOT
        ),
    ];
    for (name, backend, library) in builds(&drop_in.library) {
        let dir = scratch.join(name);
        let app = build_app(backend, &library, &dir, root, &cross_compiling);
        // find_package took the aarch64 package, not the host's.
        let cached = std::fs::read_to_string(dir.join("CMakeCache.txt")).unwrap();
        let found = cached
            .lines()
            .find_map(|l| l.strip_prefix("executorch_DIR:PATH="))
            .unwrap_or_default();
        assert!(
            Path::new(found).starts_with(root),
            "{name}: find_package(executorch) found {found}, not below {}",
            root.display()
        );
        let header = Command::new("readelf")
            .arg("-hd")
            .arg(&app)
            .output()
            .unwrap();
        let header = String::from_utf8_lossy(&header.stdout);
        assert!(header.contains("AArch64"), "{name}: {header}");
        let needed: Vec<&str> = header.lines().filter(|l| l.contains("(NEEDED)")).collect();
        links_its_backend(name, &needed.join("\n"));
        cold_and_warm(name, backend, &scratch, || {
            cross::under_qemu("neoverse-n1", &app)
        });
    }
    eprintln!(
        "aarch64 CMake app: cross-built the drop-in in {:.1} s, then configured, built and ran \
         three builds cold and warm in {:.1} s",
        built.as_secs_f64(),
        (started.elapsed() - built).as_secs_f64()
    );
}

/// Issue 40's build integration: the example configured with `XNNBLOB_BUNDLE_PROGRAM` packs its
/// model at build time with `xnnblob_prepack` (cmake/xnnblob-prepack.cmake, which xnnblob's
/// package also ships) for this host's class and the AVX2 class; its first launch with the
/// bundle and a fresh cache path gives ExecuTorch's output and packs nothing into the cache,
/// and `cmake --install` puts the bundle beside the app.
#[test]
fn the_app_packs_its_model_at_build_time_and_its_first_launch_packs_nothing() {
    let library = drop_in::backend_library(ET_RUN);
    let scratch = scratch("cmake-app-bundle");
    let data = repository().join("tests/data/executorch");
    let xnnblob = drop_in::xnnblob_command(ET_RUN, false);
    let mut cpus = vec!["host"];
    if cfg!(target_arch = "x86_64") {
        cpus.push("x86-64-avx2");
    }
    let build = scratch.join("build");
    let more = [
        format!(
            "-DXNNBLOB_BUNDLE_PROGRAM={}",
            data.join(format!("{PROGRAM}.pte")).display()
        ),
        format!(
            "-DXNNBLOB_BUNDLE_DATA={}",
            data.join(format!("{PROGRAM}.ptd")).display()
        ),
        format!("-DXNNBLOB_BUNDLE_CPUS={}", cpus.join(";")),
        format!("-DXNNBLOB_COMMAND={}", xnnblob.display()),
        format!(
            "-DCMAKE_INSTALL_PREFIX={}",
            scratch.join("installed").display()
        ),
    ];
    let root = Path::new(executorch_sys::ROOT);
    let app = build_app("xnnblob", &library, &build, root, &more);
    let bundle = build.join("executorch_app-xnnblob-bundle");
    for cpu in &cpus {
        let file = bundle.join(format!("{PROGRAM}.{cpu}.xbc"));
        assert!(file.is_file(), "{} was not made", file.display());
    }

    let cache = scratch.join("first.cache");
    let first = run_app(
        Command::new(&app),
        PROGRAM,
        &scratch.join("first.f32"),
        &cache,
        Some(&bundle),
    );
    let expected = std::fs::read(data.join(format!("{PROGRAM}.output_et.f32"))).unwrap();
    let d = relative_difference(&f32s(&first), &f32s(&expected));
    assert!(
        d <= 1e-3,
        "{d} of the range from ExecuTorch's stored output"
    );
    // Nothing was packed into the writable cache, if it was made at all (a launch records there
    // that it checked the data file's keys): its entries are the constants it keeps for the
    // next launch (read through ExecuTorch's map this once), no packed weight.
    if cache.exists() {
        let stats = Command::new(&xnnblob)
            .args(["cache", "stats"])
            .arg(&cache)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&stats.stdout);
        let count = |after| xnnblob_test_support::cache_files::stats_count(&text, after);
        assert_eq!(count(" entries,"), count(" kept constants"), "{text}");
    }

    let install = Command::new("cmake")
        .arg("--install")
        .arg(&build)
        .output()
        .unwrap();
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    for cpu in &cpus {
        let file = scratch
            .join("installed/share/executorch_app/xnnblob-bundle")
            .join(format!("{PROGRAM}.{cpu}.xbc"));
        assert!(file.is_file(), "{} was not installed", file.display());
    }
}
