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

#[path = "../../../../tests/common/scratch.rs"]
#[allow(dead_code)] // the bench shares this module and makes none
mod scratch;
#[allow(unused_imports)] // the bench shares this module and makes none
pub use scratch::{scratch, without_permission_override, Tmpfs};

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
#[allow(dead_code)]
#[path = "../../../../tests/common/close.rs"]
mod close;
#[allow(unused_imports)]
pub use close::relative_difference;

/// Building for aarch64 and running the result under qemu-aarch64 (tests/aarch64.rs).
#[allow(dead_code)]
#[path = "../../../../tests/common/cross.rs"]
pub mod cross;

pub mod programs;
