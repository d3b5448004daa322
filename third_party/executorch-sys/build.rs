//! Finds ExecuTorch 1.5.1's C++ runtime, or installs it.
//!
//! Where it comes from, in order:
//! 1. `XNNBLOB_EXECUTORCH_DIR`: a package root with `include/` and `lib/` (an unpacked wheel's
//!    `executorch/` directory, or the install prefix of an ExecuTorch the user built).
//! 2. The per-user cache (`XNNBLOB_EXECUTORCH_CACHE`, else `$XDG_CACHE_HOME/xnnblob`, else
//!    `~/.cache/xnnblob`), directory `executorch-1.5.1/`, filled once by:
//! 3. `pip install --no-deps --require-hashes --target` of the `executorch==1.5.1` wheel (pinned by
//!    sha256 in `requirements.txt`), run by a throw-away venv of `python3` (`XNNBLOB_PYTHON`
//!    overrides it), under a lock so concurrent builds install once.
//!
//! The wheel carries no Python dependency that the C++ runtime needs: torch is never installed.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = "1.5.1";

fn main() {
    for var in [
        "XNNBLOB_EXECUTORCH_DIR",
        "XNNBLOB_EXECUTORCH_CACHE",
        "XNNBLOB_PYTHON",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=requirements.txt");
    println!("cargo:rerun-if-changed=build.rs");

    let root = match env::var_os("XNNBLOB_EXECUTORCH_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cached_or_installed().unwrap_or_else(|why| fail(&why)),
    };
    if let Err(why) = check(&root) {
        fail(&why);
    }
    let include = root.join("include");
    let lib = root.join("lib");
    println!("cargo:root={}", root.display());
    println!("cargo:include={}", include.display());
    println!("cargo:lib={}", lib.display());
    println!("cargo:rustc-env=XNNBLOB_EXECUTORCH_ROOT={}", root.display());
    println!(
        "cargo:rustc-env=XNNBLOB_EXECUTORCH_INCLUDE={}",
        include.display()
    );
    println!("cargo:rustc-env=XNNBLOB_EXECUTORCH_LIB={}", lib.display());
    // What the package's CMake config gives its consumers: the shipped libraries are compiled
    // with the event tracer on (its scope classes change shape without it), and a runtime that
    // ships its thread pool declares the parallel-for hooks extern.
    let mut defines = vec![
        "C10_USING_CUSTOM_GENERATED_MACROS",
        "ET_EVENT_TRACER_ENABLED",
    ];
    if lib.join("libexecutorch_threadpool.so").is_file() {
        defines.push("ET_USE_THREADPOOL");
    }
    println!("cargo:defines={}", defines.join(" "));
    println!(
        "cargo:rustc-env=XNNBLOB_EXECUTORCH_DEFINES={}",
        defines.join(" ")
    );
}

fn fail(why: &str) -> ! {
    eprintln!("executorch-sys: {why}");
    panic!("executorch-sys: {why}");
}

/// The files everything built on this crate needs.
fn check(root: &Path) -> Result<(), String> {
    for needed in [
        "include/executorch/runtime/backend/interface.h",
        "include/executorch/extension/module/module.h",
        "lib/libexecutorch.so",
        "lib/libexecutorch_kernels_optimized.so",
    ] {
        if !root.join(needed).is_file() {
            return Err(format!(
                "{} has no {needed}: XNNBLOB_EXECUTORCH_DIR must name a package root with \
                 ExecuTorch {VERSION}'s include/ and lib/",
                root.display()
            ));
        }
    }
    Ok(())
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("XNNBLOB_EXECUTORCH_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("xnnblob");
    }
    if let Some(home) = env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache/xnnblob");
    }
    PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("executorch-cache")
}

/// The cached package root, installing it first when it is not there.
fn cached_or_installed() -> Result<PathBuf, String> {
    let cache = cache_root();
    let done = cache.join(format!("executorch-{VERSION}"));
    let root = done.join("executorch");
    if check(&root).is_ok() {
        return Ok(root);
    }
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let lock_path = cache.join(format!("executorch-{VERSION}.lock"));
    let _lock = File::create(&lock_path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    // Another build may have installed it while this one waited for the lock.
    if check(&root).is_ok() {
        return Ok(root);
    }
    let work = cache.join(format!("executorch-{VERSION}.partial"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    install(&work)?;
    let _ = fs::remove_dir_all(&done);
    fs::rename(work.join("site"), &done)
        .map_err(|e| format!("cannot move the install into {}: {e}", done.display()))?;
    let _ = fs::remove_dir_all(&work);
    check(&root)?;
    Ok(root)
}

/// pip-installs the pinned wheel into `work/site` with a venv made in `work/venv`.
fn install(work: &Path) -> Result<(), String> {
    let python = env::var_os("XNNBLOB_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into());
    let venv = work.join("venv");
    eprintln!("executorch-sys: installing executorch=={VERSION} (its C++ runtime) into the cache");
    run(
        Command::new(&python).arg("-m").arg("venv").arg(&venv),
        "python3 -m venv (on Debian, install python3-venv: scripts/install-system-deps.sh does)",
    )?;
    let requirements = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("requirements.txt");
    run(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "--no-input"])
            .args([
                "--disable-pip-version-check",
                "--no-deps",
                "--require-hashes",
            ])
            .arg("--target")
            .arg(work.join("site"))
            .arg("-r")
            .arg(&requirements),
        "pip install of the executorch wheel",
    )
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", command.get_program()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
