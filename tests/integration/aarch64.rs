//! This suite for aarch64, the CPU ExecuTorch apps ship on: built for
//! `aarch64-unknown-linux-gnu` with the cross toolchain the set-up installs, and run under
//! `qemu-aarch64` on three CPU models whose features make XNNPACK pick different kernel
//! classes. Each run prints the quantized kernels it ran on and must name its class.
//!
//! Only the areas whose results depend on the CPU run there (the kernels and their packed
//! layouts, the cache file, whole programs against ExecuTorch's stored outputs); the rest is
//! architecture-neutral Rust and runs on the host only. Child processes a test starts run under
//! the same `qemu-aarch64` ([`common::TEST_RUNNER_VAR`]), so no binfmt is needed.
//!
//! Cache files are also carried across CPU classes: one packed here (x86-64) is rejected and
//! rebuilt under each aarch64 model, one rebuilt on `max` is rejected on `cortex-a53`, and one
//! rebuilt on `cortex-a53` is rejected here.

use crate::common;
use crate::packed_cache::{FOREIGN_CACHE_VAR, cold, model};

use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob::cache::{LoadOutcome, PackedWeightsCache};

use common::cross::{self, TARGET};

/// (qemu CPU model, what every quantized kernel's name run on it contains.)
const CPUS: [(&str, &str); 3] = [
    ("cortex-a53", "neon_mlal"),
    ("neoverse-n1", "neondot"),
    ("max", "neoni8mm"),
];

/// The areas run under each emulated CPU (module paths of this binary).
const AREAS: [&str; 20] = [
    "xnnpack_ops::",
    "xnnpack_mlp::",
    "operators::",
    "packed_cache::",
    "packed_cache_ops::",
    "weights_cache_provider::",
    "deferred_constants::",
    "truncated_cache::",
    "delegate::",
    "delegate_fixtures::",
    "program_fixtures::",
    "runtime_c::",
    "exported_programs::",
    "fp16_graphs::",
    "stateful::",
    // Methods sharing mutable buffers, exported by ExecuTorch (issue 43).
    "shared_state::",
    // What a packed weight is found by, and lying files: packed sizes differ by kernel class.
    "identity::",
    "lying_cache_files::",
    // XNNPACK's patched packers give the original bytes with aarch64's byte order and compiler
    // (patches 0008 and 0011; kr 4 is the dot-product kernels' path).
    "packers::",
    // xnnblob's GEMM kernels against the ones they replace (patches 0026, 0027; each run where
    // the CPU has its instructions).
    "aarch64_kernels::",
];

/// Builds this test binary for aarch64 (a nested cargo, as `scripts/install.sh` is in the C
/// face's tests) and returns its path.
fn build_for_aarch64() -> PathBuf {
    cross::cargo_for_target(
        common::repo_root(),
        &["test", "-p", "xnnblob", "--test", "integration", "--no-run"],
        &[],
    )
    .artifacts
    .into_iter()
    .filter(|a| a.name == "integration")
    .find_map(|a| a.executable)
    .unwrap_or_else(|| panic!("cargo names the suite built for {TARGET}"))
}

/// `qemu-aarch64` as a command line for `cpu`.
fn runner(cpu: &str) -> String {
    cross::qemu(cpu).join(" ")
}

/// Runs `exe` under `cpu` with libtest `args`; returns its output, asserting it passed.
fn run_on(exe: &Path, cpu: &str, args: &[&str], env: &[(&str, &Path)]) -> String {
    let runner = runner(cpu);
    let mut words = runner.split_whitespace();
    let mut command = Command::new(words.next().expect("a program"));
    command
        .args(words)
        .arg(exe)
        .args(args)
        .args(["--nocapture", "--test-threads=2"])
        .env(common::EMULATED_CPU_VAR, cpu)
        .env(common::TEST_RUNNER_VAR, &runner);
    for (name, value) in env {
        command.env(name, value);
    }
    // The suite takes under a minute per CPU here: fifteen is a hang, and it is failed as one.
    let out = common::bounded::output(
        &mut command,
        std::time::Duration::from_secs(900),
        &format!(
            "the suite under qemu-aarch64 -cpu {cpu} (install qemu-user with ./scripts/install-system-deps.sh)"
        ),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("test result: ok."),
        "{args:?} failed on an emulated {cpu}:\n{text}"
    );
    text
}

/// The quantized GEMM kernels a run's output names.
fn kernels(text: &str) -> Vec<&str> {
    let mut names: Vec<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("xnn_qd8_f32_q") || w.starts_with("xnnblob_qd8_f32_q"))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

fn rejected(path: &Path) -> String {
    let cache = PackedWeightsCache::open(path).unwrap();
    assert!(
        matches!(cache.load_outcome(), LoadOutcome::Rejected(_)),
        "{:?}",
        cache.load_outcome()
    );
    cache.load_note().expect("a rejected file is said")
}

#[test]
fn the_suite_passes_on_three_emulated_aarch64_cpus_and_cache_files_never_cross() {
    // From an x86-64 host only. Under emulation this is the suite's own run on aarch64, whose
    // areas are the ones above: nothing is skipped.
    if common::under_emulation() {
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        common::cannot_run("the aarch64 runs are cross-built from an x86-64 host");
        return;
    }
    let exe = build_for_aarch64();
    let dir = common::scratch("aarch64");
    let x86 = dir.join("x86.xbc");
    cold(&x86, &model());
    let foreign_test = [
        "--exact",
        "packed_cache::a_file_from_another_cpu_class_is_rejected_and_rebuilt",
        "--ignored",
    ];
    for (cpu, class) in CPUS {
        let text = run_on(&exe, cpu, &AREAS, &[]);
        let names = kernels(&text);
        eprintln!("{cpu}: ran on {names:?}");
        assert!(!names.is_empty(), "no quantized kernel was named on {cpu}");
        for name in &names {
            assert!(
                name.contains(class),
                "{name} on {cpu}: not a {class} kernel"
            );
        }
        // A file packed on x86-64: rejected, rebuilt for this CPU.
        let file = dir.join(format!("{cpu}.xbc"));
        std::fs::copy(&x86, &file).unwrap();
        let text = run_on(&exe, cpu, &foreign_test, &[(FOREIGN_CACHE_VAR, &file)]);
        assert!(text.contains("REJECTED"), "{text}");
        eprintln!(
            "{cpu}, x86-64's file: {}",
            text.lines().find(|l| l.contains("REJECTED")).unwrap_or("")
        );
    }
    // Between aarch64 kernel classes: max's file on a cortex-a53.
    let text = run_on(
        &exe,
        "cortex-a53",
        &foreign_test,
        &[(FOREIGN_CACHE_VAR, &dir.join("max.xbc"))],
    );
    assert!(text.contains("packed for CPU features"), "{text}");
    // And back: an aarch64 file on this x86-64 machine.
    let note = rejected(&dir.join("cortex-a53.xbc"));
    assert!(note.contains("another XNNPACK build"), "{note}");
}
