//! Builds the C++ half of xnnblob's ExecuTorch backend (the cxx bridge and `src/backend.cc`)
//! against ExecuTorch's headers, and the runner `xnnblob-et-run` (`src/runner.cc`) for the binary
//! only. ExecuTorch's location comes from executorch-sys (`DEP_EXECUTORCH_*`).

use std::env;
use std::path::PathBuf;

fn main() {
    let include = PathBuf::from(env::var_os("DEP_EXECUTORCH_INCLUDE").expect("executorch-sys"));
    let lib = PathBuf::from(env::var_os("DEP_EXECUTORCH_LIB").expect("executorch-sys"));
    let c10 = include.join("executorch/runtime/core/portable_type/c10");
    let defines = env::var("DEP_EXECUTORCH_DEFINES").expect("executorch-sys");
    // xnnblob's pool table (xnnblob_pool.h), declared once by xnnpack-sys.
    let pool_include = PathBuf::from(env::var_os("DEP_XNNPACK_POOL_INCLUDE").expect("xnnpack-sys"));
    let configure = |build: &mut cc::Build| {
        build
            .cpp(true)
            .std("c++17")
            .include(&include)
            .include(&c10)
            .include(&pool_include)
            .warnings(false)
            .flag_if_supported("-Wno-deprecated-declarations")
            .flag_if_supported("-fvisibility=hidden");
        for define in defines.split_whitespace() {
            build.define(define, None);
        }
    };

    let mut backend = cxx_build::bridge("src/lib.rs");
    configure(&mut backend);
    backend
        .file("src/backend.cc")
        .file("src/et_pool.cc")
        .compile("xnnblob-executorch-cxx");

    // The runner: compiled to objects linked into the binary only, so the libraries never carry
    // a main() and the runner never carries a backend (it dlopens the one it is asked for).
    let mut runner = cc::Build::new();
    configure(&mut runner);
    runner.file("src/runner.cc");
    for object in runner.compile_intermediates() {
        println!(
            "cargo:rustc-link-arg-bin=xnnblob-et-run={}",
            object.display()
        );
    }

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=executorch");
    // XNNPACK runs on ExecuTorch's own thread pool (src/et_pool.cc), as ExecuTorch's backend
    // does; the runner resizes it or keeps it out (--pool-threads, --no-pool).
    if defines.split_whitespace().any(|d| d == "ET_USE_THREADPOOL") {
        println!("cargo:rustc-link-lib=dylib=executorch_threadpool");
        println!("cargo:rustc-link-arg-bin=xnnblob-et-run=-lexecutorch_threadpool");
    }
    // The kernels register themselves in static initialisers: keep the library although nothing
    // names a symbol of it.
    for arg in [
        "-Wl,--no-as-needed".to_string(),
        format!("-L{}", lib.display()),
        "-lexecutorch_kernels_optimized".to_string(),
        "-lexecutorch".to_string(),
        "-Wl,--as-needed".to_string(),
        "-ldl".to_string(),
        "-lstdc++".to_string(),
        // The runner's objects come last on rustc's link line, after Rust's compiler_builtins,
        // and rustc links with -nodefaultlibs: what those objects need from the compiler's
        // support library must be named after them. On aarch64 that is GCC's outline atomics
        // (`__aarch64_ldadd4_acq_rel` for libstdc++'s reference counts: GCC 10+ calls a helper
        // that picks LSE or LL/SC at run time). libgcc.a defines them; it is what gcc itself
        // links by default, so this keeps GCC's code generation rather than changing it with
        // -mno-outline-atomics (which would need applying to every C and C++ object alike, and
        // gives up LSE atomics). A static archive adds only what is still undefined: a no-op
        // where nothing is (x86-64).
        "-lgcc".to_string(),
    ] {
        println!("cargo:rustc-link-arg-bin=xnnblob-et-run={arg}");
    }
    // Found where it is installed, without LD_LIBRARY_PATH: by default the absolute directory
    // built against. A relocatable install sets XNNBLOB_EXECUTORCH_RPATH instead: the wheel
    // (scripts/build-wheels.sh) gives `$ORIGIN/../../executorch/lib`, ExecuTorch's wheel in the
    // same site-packages, seen from xnnblob/lib and xnnblob/bin.
    println!("cargo:rerun-if-env-changed=XNNBLOB_EXECUTORCH_RPATH");
    let rpath = env::var("XNNBLOB_EXECUTORCH_RPATH")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| lib.display().to_string());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{rpath}");
    // The functions a launch runs, together first in the library's text: the kernel maps code
    // 64 KiB around each page first touched, so scattered among the rest they made all of the
    // library's Rust code resident (see scripts/hot-text.sh, which writes the script). The script
    // only names what goes first (INSERT leaves the rest of the layout to the linker): LLD puts
    // it at the start of .text, GNU ld in a .text section of its own before it. gold and mold
    // read no such script, so a build that asks for either links without it, as does one with
    // XNNBLOB_HOT_TEXT=0: the same library, its code laid out as compiled.
    println!("cargo:rerun-if-env-changed=XNNBLOB_HOT_TEXT");
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let other_linker = ["gold", "mold"]
        .iter()
        .any(|l| flags.contains(&format!("-fuse-ld={l}")) || flags.contains(&format!("ld.{l}")));
    let script = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("hot-text.ld");
    let wanted = env::var("XNNBLOB_HOT_TEXT").as_deref() != Ok("0");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") && wanted && !other_linker {
        // -Wl splits its argument at commas.
        if script.to_string_lossy().contains(',') {
            println!(
                "cargo:warning=hot-text.ld is not used: its path has a comma ({})",
                script.display()
            );
        } else {
            println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
        }
        println!("cargo:rerun-if-changed=hot-text.ld");
    }
    for path in [
        "src/lib.rs",
        "src/bridge.h",
        "src/backend.cc",
        "src/et_pool.cc",
        "src/runner.cc",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
