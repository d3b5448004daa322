//! Finds ExecuTorch 1.5.1's C++ runtime, or installs it.
//!
//! Where it comes from, in order:
//! 1. `XNNBLOB_EXECUTORCH_DIR`: a package root with `include/` and `lib/` (an unpacked wheel's
//!    `executorch/` directory, or the install prefix of an ExecuTorch the user built).
//! 2. The per-user cache (`XNNBLOB_EXECUTORCH_CACHE`, else `$XDG_CACHE_HOME/xnnblob`, else
//!    `~/.cache/xnnblob`), directory `executorch-1.5.1/` (x86-64) or `executorch-1.5.1-<arch>/`
//!    (other targets), filled once by:
//! 3. `pip install --no-deps --require-hashes --target` of the `executorch==1.5.1` wheel (pinned by
//!    sha256 in `requirements.txt`), run by a throw-away venv of `python3` (`XNNBLOB_PYTHON`
//!    overrides it), under a lock so concurrent builds install once. When cargo builds for another
//!    target than the host, pip is asked for that target's wheel (`--platform`): aarch64 Linux
//!    has one.
//!
//! The wheel carries no Python dependency that the C++ runtime needs: torch is never installed.
//! Whatever the source, the runtime's libraries must be built for the target: `check` reads their
//! ELF header.

use std::env;
use std::fs::{self, File};
use std::io::Read;
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

    let target = Target::from_env().unwrap_or_else(|why| fail(&why));
    let root = match env::var_os("XNNBLOB_EXECUTORCH_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cached_or_installed(&target).unwrap_or_else(|why| fail(&why)),
    };
    if let Err(why) = check(&root, &target) {
        fail(&why);
    }
    let include = root.join("include");
    let lib = root.join("lib");
    // The version the build is against: the drop-in refuses a runtime of another at run time,
    // and the installs (scripts/install.sh, the wheel) record it.
    println!("cargo:version={VERSION}");
    println!("cargo:rustc-env=XNNBLOB_EXECUTORCH_VERSION={VERSION}");
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

/// What cargo builds for, as far as choosing and checking ExecuTorch's runtime goes.
struct Target {
    triple: String,
    /// `CARGO_CFG_TARGET_ARCH`.
    arch: String,
    /// The wheel's platform tag to ask pip for, when it is not the host's own (cross builds).
    wheel_platform: Option<&'static str>,
}

impl Target {
    fn from_env() -> Result<Target, String> {
        let var = |name: &str| env::var(name).map_err(|_| format!("cargo did not set {name}"));
        let triple = var("TARGET")?;
        let arch = var("CARGO_CFG_TARGET_ARCH")?;
        let os = var("CARGO_CFG_TARGET_OS")?;
        let target_env = var("CARGO_CFG_TARGET_ENV")?;
        let wheel_platform = if triple == var("HOST")? {
            None
        } else {
            // The platforms ExecuTorch publishes wheels for (with a hash in requirements.txt).
            match (arch.as_str(), os.as_str(), target_env.as_str()) {
                ("aarch64", "linux", "gnu") => Some("manylinux_2_28_aarch64"),
                ("x86_64", "linux", "gnu") => Some("manylinux_2_28_x86_64"),
                _ => None,
            }
        };
        Ok(Target {
            triple,
            arch,
            wheel_platform,
        })
    }

    /// The cache directory's name. x86-64's predates the other targets and is kept, so that
    /// existing caches stay valid.
    fn cache_dir_name(&self) -> String {
        match self.arch.as_str() {
            "x86_64" => format!("executorch-{VERSION}"),
            arch => format!("executorch-{VERSION}-{arch}"),
        }
    }

    /// The ELF `e_machine` of the target's shared libraries, where it is known.
    fn elf_machine(&self) -> Option<u16> {
        match self.arch.as_str() {
            "x86" => Some(3),
            "arm" => Some(40),
            "x86_64" => Some(62),
            "aarch64" => Some(183),
            "riscv64" => Some(243),
            _ => None,
        }
    }
}

/// The ELF `e_machine` of a file, read from its header (in the byte order the header states).
fn elf_machine_of(path: &Path) -> Result<u16, String> {
    let mut header = [0u8; 20];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if header[..4] != *b"\x7fELF" {
        return Err(format!("{} is not an ELF file", path.display()));
    }
    let bytes = [header[18], header[19]];
    Ok(match header[5] {
        2 => u16::from_be_bytes(bytes),
        _ => u16::from_le_bytes(bytes),
    })
}

/// The files everything built on this crate needs, built for the target.
fn check(root: &Path, target: &Target) -> Result<(), String> {
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
    // A runtime for another CPU would only fail at link time, with a message about file formats.
    if let Some(want) = target.elf_machine() {
        let lib = root.join("lib/libexecutorch.so");
        let have = elf_machine_of(&lib)?;
        if have != want {
            return Err(format!(
                "{} is built for ELF machine {have}, not for {} (machine {want}): \
                 XNNBLOB_EXECUTORCH_DIR must name ExecuTorch {VERSION} built for the target",
                lib.display(),
                target.triple
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
fn cached_or_installed(target: &Target) -> Result<PathBuf, String> {
    let cache = cache_root();
    let name = target.cache_dir_name();
    let done = cache.join(&name);
    let root = done.join("executorch");
    if check(&root, target).is_ok() {
        return Ok(root);
    }
    if target.triple != env::var("HOST").unwrap_or_default() && target.wheel_platform.is_none() {
        return Err(format!(
            "ExecuTorch {VERSION} publishes no wheel for {}: set XNNBLOB_EXECUTORCH_DIR to a \
             package root (include/, lib/) of ExecuTorch {VERSION} built for it",
            target.triple
        ));
    }
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let lock_path = cache.join(format!("{name}.lock"));
    let _lock = File::create(&lock_path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    // Another build may have installed it while this one waited for the lock.
    if check(&root, target).is_ok() {
        return Ok(root);
    }
    let work = cache.join(format!("{name}.partial"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    install(&work, target)?;
    let _ = fs::remove_dir_all(&done);
    fs::rename(work.join("site"), &done)
        .map_err(|e| format!("cannot move the install into {}: {e}", done.display()))?;
    let _ = fs::remove_dir_all(&work);
    check(&root, target)?;
    Ok(root)
}

/// pip-installs the pinned wheel into `work/site` with a venv made in `work/venv`.
fn install(work: &Path, target: &Target) -> Result<(), String> {
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
    let mut pip = Command::new(venv.join("bin/python"));
    pip.args(["-m", "pip", "install", "--quiet", "--no-input"])
        .args([
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
        ])
        .arg("--target")
        .arg(work.join("site"))
        .arg("-r")
        .arg(&requirements);
    if let Some(platform) = target.wheel_platform {
        // Another platform's wheel can only be taken as it is, never built from source; the
        // CPython tag stays the venv's, as for the host's wheel.
        pip.args(["--platform", platform, "--only-binary=:all:"]);
    }
    run(&mut pip, "pip install of the executorch wheel")
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
