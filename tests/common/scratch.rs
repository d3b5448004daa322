//! Scratch directories for tests, shared by every test tree of the workspace (the ExecuTorch
//! tests include this file by path).

use std::path::Path;

/// A test's own directory under the system temp dir, removed when it drops, so a failing test
/// (a panic) cleans up too. It reads as the `Path` it is.
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
pub fn scratch(name: &str) -> Scratch {
    Scratch(
        tempfile::Builder::new()
            .prefix(&format!("xnnblob-{name}-"))
            .tempdir()
            .expect("a temp dir"),
    )
}
