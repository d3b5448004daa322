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

/// A test's own directory under the system temp dir, removed when it drops (a panicking test
/// cleans up too). It reads as the `Path` it is.
pub struct Scratch(tempfile::TempDir);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh scratch directory whose name starts with `xnnblob-<name>-`.
#[allow(dead_code)] // the bench shares this module and makes none
pub fn scratch(name: &str) -> Scratch {
    Scratch(
        tempfile::Builder::new()
            .prefix(&format!("xnnblob-{name}-"))
            .tempdir()
            .expect("a temp dir"),
    )
}
