//! `xnnblob prepack`: one read-only cache file per CPU class, holding exactly the packing a cold
//! launch on a CPU of the class writes, which a first launch with `--cache-layer` then uses
//! whole: it packs nothing and gives the cold launch's outputs. A bundle for another class is
//! ignored with one note, and the writable cache takes over.

use crate::common;

use common::cache_files::assert_same_packing;
use common::scratch;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    common::repo_root().join("tests/data/executorch")
}

/// Fully delegated fixtures (so `xnnblob run` can make the cold launch's file to compare with),
/// one of each packing: fp32 convolutions and depthwise convolutions with external data, qd8
/// activations with qc8w (external data), qc4w and qb4w weights.
const PROGRAMS: [(&str, Option<&str>, &str); 4] = [
    (
        "cnn_xnn_external.pte",
        Some("cnn_xnn_external.ptd"),
        "cnn.input.f32",
    ),
    (
        "mlp_qd8_qc8w_external.pte",
        Some("mlp_qd8_qc8w_external.ptd"),
        "mlp_qd8.input.f32",
    ),
    ("mlp_qc4w_inline.pte", None, "mlp_q4.input.f32"),
    ("mlp_qb4w_inline.pte", None, "mlp_q4.input.f32"),
];

/// `xnnblob ARGS` (under `runner`, a qemu command line, when given) beside the fixtures.
fn xnnblob(runner: &[&str], args: &[String]) -> (bool, String) {
    let mut command = match runner.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(crate::xnnblob().get_program());
            c
        }
        None => crate::xnnblob(),
    };
    let out = command.args(args).current_dir(fixtures()).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `run PROGRAM [--data D] INPUT --cache CACHE [--cache-layer LAYER] --output-dir OUT`.
fn run_args(
    program: &(&str, Option<&str>, &str),
    cache: &Path,
    layer: Option<&Path>,
    out: &Path,
) -> Vec<String> {
    let (pte, ptd, input) = program;
    let mut args = strings(&["run", pte]);
    if let Some(ptd) = ptd {
        args.extend(strings(&["--data", ptd]));
    }
    args.push(input.to_string());
    args.extend(["--cache".into(), cache.display().to_string()]);
    if let Some(layer) = layer {
        args.extend(["--cache-layer".into(), layer.display().to_string()]);
    }
    args.extend(["--output-dir".into(), out.display().to_string()]);
    args
}

fn prepack_args(program: &(&str, Option<&str>, &str), cpu: &str, out: &Path) -> Vec<String> {
    let (pte, ptd, _) = program;
    let mut args = strings(&["prepack", pte, "--cpu", cpu]);
    if let Some(ptd) = ptd {
        args.extend(strings(&["--data", ptd]));
    }
    args.extend(["--out".into(), out.display().to_string()]);
    args
}

fn stem<'a>(program: &(&'a str, Option<&str>, &str)) -> &'a str {
    program.0.trim_end_matches(".pte")
}

/// For each program, on the CPU `runner` gives (this one when empty): the class's prepacked
/// file holds what a cold launch there writes, and a first launch with it as a layer packs
/// nothing and gives the cold launch's outputs, bit for bit.
fn check_class(runner: &[&str], class: &str, dir: &Path) {
    let bundle = dir.join("bundle");
    for program in &PROGRAMS {
        let (ok, text) = xnnblob(&[], &prepack_args(program, class, &bundle));
        assert!(ok, "prepack {}: {text}", program.0);
        let packed = bundle.join(format!("{}.{class}.xbc", stem(program)));
        assert!(packed.is_file(), "{text}");

        let cold = dir.join(format!("{}.cold.xbc", stem(program)));
        let cold_out = dir.join(format!("{}.cold", stem(program)));
        let (ok, text) = xnnblob(runner, &run_args(program, &cold, None, &cold_out));
        assert!(ok && !text.contains("(0 weights packed"), "{text}");
        assert_same_packing(&packed, &cold);

        let writable = dir.join(format!("{}.writable.xbc", stem(program)));
        let first_out = dir.join(format!("{}.first", stem(program)));
        let (ok, text) = xnnblob(
            runner,
            &run_args(program, &writable, Some(&bundle), &first_out),
        );
        assert!(ok, "{text}");
        assert!(text.contains("(0 weights packed"), "{}: {text}", program.0);
        assert!(!text.contains("ignored"), "{text}");
        assert_eq!(
            std::fs::read(cold_out.join("output0.f32")).unwrap(),
            std::fs::read(first_out.join("output0.f32")).unwrap(),
            "{}",
            program.0
        );
    }
}

#[test]
fn the_hosts_class_file_is_a_cold_launchs_packing_and_makes_the_first_launch_warm() {
    let dir = scratch("prepack-host");
    check_class(&[], "host", &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The AVX2 class, packed on an emulated AVX2 CPU (`qemu-x86_64 -cpu Haswell-v4`, no AVX-512)
/// unless this host is one, used there, and ignored with one note on an emulated CPU of
/// another class (a Nehalem: no AVX at all), whatever this host's class is.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_class_is_packed_and_used_on_an_emulated_avx2_cpu_and_ignored_on_another_class() {
    let dir = scratch("prepack-avx2");
    let qemu = ["qemu-x86_64", "-cpu", "Haswell-v4"];
    check_class(&qemu, "x86-64-avx2", &dir);

    let program = &PROGRAMS[1];
    let writable = dir.join("nehalem.xbc");
    let (ok, text) = xnnblob(
        &["qemu-x86_64", "-cpu", "Nehalem"],
        &run_args(
            program,
            &writable,
            Some(&dir.join("bundle")),
            &dir.join("nehalem"),
        ),
    );
    assert!(ok, "{text}");
    assert_eq!(text.matches("is for this CPU's class").count(), 1, "{text}");
    assert!(!text.contains("(0 weights packed"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn list_classes_names_each_class_with_its_kernels_and_this_cpus() {
    let (ok, text) = xnnblob(&[], &strings(&["prepack", "--list-classes"]));
    assert!(ok, "{text}");
    for (class, family) in [
        ("x86-64-avx2", "avx2"),
        ("x86-64-avx512vnni", "avx512vnni"),
        ("x86-64-amx", "avx512amx"),
        ("aarch64-neon-mlal", "neon_mlal"),
        ("aarch64-neondot", "neondot"),
        ("aarch64-i8mm", "neoni8mm"),
    ] {
        let at = text
            .find(&format!("{class}\n"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(text[at..].contains(&format!("*{family}*")), "{text}");
    }
    assert!(text.contains("this CPU: xnn_qd8_f32_qc8w_gemm"), "{text}");
}

#[test]
fn a_class_that_cannot_be_packed_here_or_does_not_exist_is_a_clear_error() {
    let dir = scratch("prepack-errors");
    let program = &PROGRAMS[2];
    let (ok, text) = xnnblob(&[], &prepack_args(program, "x86-64-sse9", &dir));
    assert!(
        !ok && text.contains("no CPU class \"x86-64-sse9\""),
        "{text}"
    );
    assert!(text.contains("x86-64-avx2, x86-64-avx512vnni"), "{text}");

    // AMX: no emulator has it; only a host of the class packs it.
    let here = xnnblob(&[], &strings(&["prepack", "--list-classes"])).1;
    if !here.contains("avx512amx_") {
        let (ok, text) = xnnblob(&[], &prepack_args(program, "x86-64-amx", &dir));
        assert!(
            !ok && text.contains("can only be packed on a CPU of the class"),
            "{text}"
        );
    }
    // aarch64 without the aarch64 build of this command.
    let args = prepack_args(program, "aarch64-neondot", &dir);
    let (ok, text) = crate::xnnblob()
        .args(&args)
        .current_dir(fixtures())
        .env_remove("XNNBLOB_AARCH64_XNNBLOB")
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert!(!ok && text.contains("--aarch64-xnnblob"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every argument is checked before anything is written: a class that does not exist after
/// `host` leaves no host file (nor the output directory) behind.
#[test]
fn a_bad_class_after_host_writes_nothing() {
    let dir = scratch("prepack-bad-class-after-host");
    let out = dir.join("bundles");
    let program = &PROGRAMS[2];
    let mut args = prepack_args(program, "host", &out);
    args.extend(strings(&["--cpu", "bogus"]));
    let (ok, text) = xnnblob(&[], &args);
    assert!(!ok && text.contains("no CPU class \"bogus\""), "{text}");
    assert!(!out.exists(), "{} was written", out.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output name that is already a file of the user's, not a cache, is left alone with an error,
/// as the writable cache leaves such a file; a cache of an earlier run is replaced.
#[test]
fn a_users_file_at_the_output_name_is_left_alone() {
    let dir = scratch("prepack-users-file");
    let program = &PROGRAMS[2];
    let file = dir.join(format!("{}.host.xbc", stem(program)));
    std::fs::write(&file, b"my notes, not a cache").unwrap();
    let (ok, text) = xnnblob(&[], &prepack_args(program, "host", &dir));
    assert!(
        !ok && text.contains("is not a packed-weight cache"),
        "{text}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"my notes, not a cache");

    std::fs::remove_file(&file).unwrap();
    let (ok, text) = xnnblob(&[], &prepack_args(program, "host", &dir));
    assert!(ok, "{text}");
    let first = dir.join("first.xbc");
    std::fs::copy(&file, &first).unwrap();
    let (ok, text) = xnnblob(&[], &prepack_args(program, "host", &dir));
    assert!(ok, "{text}");
    // A cache of an earlier run is replaced by the same packing.
    assert_same_packing(&first, &file);
    std::fs::remove_dir_all(&dir).unwrap();
}
