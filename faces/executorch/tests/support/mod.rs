//! What the ExecuTorch tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `libxnnblob_executorch.so` beside the runner (where it looks for it), once, and returns
/// its path: cargo builds only the rlib of this package for its tests, not the shared library.
pub fn backend_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
        .parent()
        .unwrap();
    BUILT.get_or_init(|| {
        let target_dir = bin_dir.parent().unwrap();
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .args([
                "build",
                "--lib",
                "-p",
                "xnnblob-executorch",
                "--manifest-path",
            ])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
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

#[allow(unused_imports)] // the bench shares this module and makes none
pub use xnnblob_test_support::{scratch, without_permission_override, Tmpfs};

/// Output bytes as little-endian f32 values.
#[allow(dead_code)] // each test crate uses its own subset
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The closeness checks of xnnblob's own tests: one definition of "matches" (length, NaN,
/// tolerance) for both crates.
#[allow(unused_imports)]
pub use xnnblob_test_support::close::relative_difference;

/// Building for aarch64 and running the result under qemu-aarch64 (tests/aarch64.rs).
pub use xnnblob_test_support::cross;

/// The drop-in cross-built for aarch64 (tests/aarch64.rs, tests/cmake_app.rs).
#[allow(dead_code)]
pub struct Aarch64DropIn {
    /// `xnnblob-et-run`.
    pub runner: PathBuf,
    /// `libxnnblob_executorch.so`, beside the runner (which loads it from its own directory).
    pub library: PathBuf,
    /// ExecuTorch's aarch64 package root (`include/`, `lib/`, `share/cmake/`), as executorch-sys
    /// found or installed it for the target.
    pub executorch_root: PathBuf,
}

/// Cross-builds the runner and the backend library once (a nested cargo, into this build's target
/// directory and profile, as [`backend_library`] finds them), and says where they are.
#[allow(dead_code)]
pub fn aarch64_drop_in() -> &'static Aarch64DropIn {
    use cross::TARGET;
    static BUILT: std::sync::OnceLock<Aarch64DropIn> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let host_bin = Path::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
            .parent()
            .unwrap();
        let target_dir = host_bin.parent().unwrap();
        let mut args = vec!["build", "-p", "xnnblob-executorch", "--lib", "--bins"];
        if host_bin.file_name().is_some_and(|n| n == "release") {
            args.push("--release");
        }
        let built = cross::cargo_for_target(
            Path::new(env!("CARGO_MANIFEST_DIR")),
            &args,
            &[("CARGO_TARGET_DIR", target_dir)],
        );
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

/// The `xnnblob` command (the CLI crate's binary), built by a nested cargo into this build's
/// target directory and profile: for this host, or with `aarch64` for [`cross::TARGET`]
/// (`xnnblob prepack` runs that one under qemu for the aarch64 classes).
#[allow(dead_code)]
pub fn xnnblob_command(aarch64: bool) -> PathBuf {
    let host_bin = Path::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
        .parent()
        .unwrap();
    let target_dir = host_bin.parent().unwrap();
    let mut args = vec!["build", "-p", "xnnblob-cli", "--bin", "xnnblob"];
    if host_bin.file_name().is_some_and(|n| n == "release") {
        args.push("--release");
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if aarch64 {
        return cross::cargo_for_target(&workspace, &args, &[("CARGO_TARGET_DIR", target_dir)])
            .artifacts
            .into_iter()
            .filter(|a| a.name == "xnnblob")
            .find_map(|a| a.executable)
            .unwrap_or_else(|| panic!("cargo names xnnblob built for {}", cross::TARGET));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(&cargo)
        .current_dir(&workspace)
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

pub mod programs;
