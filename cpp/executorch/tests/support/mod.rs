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

/// The largest difference relative to the expected output's range.
#[allow(dead_code)]
pub fn relative_difference(got: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(got.len(), expected.len());
    let (lo, hi) = expected
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    let range = (hi - lo).max(f32::MIN_POSITIVE);
    // A NaN anywhere is the largest difference (f32::max would drop it).
    got.iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs() / range)
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0.0, f32::max)
}
