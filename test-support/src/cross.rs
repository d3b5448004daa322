//! Building for aarch64 from an x86-64 host and running what was built under user-mode qemu:
//! shared by the core suite's aarch64 run (tests/integration/aarch64.rs) and the ExecuTorch
//! drop-in's (faces/executorch/tests/aarch64.rs, which includes this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target the cross toolchain (`./scripts/install-system-deps.sh`) builds for.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Where Debian's cross toolchain puts the target's loader and libraries.
pub const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// `qemu-aarch64` for `cpu` (a qemu CPU model, with `,feature=off` suffixes if any) as words:
/// the program, then its arguments; the binary to run comes next.
pub fn qemu(cpu: &str) -> Vec<String> {
    ["qemu-aarch64", "-cpu", cpu, "-L", SYSROOT]
        .map(str::to_string)
        .to_vec()
}

/// A [`Command`] running `exe` under [`qemu`] for `cpu`.
pub fn under_qemu(cpu: &str, exe: &Path) -> Command {
    let words = qemu(cpu);
    let mut command = Command::new(&words[0]);
    command.args(&words[1..]).arg(exe);
    command
}

/// What cargo built: one `compiler-artifact` message.
pub struct Artifact {
    /// The Cargo target's name (`integration`, `xnnblob-et-run`, `xnnblob_executorch`).
    pub name: String,
    /// The executable, for a binary or a test.
    pub executable: Option<PathBuf>,
    /// Every file written (for a library, one per crate type).
    pub filenames: Vec<PathBuf>,
}

/// What one cargo run built.
pub struct Built {
    /// Its `compiler-artifact` messages.
    pub artifacts: Vec<Artifact>,
    /// The variables build scripts set for rustc (`cargo:rustc-env`), such as executorch-sys's
    /// `XNNBLOB_EXECUTORCH_ROOT`: where the target's ExecuTorch is.
    pub rustc_env: Vec<(String, String)>,
}

impl Built {
    /// The value a build script set for `name`, if one did.
    pub fn rustc_env(&self, name: &str) -> Option<&str> {
        self.rustc_env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs `cargo ARGS --target TARGET --message-format=json` from `dir` with `env` set, asserting
/// it succeeds (saying what installs the toolchain if not), and returns what it built.
pub fn cargo_for_target(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Built {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(dir)
        .args(args)
        .args(["--target", TARGET, "--message-format=json"]);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        out.status.success(),
        "cargo {args:?} for {TARGET} failed (./scripts/install-system-deps.sh installs the cross \
         toolchain and the Rust target):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = |v: &serde_json::Value| v.as_str().map(PathBuf::from);
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let artifacts = messages
        .iter()
        .filter(|m| m["reason"] == "compiler-artifact")
        .map(|m| Artifact {
            name: m["target"]["name"].as_str().unwrap_or_default().to_string(),
            executable: path(&m["executable"]),
            filenames: m["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(path)
                .collect(),
        })
        .collect();
    let rustc_env = messages
        .iter()
        .filter(|m| m["reason"] == "build-script-executed")
        .flat_map(|m| m["env"].as_array().cloned().unwrap_or_default())
        .filter_map(|pair| {
            let name = pair[0].as_str()?.to_string();
            Some((name, pair[1].as_str()?.to_string()))
        })
        .collect();
    Built {
        artifacts,
        rustc_env,
    }
}
