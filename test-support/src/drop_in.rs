//! What the drop-in's tests and its peer bench share (`faces/executorch`): the backend library
//! and the `xnnblob` command built beside the runner, the drop-in cross-built for aarch64, and
//! the programs they run through `xnnblob-et-run` ([`programs`]).
//!
//! Cargo tells only that package's tests and benches where it built the runner
//! (`env!("CARGO_BIN_EXE_xnnblob-et-run")`), so they pass that path in; everything else is
//! found from it and from this repository's layout.

use crate::cross;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod programs;

/// The drop-in's package directory, `faces/executorch`.
fn package_dir() -> PathBuf {
    crate::repo_root().join("faces/executorch")
}

/// The directory the runner `et_run` was built into, and the target directory above it.
fn runner_dirs(et_run: &Path) -> (&Path, &Path) {
    let bin_dir = et_run.parent().unwrap();
    (bin_dir, bin_dir.parent().unwrap())
}

/// Builds `libxnnblob_executorch.so` beside the runner `et_run` (where it looks for it), once,
/// and returns its path: cargo builds only the rlib of that package for its tests, not the shared
/// library.
pub fn backend_library(et_run: impl AsRef<Path>) -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let (bin_dir, target_dir) = runner_dirs(et_run.as_ref());
    BUILT.get_or_init(|| {
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .args([
                "build",
                "--lib",
                "-p",
                "xnnblob-executorch",
                "--manifest-path",
            ])
            .arg(package_dir().join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir);
        if bin_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().unwrap();
        assert!(status.success(), "building libxnnblob_executorch.so failed");
        assert!(bin_dir.join("libxnnblob_executorch.so").is_file());
    });
    bin_dir.join("libxnnblob_executorch.so")
}

/// Output bytes as little-endian f32 values (the crate's own [`crate::f32s`] reads a file).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The drop-in cross-built for aarch64 (tests/aarch64.rs, tests/cmake_app.rs).
pub struct Aarch64DropIn {
    /// `xnnblob-et-run`.
    pub runner: PathBuf,
    /// `libxnnblob_executorch.so`, beside the runner (which loads it from its own directory).
    pub library: PathBuf,
    /// ExecuTorch's aarch64 package root (`include/`, `lib/`, `share/cmake/`), as executorch-sys
    /// found or installed it for the target.
    pub executorch_root: PathBuf,
}

/// Cross-builds the runner and the backend library once (a nested cargo, into the target
/// directory and profile of the host's runner `et_run`, as [`backend_library`] finds them), and
/// says where they are.
pub fn aarch64_drop_in(et_run: impl AsRef<Path>) -> &'static Aarch64DropIn {
    use cross::TARGET;
    static BUILT: std::sync::OnceLock<Aarch64DropIn> = std::sync::OnceLock::new();
    let (host_bin, target_dir) = runner_dirs(et_run.as_ref());
    BUILT.get_or_init(|| {
        let mut args = vec!["build", "-p", "xnnblob-executorch", "--lib", "--bins"];
        if host_bin.file_name().is_some_and(|n| n == "release") {
            args.push("--release");
        }
        let built =
            cross::cargo_for_target(&package_dir(), &args, &[("CARGO_TARGET_DIR", target_dir)]);
        let runner = built
            .artifacts
            .iter()
            .filter(|a| a.name == "xnnblob-et-run")
            .find_map(|a| a.executable.clone())
            .unwrap_or_else(|| panic!("cargo names xnnblob-et-run built for {TARGET}"));
        let library = built
            .artifacts
            .iter()
            .filter(|a| a.name == "xnnblob_executorch")
            .flat_map(|a| &a.filenames)
            .find(|f| f.extension().is_some_and(|e| e == "so"))
            .cloned()
            .unwrap_or_else(|| panic!("cargo names libxnnblob_executorch.so built for {TARGET}"));
        assert_eq!(library.parent(), runner.parent(), "{}", library.display());
        let executorch_root = built
            .rustc_env("XNNBLOB_EXECUTORCH_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("executorch-sys names ExecuTorch's root for {TARGET}"));
        Aarch64DropIn {
            runner,
            library,
            executorch_root,
        }
    })
}

/// The `xnnblob` command (the CLI crate's binary), built by a nested cargo into the target
/// directory and profile of the host's runner `et_run`: for this host, or with `aarch64` for
/// [`cross::TARGET`] (`xnnblob prepack` runs that one under qemu for the aarch64 classes).
pub fn xnnblob_command(et_run: impl AsRef<Path>, aarch64: bool) -> PathBuf {
    let (host_bin, target_dir) = runner_dirs(et_run.as_ref());
    let mut args = vec!["build", "-p", "xnnblob-cli", "--bin", "xnnblob"];
    if host_bin.file_name().is_some_and(|n| n == "release") {
        args.push("--release");
    }
    let workspace = crate::repo_root();
    if aarch64 {
        return cross::cargo_for_target(workspace, &args, &[("CARGO_TARGET_DIR", target_dir)])
            .artifacts
            .into_iter()
            .filter(|a| a.name == "xnnblob")
            .find_map(|a| a.executable)
            .unwrap_or_else(|| panic!("cargo names xnnblob built for {}", cross::TARGET));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .current_dir(workspace)
        .args(&args)
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    host_bin.join("xnnblob")
}
