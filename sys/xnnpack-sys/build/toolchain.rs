//! The C and C++ toolchain XNNPACK is configured with, taken from cargo's `TARGET` through the
//! `cc` crate, so that XNNPACK, `src/pool.c` and `src/kernel_info.c` come from one compiler and a
//! cross build needs no hand-written CMake toolchain file. Android is the exception: its compilers
//! and sysroot are the NDK's business, so there a CMake toolchain file (the NDK's
//! `build/cmake/android.toolchain.cmake`) must be named.
//!
//! Every function returns its failure as a value; the build script decides how to report it.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Where the user names a CMake toolchain file, most specific first (the names the `cmake` crate
/// reads too, so a project that already sets one for it needs nothing new).
fn toolchain_file_vars(target: &str) -> [String; 3] {
    [
        format!("CMAKE_TOOLCHAIN_FILE_{target}"),
        format!("CMAKE_TOOLCHAIN_FILE_{}", target.replace('-', "_")),
        "CMAKE_TOOLCHAIN_FILE".to_string(),
    ]
}

/// Environment variables that change what `cmake_args` or `identity` say, beyond those the `cc`
/// crate reports itself (CC, CXX, AR, CFLAGS and their per-target forms).
pub fn env_vars(target: &str) -> Vec<String> {
    let mut vars = toolchain_file_vars(target).to_vec();
    vars.push("ANDROID_PLATFORM".to_string());
    vars.extend(CMAKE_FLAG_VARS.iter().map(|v| v.to_string()));
    vars
}

/// The flags CMake's configure takes from the environment into every compile of XNNPACK (a
/// sanitizer build sets them: scripts/test.sh sanitize), so they are part of its identity.
const CMAKE_FLAG_VARS: [&str; 3] = ["CFLAGS", "CXXFLAGS", "ASMFLAGS"];

/// Why the toolchain cannot build XNNPACK.
pub enum Problem {
    /// A compiler is missing or does not run: installing it is the remedy.
    Compiler(String),
    /// Something only the user can say is missing (Android's NDK toolchain file).
    Setup(String),
}

pub struct Toolchain {
    target: String,
    host: String,
    /// `CARGO_CFG_TARGET_OS` and `CARGO_CFG_TARGET_ARCH`: cargo's own reading of the target.
    os: String,
    arch: String,
    c: cc::Tool,
    cxx: cc::Tool,
    ar: PathBuf,
    ranlib: PathBuf,
    /// A CMake toolchain file the user named: it then chooses the system and the compilers.
    file: Option<PathBuf>,
}

impl Toolchain {
    pub fn from_env() -> Result<Toolchain, String> {
        let var = |name: &str| env::var(name).map_err(|_| format!("cargo did not set {name}"));
        let target = var("TARGET")?;
        let host = var("HOST")?;
        let os = var("CARGO_CFG_TARGET_OS")?;
        let arch = var("CARGO_CFG_TARGET_ARCH")?;
        let file = toolchain_file_vars(&target)
            .iter()
            .find_map(|v| {
                env::var_os(v)
                    .filter(|f| !f.is_empty())
                    .map(|f| (v.clone(), f))
            })
            .map(|(v, f)| {
                let path = PathBuf::from(f);
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!("{v}={} is not a file", path.display()))
                }
            })
            .transpose()?;
        let compiler = |cpp: bool| {
            cc::Build::new().cpp(cpp).try_get_compiler().map_err(|e| {
                format!(
                    "the cc crate finds no C{} compiler for {target}: {e}",
                    if cpp { "++" } else { "" }
                )
            })
        };
        let c = compiler(false)?;
        let cxx = compiler(true)?;
        let ar = cc::Build::new()
            .try_get_archiver()
            .map_err(|e| format!("the cc crate finds no archiver for {target}: {e}"))?;
        let ranlib = cc::Build::new()
            .try_get_ranlib()
            .map_err(|e| format!("the cc crate finds no ranlib for {target}: {e}"))?;
        Ok(Toolchain {
            target,
            host,
            os,
            arch,
            c,
            cxx,
            ar: PathBuf::from(ar.get_program()),
            ranlib: PathBuf::from(ranlib.get_program()),
            file,
        })
    }

    pub fn is_cross(&self) -> bool {
        self.target != self.host
    }

    /// What configures XNNPACK's CMake for the target.
    pub fn cmake_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        let define = |args: &mut Vec<OsString>, name: &str, value: &std::ffi::OsStr| {
            let mut a = OsString::from(format!("-D{name}="));
            a.push(value);
            args.push(a);
        };
        if let Some(file) = &self.file {
            define(&mut args, "CMAKE_TOOLCHAIN_FILE", file.as_os_str());
            if self.os == "android" {
                if let Some(abi) = android_abi(&self.arch) {
                    define(&mut args, "ANDROID_ABI", abi.as_ref());
                }
                if let Some(platform) = env::var_os("ANDROID_PLATFORM").filter(|p| !p.is_empty()) {
                    define(&mut args, "ANDROID_PLATFORM", &platform);
                }
            }
            return args;
        }
        // Named even for a native build: CMake would otherwise pick `cc` on its own, and the
        // cache key must describe the compiler that actually built the libraries.
        define(&mut args, "CMAKE_C_COMPILER", self.c.path().as_os_str());
        define(&mut args, "CMAKE_CXX_COMPILER", self.cxx.path().as_os_str());
        // XNNPACK's aarch64 microkernels include assembly; CMake's ASM language would otherwise
        // look for a compiler of its own.
        define(&mut args, "CMAKE_ASM_COMPILER", self.c.path().as_os_str());
        // CMake wants these as paths; a bare name would be looked up beside the C compiler only.
        define(&mut args, "CMAKE_AR", resolve(&self.ar).as_os_str());
        define(&mut args, "CMAKE_RANLIB", resolve(&self.ranlib).as_os_str());
        // One clang serves every target: it needs to be told which, as the cc crate tells it.
        if self.c.is_like_clang()
            && let Some(t) = clang_target(&self.c)
        {
            for lang in ["C", "CXX", "ASM"] {
                define(
                    &mut args,
                    &format!("CMAKE_{lang}_COMPILER_TARGET"),
                    t.as_ref(),
                );
            }
        }
        if self.is_cross() {
            // Setting CMAKE_SYSTEM_NAME is what tells CMake it is cross-compiling: no try_run,
            // and no host processor taken for the target's.
            define(
                &mut args,
                "CMAKE_SYSTEM_NAME",
                cmake_system_name(&self.os).as_ref(),
            );
            define(
                &mut args,
                "CMAKE_SYSTEM_PROCESSOR",
                cmake_processor(&self.arch).as_ref(),
            );
        }
        args
    }

    /// Everything about the toolchain that decides what the build produces, for the cache key:
    /// the target, each tool's path with symlinks resolved, and what the compilers say of their
    /// version and the machine they generate code for. Two compilers that differ in any of those
    /// never share a cached build.
    /// Fails where XNNPACK cannot be configured with what is known: Android without the NDK's
    /// toolchain file.
    pub fn identity(&self) -> Result<String, Problem> {
        if self.os == "android" && self.file.is_none() {
            return Err(Problem::Setup(format!(
                "building XNNPACK for {} needs the Android NDK's CMake toolchain file: set \
                 CMAKE_TOOLCHAIN_FILE=<ndk>/build/cmake/android.toolchain.cmake (and \
                 ANDROID_PLATFORM=android-<api level> for another API level than the NDK's \
                 lowest)",
                self.target
            )));
        }
        let mut id = format!("target {}\nhost {}\n", self.target, self.host);
        if let Some(file) = &self.file {
            let text = fs::read_to_string(file).map_err(|e| {
                Problem::Setup(format!(
                    "cannot read the CMake toolchain file {}: {e}",
                    file.display()
                ))
            })?;
            id.push_str(&format!("toolchain file {}\n{text}\n", file.display()));
            if let Some(p) = env::var_os("ANDROID_PLATFORM") {
                id.push_str(&format!("ANDROID_PLATFORM {}\n", p.to_string_lossy()));
            }
        }
        for (what, tool) in [("c", &self.c), ("c++", &self.cxx)] {
            match (probe(tool, &["--version"]), probe(tool, &["-dumpmachine"])) {
                (Ok(version), Ok(machine)) => id.push_str(&format!(
                    "{what} {}\n{}\nmachine {}\n",
                    canonical(tool.path()).display(),
                    version.trim(),
                    machine.trim()
                )),
                // The toolchain file chooses the compilers then; the cc crate's guess may not run.
                (Err(_), _) | (_, Err(_)) if self.file.is_some() => {}
                (Err(e), _) | (_, Err(e)) => {
                    return Err(Problem::Compiler(format!(
                        "the {what} compiler for {} does not run: {e}",
                        self.target
                    )));
                }
            }
        }
        for (what, tool) in [("ar", &self.ar), ("ranlib", &self.ranlib)] {
            id.push_str(&format!("{what} {}\n", canonical(&resolve(tool)).display()));
        }
        for var in CMAKE_FLAG_VARS {
            // Unset and empty configure alike, and leave the key of a plain build as it was.
            if let Some(flags) = env::var_os(var).filter(|f| !f.is_empty()) {
                id.push_str(&format!("{var} {}\n", flags.to_string_lossy()));
            }
        }
        Ok(id)
    }

    /// The runtime libraries of the sanitizers the C compiler's flags ask for (`-fsanitize=` in
    /// CFLAGS, as `scripts/test.sh sanitize` sets them; CMake reads the same variables).
    pub fn sanitizer_runtimes(&self) -> Vec<&'static str> {
        let mut runtimes = Vec::new();
        for arg in self.c.args() {
            let Some(list) = arg.to_str().and_then(|a| a.strip_prefix("-fsanitize=")) else {
                continue;
            };
            for sanitizer in list.split(',') {
                let runtime = match sanitizer {
                    "address" => "asan",
                    "undefined" => "ubsan",
                    _ => continue,
                };
                if !runtimes.contains(&runtime) {
                    runtimes.push(runtime);
                }
            }
        }
        runtimes
    }

    /// clang arguments that make bindgen read the headers as the target's compiler does: its
    /// target triple and its system include directories (for Debian's cross gcc,
    /// /usr/aarch64-linux-gnu/include), instead of the host's. Empty for a native build, where
    /// libclang's own defaults are the target's.
    pub fn bindgen_args(&self) -> Vec<String> {
        if !self.is_cross() {
            return Vec::new();
        }
        let Ok(machine) = probe(&self.c, &["-dumpmachine"]) else {
            // No runnable compiler (a toolchain file's build): bindgen derives the target from
            // TARGET itself, and BINDGEN_EXTRA_CLANG_ARGS can name the sysroot.
            return Vec::new();
        };
        let mut args = vec![format!("--target={}", machine.trim())];
        let dirs = system_include_dirs(&self.c);
        if !dirs.is_empty() {
            // libclang's resource headers (stddef.h, ...) stay; the host's /usr/include/<triple>
            // and friends go.
            args.push("-nostdlibinc".to_string());
            for d in dirs {
                args.push(format!("-isystem{}", d.display()));
            }
        }
        args
    }
}

/// The `--target=` the cc crate gives a clang-like compiler, if it gives one.
fn clang_target(tool: &cc::Tool) -> Option<String> {
    tool.args()
        .iter()
        .filter_map(|a| a.to_str())
        .find_map(|a| a.strip_prefix("--target="))
        .map(str::to_string)
}

fn cmake_system_name(os: &str) -> String {
    match os {
        "linux" => "Linux",
        "android" => "Android",
        "macos" => "Darwin",
        "ios" => "iOS",
        "windows" => "Windows",
        "freebsd" => "FreeBSD",
        "none" => "Generic",
        other => other,
    }
    .to_string()
}

/// The spelling of the processor that XNNPACK's and cpuinfo's CMake files recognise.
fn cmake_processor(arch: &str) -> String {
    match arch {
        "x86" => "i686",
        "arm" => "armv7-a",
        "powerpc64" => "ppc64le",
        other => other,
    }
    .to_string()
}

fn android_abi(arch: &str) -> Option<&'static str> {
    match arch {
        "aarch64" => Some("arm64-v8a"),
        "arm" => Some("armeabi-v7a"),
        "x86_64" => Some("x86_64"),
        "x86" => Some("x86"),
        _ => None,
    }
}

/// Runs the compiler (with the arguments the cc crate gives it: a clang's `--target` among
/// them) with `extra`, and returns what it printed on stdout.
fn probe(tool: &cc::Tool, extra: &[&str]) -> Result<String, String> {
    let out = tool
        .to_command()
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tool.path().display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}): {}",
            tool.path().display(),
            extra.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The compiler's `#include <...>` search list, less its own private headers (a gcc's
/// stddef.h or arm_neon.h are written for gcc, not for the libclang bindgen runs).
fn system_include_dirs(tool: &cc::Tool) -> Vec<PathBuf> {
    let Ok(out) = tool
        .to_command()
        .args(["-E", "-Wp,-v", "-x", "c", "-", "-o"])
        .arg(null_device())
        .stdin(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let private: Vec<PathBuf> = ["include", "include-fixed"]
        .iter()
        .filter_map(|n| probe(tool, &[&format!("-print-file-name={n}")]).ok())
        .map(|p| canonical(Path::new(p.trim())))
        .collect();
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .skip_while(|l| !l.starts_with("#include <...>"))
        .skip(1)
        .take_while(|l| !l.starts_with("End of search list"))
        .map(|l| canonical(Path::new(l.trim())))
        .filter(|d| d.is_dir() && !private.contains(d))
        .collect()
}

fn null_device() -> &'static str {
    if cfg!(windows) { "NUL" } else { "/dev/null" }
}

/// `name` looked up on PATH when it has no directory part.
fn resolve(name: &Path) -> PathBuf {
    if name.components().count() > 1 {
        return name.to_path_buf();
    }
    env::var_os("PATH")
        .iter()
        .flat_map(env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.to_path_buf())
}

/// The file behind `path` (Debian's /usr/bin/cc is a chain of symlinks to the real gcc).
fn canonical(path: &Path) -> PathBuf {
    let found = resolve(path);
    fs::canonicalize(&found).unwrap_or(found)
}
