//! Provides XNNPACK's static libraries and generates its bindings.
//!
//! Where XNNPACK comes from, in order:
//! 1. `XNNPACK_INCLUDE_DIR` + `XNNPACK_LIB_DIR` (path lists): a build the user already has.
//! 2. A cached build under the per-user cache (`XNNBLOB_XNNPACK_CACHE`, else
//!    `$XDG_CACHE_HOME/xnnblob`, else `~/.cache/xnnblob`), keyed by the sources' hashes and the
//!    build recipe, so `cargo clean` or a second checkout does not rebuild.
//! 3. A fresh build from Debian's source packages: tarballs taken from `XNNBLOB_XNNPACK_SOURCES`
//!    (a directory) or fetched with the system's apt from trixie/sid, each checked against its
//!    sha256, given xnnblob's own kernels (`kernels/<arch>/*`, copied to `xnnblob/<arch>/`),
//!    patched with `patches/*.patch` (see `patches/README`; the patches register those kernels),
//!    then built with cmake + ninja.
//!
//! Own builds also install XNNPACK's internal headers, so that `src/kernel_info.c` can name the
//! microkernels XNNPACK's GEMM configs picked on this CPU (`xnnblob_qd8_gemm_kernel`).
//!
//! Cross builds (`--target` other than the host) configure CMake from the toolchain the `cc`
//! crate finds for `TARGET` (`build/toolchain.rs`); the cache key names that toolchain.

use sha2::{Digest, Sha256};
use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[path = "build/debian.rs"]
mod debian;
#[path = "build/series.rs"]
mod series;
#[path = "build/toolchain.rs"]
mod toolchain;
use debian::{KLEIDIAI, SOURCES, extract, fetch_sources, kleidiai_project};
use series::Series;
use toolchain::Toolchain;

/// The cmake option that turns KleidiAI on or off; every target but aarch64 keeps it off (the
/// option is only consulted there).
const KLEIDIAI_OFF: &str = "-DXNNPACK_ENABLE_KLEIDIAI=OFF";
const KLEIDIAI_ON: &str = "-DXNNPACK_ENABLE_KLEIDIAI=ON";

/// Whether this build's target runs KleidiAI's kernels: 64-bit Arm Linux with glibc, which
/// Debian's build of KleidiAI is for (its objects call glibc's `__fprintf_chk`); Android's
/// builds keep XNNPACK's own kernels.
fn with_kleidiai() -> bool {
    env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "aarch64")
        && env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|e| e == "gnu")
}

/// [`CMAKE_OPTIONS`] for this build's target: KleidiAI on for aarch64.
fn cmake_options() -> Vec<&'static str> {
    let kleidiai = with_kleidiai();
    CMAKE_OPTIONS
        .iter()
        .map(|&o| {
            if o == KLEIDIAI_OFF && kleidiai {
                KLEIDIAI_ON
            } else {
                o
            }
        })
        .collect()
}

/// The static libraries of our own build for this target, in link order.
fn own_libs() -> Vec<&'static str> {
    if with_kleidiai() {
        // XNNPACK's objects call KleidiAI's, so it follows them.
        vec!["XNNPACK", "microkernels-prod", "kleidiai", "cpuinfo"]
    } else {
        OWN_LIBS.to_vec()
    }
}

/// Bump when the cmake options or the install layout change: it is part of the cache key.
/// 2: patches applied; internal headers installed under include/internal.
/// 3: compilers, archiver and (cross builds) system and processor passed to CMake explicitly;
///    the toolchain's identity in the key; KleidiAI off.
/// 4: a section per function (see CMAKE_OPTIONS).
const RECIPE_VERSION: &str = "4";

/// The smallest `XNN_EXTRA_QUANTIZATION_PARAMS` that is safe for every qd8 GEMM kernel (see
/// patches/0001-*): a user-provided XNNPACK with less gets a warning.
const SAFE_EXTRA_QUANTIZATION_PARAMS: u32 = 15;

const CMAKE_OPTIONS: &[&str] = &[
    "-DXNNPACK_BUILD_TESTS=OFF",
    "-DXNNPACK_BUILD_BENCHMARKS=OFF",
    "-DXNNPACK_BUILD_ALL_MICROKERNELS=OFF",
    "-DXNNPACK_LIBRARY_TYPE=static",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
    // Replaced by KLEIDIAI_ON for aarch64 (`cmake_options`), where KleidiAI comes from Debian's
    // package (`KLEIDIAI`): XNNPACK's own CMake would download its sources at configure time,
    // which this build neither can nor should. Only arm64 consults it.
    KLEIDIAI_OFF,
    // A section per function, as rustc gives its own code: the linker then keeps only the
    // functions something calls, and the drop-in's hot-text.ld can gather the few a launch runs
    // (about 80 KiB of 800 in the objects that hold them) where the kernel maps code 64 KiB at a
    // time (issue 39). CMake adds the `_INIT` flags to the user's CFLAGS/CXXFLAGS, not in their
    // place.
    "-DCMAKE_C_FLAGS_INIT=-ffunction-sections",
    "-DCMAKE_CXX_FLAGS_INIT=-ffunction-sections",
];

/// Static libraries of our own build, in link order (dependents first). pthreadpool is not among
/// them: XNNPACK's calls to it are served by `src/pool.c`, linked between XNNPACK and cpuinfo.
const OWN_LIBS: [&str; 3] = ["XNNPACK", "microkernels-prod", "cpuinfo"];

/// The static library `src/pool.c` is compiled into.
const POOL_LIB: &str = "xnnblob_pool";

/// What to run when a tool the build needs is missing.
const INSTALL_HINT: &str = "run ./scripts/install-system-deps.sh from the repository's root (it installs with apt-get every \
     tool the build needs, and says which)";

/// What to run when the cross toolchain is missing.
const CROSS_INSTALL_HINT: &str = "for aarch64-unknown-linux-gnu, run ./scripts/install-system-deps.sh --target \
     aarch64-unknown-linux-gnu from the repository's root (Debian's cross gcc and g++); for other \
     targets, install their C and C++ cross compilers and name them with CC_<target> and \
     CXX_<target> if the cc crate does not find them";

const HELP: &str = "\
How to provide XNNPACK:
  * let this build fetch it: needs apt-get (Debian), network access to Debian's archive,
    and cmake + ninja-build + xz-utils installed (./scripts/install-system-deps.sh);
  * or put the six .orig.tar.xz tarballs listed in sys/xnnpack-sys/build.rs in a
    directory and set XNNBLOB_XNNPACK_SOURCES=that directory (no network needed);
  * or point at an XNNPACK you already built: XNNPACK_INCLUDE_DIR=<dirs with xnnpack.h and
    pthreadpool.h> XNNPACK_LIB_DIR=<dirs with libXNNPACK and libcpuinfo> (its pthreadpool is
    not linked: xnnblob serves XNNPACK's thread-pool calls itself).";

fn fail(what: &str) -> ! {
    eprintln!("\nerror: xnnpack-sys cannot provide XNNPACK: {what}\n\n{HELP}\n");
    std::process::exit(1);
}

/// For a missing build tool: the remedy is installing it, so the ways of providing XNNPACK
/// would only distract.
fn fail_missing_tool(what: &str) -> ! {
    eprintln!("\nerror: xnnpack-sys: {what}\n");
    std::process::exit(1);
}

fn main() {
    for var in [
        "XNNPACK_INCLUDE_DIR",
        "XNNPACK_LIB_DIR",
        "XNNBLOB_XNNPACK_CACHE",
        "XNNBLOB_XNNPACK_SOURCES",
        "XDG_CACHE_HOME",
        "HOME",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build");

    let toolchain = Toolchain::from_env().unwrap_or_else(|e| fail_missing_tool(&e));
    for var in toolchain::env_vars(&env::var("TARGET").unwrap_or_default()) {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let mut install = match (
        env::var_os("XNNPACK_INCLUDE_DIR"),
        env::var_os("XNNPACK_LIB_DIR"),
    ) {
        (Some(inc), Some(lib)) => Install::user_provided(&inc, &lib),
        (None, None) => Install::cached_or_built(&toolchain),
        _ => fail("XNNPACK_INCLUDE_DIR and XNNPACK_LIB_DIR must be set together"),
    };
    // Seen by dependents as DEP_XNNPACK_VERSION: what the installs (scripts/install.sh, the
    // wheel) record they were built with. A user-provided XNNPACK's version is not known here.
    let version = if env::var_os("XNNPACK_INCLUDE_DIR").is_some() {
        "unknown".to_string()
    } else {
        // Debian's source version, which names XNNPACK's commit (4ea82e5); patches/ apply on top.
        SOURCES[0].version.to_string()
    };
    println!("cargo:version={version}");
    // xnnblob's own header (the pool table, include/xnnblob_pool.h): for pool.c, the bindings
    // and dependents' C++ (DEP_XNNPACK_INCLUDE), whichever XNNPACK is linked.
    let own_include =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("include");
    println!("cargo:rerun-if-changed={}", own_include.display());
    // Seen by dependents as DEP_XNNPACK_POOL_INCLUDE: that header's directory alone.
    println!("cargo:pool_include={}", own_include.display());
    install.include_dirs.push(own_include);
    install.check_quantization_padding();
    // Before XNNPACK's libraries: the shim's references to them must precede them on the link line.
    install.build_kernel_info();
    install.build_pool();
    install.emit_link_directives();
    // XNNPACK and pool.c compiled with sanitizers call their runtimes: every program linking
    // them needs those (a build script that packs at build time included), and rustc's link
    // line has no -fsanitize of its own to add them.
    for runtime in toolchain.sanitizer_runtimes() {
        println!("cargo:rustc-link-lib=dylib={runtime}");
    }
    generate_bindings(&install.include_dirs, &toolchain.bindgen_args());
}

/// The patch series (`build/series.rs`), read once: the cache key hashes the bytes the build
/// applies.
fn series() -> &'static Series {
    static SERIES: std::sync::OnceLock<Series> = std::sync::OnceLock::new();
    SERIES.get_or_init(|| {
        let dir = PathBuf::from(
            env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        );
        for part in ["kernels", "patches"] {
            println!("cargo:rerun-if-changed={}", dir.join(part).display());
        }
        Series::read(&dir).unwrap_or_else(|e| fail(&e.to_string()))
    })
}

/// Where headers and libraries are, and which libraries to link.
struct Install {
    include_dirs: Vec<PathBuf>,
    lib_dirs: Vec<PathBuf>,
    /// (name, static?)
    libs: Vec<(String, bool)>,
}

impl Install {
    fn user_provided(inc: &std::ffi::OsStr, lib: &std::ffi::OsStr) -> Install {
        let include_dirs: Vec<PathBuf> = env::split_paths(inc).collect();
        let lib_dirs: Vec<PathBuf> = env::split_paths(lib).collect();
        if !include_dirs.iter().any(|d| d.join("xnnpack.h").is_file()) {
            fail(&format!(
                "no xnnpack.h in XNNPACK_INCLUDE_DIR={}",
                inc.to_string_lossy()
            ));
        }
        let mut libs = Vec::new();
        for name in own_libs() {
            let found = lib_dirs.iter().find_map(|d| {
                if d.join(format!("lib{name}.a")).is_file() {
                    Some(true)
                } else if d.join(format!("lib{name}.so")).is_file() {
                    Some(false)
                } else {
                    None
                }
            });
            match (found, name) {
                (Some(is_static), _) => libs.push((name.to_string(), is_static)),
                // Older and shared XNNPACK builds fold the microkernels into libXNNPACK; one built
                // without KleidiAI needs none.
                (None, "microkernels-prod" | "kleidiai") => {}
                (None, _) => fail(&format!(
                    "no lib{name}.a or lib{name}.so in XNNPACK_LIB_DIR={}",
                    lib.to_string_lossy()
                )),
            }
        }
        Install {
            include_dirs,
            lib_dirs,
            libs,
        }
    }

    fn cached_or_built(toolchain: &Toolchain) -> Install {
        let root = cache_root();
        let identity = toolchain
            .identity()
            .unwrap_or_else(|problem| match problem {
                toolchain::Problem::Compiler(e) => fail_missing_tool(&format!(
                    "{e}\n{}",
                    if toolchain.is_cross() {
                        CROSS_INSTALL_HINT
                    } else {
                        INSTALL_HINT
                    }
                )),
                toolchain::Problem::Setup(e) => fail_missing_tool(&e),
            });
        let key = cache_key(&identity);
        let dir = root.join(format!("xnnpack-{key}"));
        let stamp = dir.join("BUILD_OK");
        if !stamp.is_file() {
            fs::create_dir_all(&root).unwrap_or_else(|e| {
                fail(&format!("cannot create cache dir {}: {e}", root.display()))
            });
            // Two builds (e.g. debug and release) may start at once: one builds, the other waits.
            let lock = File::create(root.join(format!("xnnpack-{key}.lock")))
                .and_then(|f| f.lock().map(|()| f))
                .unwrap_or_else(|e| fail(&format!("cannot lock {}: {e}", root.display())));
            if !stamp.is_file() {
                build_into(&root, &key, &dir, toolchain);
            }
            drop(lock);
        }
        // For tests/xnnpack_own_tests.rs: where the verified tarballs are, and what they are.
        println!(
            "cargo:rustc-env=XNNBLOB_XNNPACK_DOWNLOADS={}",
            root.join("downloads").display()
        );
        let pinned: Vec<String> = SOURCES
            .iter()
            .map(|s| format!("{}={}={}", s.package, s.tarball, s.sha256))
            .collect();
        println!(
            "cargo:rustc-env=XNNBLOB_XNNPACK_PINNED={}",
            pinned.join(",")
        );
        Install {
            include_dirs: vec![dir.join("include")],
            lib_dirs: vec![dir.join("lib")],
            libs: own_libs().iter().map(|n| (n.to_string(), true)).collect(),
        }
    }

    /// Warns when a user-provided XNNPACK pads quantization parameters too little for its own
    /// 14- and 16-row qd8 kernels (our builds carry patches/0001-* for that).
    fn check_quantization_padding(&self) {
        let Some(header) = self
            .include_dirs
            .iter()
            .map(|d| d.join("xnnpack.h"))
            .find(|h| h.is_file())
        else {
            return;
        };
        let text = fs::read_to_string(&header).unwrap_or_default();
        let value = text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("#define XNN_EXTRA_QUANTIZATION_PARAMS")
                .and_then(|v| v.trim().parse::<u32>().ok())
        });
        if let Some(v) = value.filter(|v| *v < SAFE_EXTRA_QUANTIZATION_PARAMS) {
            println!(
                "cargo:warning={} pads {v} quantization parameters; qd8 x qb4w fully connected \
                 layers give wrong results on AVX512-VNNI+GFNI CPUs for batches of 2, 3 and \
                 14k+1 to 14k+3 rows unless it is at least {SAFE_EXTRA_QUANTIZATION_PARAMS} \
                 (sys/xnnpack-sys/patches/0001-*)",
                header.display()
            );
        }
    }

    /// Compiles src/kernel_info.c when XNNPACK's internal headers are at hand (our own builds),
    /// with a table of every qd8 GEMM microkernel the linked libraries define, taken from their
    /// symbols so that it matches the build whatever the architecture.
    fn build_kernel_info(&self) {
        println!("cargo:rustc-check-cfg=cfg(xnnpack_kernel_info)");
        let Some(internal) = self
            .include_dirs
            .iter()
            .map(|d| d.join("internal"))
            .find(|d| d.join("xnnpack/config.h").is_file())
        else {
            return;
        };
        let mut names: Vec<String> = Vec::new();
        for (lib, is_static) in &self.libs {
            let Some(path) = self
                .lib_dirs
                .iter()
                .map(|d| d.join(format!("lib{lib}.a")))
                .find(|p| *is_static && p.is_file())
            else {
                continue;
            };
            let Ok(out) = Command::new("nm")
                .args(["--defined-only", "--format=posix"])
                .arg(&path)
                .output()
            else {
                continue;
            };
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let mut words = line.split_whitespace();
                if let (Some(name), Some("T")) = (words.next(), words.next()) {
                    // XNNPACK's kernels, and xnnblob's own (kernels/) that patches register.
                    let qd8 =
                        name.starts_with("xnn_qd8_f32_q") || name.starts_with("xnnblob_qd8_f32_q");
                    if qd8 && name.contains("_gemm_minmax_ukernel_") {
                        names.push(name.to_string());
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        let mut table = String::from(
            "// Generated by xnnpack-sys's build script from the libraries' symbols.\n\
             #include <stddef.h>\n\
             struct xnnblob_kernel_name { const void* function; const char* name; };\n",
        );
        for n in &names {
            table.push_str(&format!("extern void {n}(void);\n"));
        }
        table.push_str("const struct xnnblob_kernel_name xnnblob_kernel_names[] = {\n");
        for n in &names {
            table.push_str(&format!("  {{ (const void*) {n}, \"{n}\" }},\n"));
        }
        table.push_str("  { NULL, NULL }\n};\n");
        let table_path = out.join("kernel_table.c");
        fs::write(&table_path, table)
            .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", table_path.display())));
        let shim = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
            .join("src/kernel_info.c");
        println!("cargo:rerun-if-changed={}", shim.display());
        cc::Build::new()
            .file(&shim)
            .file(&table_path)
            .includes(&self.include_dirs)
            .include(&internal)
            .warnings(false)
            .compile("xnnblob_kernel_info");
        println!("cargo:rustc-cfg=xnnpack_kernel_info");
    }

    /// Compiles src/pool.c, pthreadpool's API over xnnblob's pools; linked by
    /// `emit_link_directives` after XNNPACK (which calls it) and before cpuinfo (which it calls).
    fn build_pool(&self) {
        let source = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
            .join("src/pool.c");
        println!("cargo:rerun-if-changed={}", source.display());
        cc::Build::new()
            .file(&source)
            .includes(&self.include_dirs)
            .warnings(false)
            // Hidden: linked into a program beside ExecuTorch's own pthreadpool library, these
            // definitions must not take the place of that library's (its pool would then be
            // run by this code); XNNPACK's calls bind to them when the program is linked.
            .flag("-fvisibility=hidden")
            .cargo_metadata(false)
            .compile(POOL_LIB);
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        println!("cargo:rustc-link-search=native={}", out.display());
    }

    fn emit_link_directives(&self) {
        for d in &self.lib_dirs {
            println!("cargo:rustc-link-search=native={}", d.display());
        }
        for (name, is_static) in &self.libs {
            if name == "cpuinfo" {
                println!("cargo:rustc-link-lib=static={POOL_LIB}");
            }
            let kind = if *is_static { "static" } else { "dylib" };
            println!("cargo:rustc-link-lib={kind}={name}");
        }
        // XNNPACK has C++ translation units (reference packing) and uses libm and pthreads.
        println!("cargo:rustc-link-lib=dylib=stdc++");
        println!("cargo:rustc-link-lib=dylib=m");
        println!("cargo:rustc-link-lib=dylib=pthread");
        let joined = env::join_paths(&self.include_dirs).expect("include dirs are joinable");
        // Seen by dependents as DEP_XNNPACK_INCLUDE (for their C++ code).
        println!("cargo:include={}", joined.to_string_lossy());
    }
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("XNNBLOB_XNNPACK_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("xnnblob");
    }
    if let Some(home) = env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache").join("xnnblob");
    }
    PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("xnnpack-cache")
}

/// A short hash of everything that determines the build's output: sources, patches, recipe, and
/// the toolchain (`Toolchain::identity`), so that a build for one target or by one compiler is
/// never taken for another's.
fn cache_key(toolchain_identity: &str) -> String {
    let mut h = Sha256::new();
    h.update(RECIPE_VERSION);
    for s in &SOURCES {
        h.update(s.sha256);
    }
    for (name, text) in &series().patches {
        h.update(name);
        h.update(text);
    }
    for (path, text) in &series().kernels {
        h.update(path.to_string_lossy().as_bytes());
        h.update(text);
    }
    for o in cmake_options() {
        h.update(o);
    }
    if with_kleidiai() {
        h.update(KLEIDIAI.sha256);
    }
    h.update(env::var("TARGET").unwrap_or_default());
    h.update(toolchain_identity);
    hex(&h.finalize())[..16].to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn run_logged(cmd: &mut Command, log: &Path, what: &str) {
    let out = File::create(log).unwrap_or_else(|e| fail(&format!("cannot write log: {e}")));
    let status = cmd
        .stdout(out.try_clone().expect("log handle"))
        .stderr(out)
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run {what}: {e} (is it installed?)")));
    if !status.success() {
        fail(&format!(
            "{what} failed ({status}); log: {}\n{}",
            log.display(),
            tail(log, 30)
        ));
    }
}

/// Fetches, builds and installs XNNPACK into `dir` (headers and static libraries), then stamps it.
fn build_into(root: &Path, key: &str, dir: &Path, toolchain: &Toolchain) {
    // The compilers were run already, for the cache key.
    require_tools(&[
        ("cmake", "--version"),
        ("ninja", "--version"),
        ("xz", "--version"),
        ("patch", "--version"),
    ]);
    let downloads = root.join("downloads");
    fetch_sources(root, &downloads);

    let work = root.join(format!("xnnpack-{key}.work"));
    let _ = fs::remove_dir_all(&work);
    let src = work.join("src");
    fs::create_dir_all(&src)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", src.display())));
    for s in &SOURCES {
        extract(&downloads.join(s.tarball), &src.join(s.package));
    }
    series()
        .apply(&src.join("xnnpack"))
        .unwrap_or_else(|e| fail(&e.to_string()));

    let build = work.join("build");
    let mut configure = Command::new("cmake");
    configure
        .arg("-G")
        .arg("Ninja")
        .arg("-S")
        .arg(src.join("xnnpack"))
        .arg("-B")
        .arg(&build)
        .args(cmake_options())
        .args(toolchain.cmake_args());
    if with_kleidiai() {
        let dir = kleidiai_project(root, &downloads, &src);
        configure.arg(format!("-DKLEIDIAI_SOURCE_DIR={}", dir.display()));
    }
    for (var, pkg) in [
        ("CPUINFO", "cpuinfo"),
        ("PTHREADPOOL", "pthreadpool"),
        ("FXDIV", "fxdiv"),
        ("FP16", "fp16"),
        ("PSIMD", "psimd"),
    ] {
        configure.arg(format!("-D{var}_SOURCE_DIR={}", src.join(pkg).display()));
    }
    let configure_log = work.join("configure.log");
    run_logged(&mut configure, &configure_log, "cmake configure of XNNPACK");
    refuse_kernel_scan_complaints(&configure_log);
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    run_logged(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--target", "XNNPACK", "-j", &jobs]),
        &work.join("build.log"),
        "cmake --build of XNNPACK (ninja)",
    );

    let staging = root.join(format!("xnnpack-{key}.staging"));
    let _ = fs::remove_dir_all(&staging);
    let (inc, lib) = (staging.join("include"), staging.join("lib"));
    for d in [&inc, &lib] {
        fs::create_dir_all(d)
            .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", d.display())));
    }
    for name in own_libs() {
        let file = format!("lib{name}.a");
        let found = if name == "kleidiai" {
            src.join("kleidiai-package").join(KLEIDIAI.library)
        } else {
            find_file(&build, &file)
                .unwrap_or_else(|| fail(&format!("the build produced no {file}")))
        };
        copy(&found, &lib.join(&file));
    }
    for header in [
        src.join("xnnpack/include/xnnpack.h"),
        src.join("pthreadpool/include/pthreadpool.h"),
    ] {
        copy(
            &header,
            &inc.join(header.file_name().expect("header has a name")),
        );
    }
    // XNNPACK's internal headers, for src/kernel_info.c only (never for bindings).
    let internal = inc.join("internal/xnnpack");
    fs::create_dir_all(&internal)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", internal.display())));
    let headers = src.join("xnnpack/src/xnnpack");
    for e in fs::read_dir(&headers)
        .unwrap_or_else(|e| fail(&format!("cannot list {}: {e}", headers.display())))
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "h") {
            copy(&e.path(), &internal.join(e.file_name()));
        }
    }
    fs::write(staging.join("BUILD_OK"), format!("key {key}\n"))
        .unwrap_or_else(|e| fail(&format!("cannot write stamp: {e}")));
    let _ = fs::remove_dir_all(dir);
    fs::rename(&staging, dir).unwrap_or_else(|e| fail(&format!("cannot publish build: {e}")));
    let _ = fs::remove_dir_all(&work);
}

/// Fails the build on what XNNPACK's configure step (tools/update-microkernels.py, which scans
/// every file under `src/` for kernels) says of a kernel it cannot place or finds twice: a patch
/// that puts a kernel where that scan sees it, or names another kernel in it, would otherwise
/// only warn. The snapshot's own three notes (its reference files have no kernel) are expected.
fn refuse_kernel_scan_complaints(log: &Path) {
    let text = fs::read_to_string(log).unwrap_or_default();
    let complaints: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("Duplicate microkernel")
                || l.starts_with("Unknown ISA")
                || l.starts_with("Unknown architecture")
                || (l.starts_with("No microkernel found in ")
                    && !l.starts_with("No microkernel found in src/reference/"))
        })
        .collect();
    if !complaints.is_empty() {
        fail(&format!(
            "XNNPACK's configure step complained of the patched tree's kernels (log: {}):\n{}",
            log.display(),
            complaints.join("\n")
        ));
    }
}

/// Stops with one message naming every missing tool, before a long build fails half-way.
fn require_tools(tools: &[(&str, &str)]) {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, probe)| {
            !Command::new(tool)
                .arg(probe)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(tool, _)| *tool)
        .collect();
    if !missing.is_empty() {
        fail_missing_tool(&format!(
            "building XNNPACK needs {}, which this machine lacks: {INSTALL_HINT}",
            missing.join(", ")
        ));
    }
}

fn copy(from: &Path, to: &Path) {
    if let Err(e) = fs::copy(from, to) {
        fail(&format!(
            "cannot copy {} to {}: {e}",
            from.display(),
            to.display()
        ));
    }
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name() == name {
                return Some(p);
            }
        }
    }
    None
}

fn generate_bindings(include_dirs: &[PathBuf], target_args: &[String]) {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = bindgen::Builder::default()
        .header_contents(
            "wrapper.h",
            "#include <xnnpack.h>\n#include <xnnblob_pool.h>\n",
        )
        .clang_args(target_args)
        .clang_args(include_dirs.iter().map(|d| format!("-I{}", d.display())))
        .allowlist_function("xnn_.*")
        // The thread pool XNNPACK runs on (xnnpack.h includes pthreadpool.h): the handle type
        // and the flags; src/pool.c implements the calls.
        .allowlist_type("pthreadpool_t")
        .allowlist_var("PTHREADPOOL_FLAG_.*")
        // The pool table pool.c calls through (include/xnnblob_pool.h).
        .allowlist_type("xnnblob_pool_.*")
        .allowlist_function("xnnblob_pool_.*")
        .allowlist_type("xnn_.*")
        .allowlist_var("XNN_.*")
        .prepend_enum_name(false)
        .derive_default(true);
    // bindgen panics when it cannot load libclang; that becomes one message, not a backtrace.
    let message = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = std::sync::Arc::clone(&message);
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        *seen.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }));
    // The builder is dropped with the panic; nothing of it is observed afterwards.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let _ = std::panic::take_hook();
    let bindings = match generated {
        Ok(Ok(bindings)) => bindings,
        Ok(Err(e)) => fail(&format!("bindgen could not read xnnpack.h: {e}")),
        Err(_) => {
            let why = message.lock().unwrap_or_else(|e| e.into_inner()).clone();
            fail_missing_tool(&format!(
                "bindgen cannot load libclang ({why}).\n\
                 The libclang bindgen loads comes from libclang-dev (libclang-cpp is not it): \
                 {INSTALL_HINT}, or set LIBCLANG_PATH to a directory holding libclang.so"
            ))
        }
    };
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| fail(&format!("cannot write bindings: {e}")));
}
