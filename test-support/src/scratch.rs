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

/// A tmpfs mounted at a directory (root only), unmounted when dropped: a disk that fills up
/// (`size=1m`) or that is read-only (`ro`).
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs with `options` at `dir` (created); None where mounting is not allowed (not
    /// root, or no CAP_SYS_ADMIN), said by [`cannot_run`](crate::cannot_run).
    pub fn mount(dir: &Path, options: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            crate::cannot_run("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)");
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl std::ops::Deref for Tmpfs {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A command that runs `program` without the power to ignore file permissions: as it is for
/// a user other than root, and through `setpriv` without CAP_DAC_OVERRIDE and
/// CAP_DAC_READ_SEARCH for root, so a directory of mode 0555 refuses it new files (EACCES).
/// None, said on stderr, for root without `setpriv`.
pub fn without_permission_override(program: &Path) -> Option<std::process::Command> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some(std::process::Command::new(program));
    }
    let has_setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_setpriv {
        crate::cannot_run("root without setpriv cannot drop its permission override");
        return None;
    }
    let mut c = std::process::Command::new("setpriv");
    c.args([
        "--bounding-set",
        "-dac_override,-dac_read_search",
        "--inh-caps=-all",
    ])
    .arg(program);
    Some(c)
}
