//! The CPU identity of cache files, under emulated x86-64 CPUs (`qemu-x86_64 -cpu`): a file
//! packed on one CPU is rejected, with a reason that names what differs, on a CPU that differs
//! from it in one thing XNNPACK's choice of kernels reads; the CPU that packed a file uses it.
//! On the host itself, that the fingerprint's AMX bits say where the AMX kernel runs.
//!
//! qemu 7.2's TCG emulates SSSE3, SSE4.1, AVX, F16C, FMA3 and AVX2, each of which can be taken
//! out of `-cpu max`, and any vendor, family and model, so AMD's Zen generations as cpuinfo
//! decodes them. It emulates no AVX-512, GFNI, AVX-VNNI or AMX (it warns and leaves them out);
//! those are covered by the unit tests of `src/cache/cpu.rs`, from synthetic CPUID reports.
//!
//! On aarch64 (`qemu-aarch64`), SVE, SME and the older models' lack of FP16 arithmetic, dot
//! products, I8MM, BF16 and FHM are emulated; core types are not (user-mode qemu shows the
//! host's `/proc/cpuinfo`, which has no MIDRs).

use crate::common;
use crate::packed_cache::{assert_matches_reference, launch, model, reopen};

use std::path::{Path, PathBuf};
use xnnblob::cache::{FileError, LoadOutcome, cpu_fingerprint, describe_cpu_fingerprint, format};
use xnnblob::xnn::{Qd8Weights, qd8_gemm_kernel};

/// The cache file the emulated launch opens.
const CACHE_VAR: &str = "XNNBLOB_CPU_IDENTITY_CACHE";

/// On this host (no emulation): the blockwise 4-bit GEMM's widest kernel is xnnblob's AMX-INT8
/// one (patch 0035) exactly where the fingerprint says Linux granted this process the tiles
/// under XNNPACK's AMX condition and the CPU has AMX-TILE; anywhere else no AMX kernel is named.
/// Its one-row kernel is never the AMX one (a token keeps the AVX512-VNNI kernel).
#[test]
fn the_qb4w_gemm_takes_amx_tiles_exactly_where_the_cpu_and_linux_grant_them() {
    let described = describe_cpu_fingerprint(cpu_fingerprint());
    let features: Vec<&str> = described
        .split(['[', ']'])
        .nth(1)
        .unwrap_or_default()
        .split(' ')
        .collect();
    let tiles = features.contains(&"amx-granted") && features.contains(&"amx-tile");
    let Some(kernel) = qd8_gemm_kernel(Qd8Weights::Qb4w).unwrap() else {
        assert!(
            !tiles,
            "no qb4w kernel named on a CPU with AMX: {described}"
        );
        return;
    };
    let widest = kernel.split(" (one row: ").next().unwrap();
    if tiles {
        assert_eq!(
            widest, "xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_16x16c4__avx512amx",
            "{described}: {kernel}"
        );
        assert!(
            kernel
                .contains("(one row: xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_1x16c4__avx512vnni)"),
            "{kernel}"
        );
    } else {
        assert!(!kernel.contains("amx"), "{described}: {kernel}");
    }
}

/// Run by this module under an emulated CPU: opens the file at [`CACHE_VAR`] and says what it
/// found (absent, used, or rejected and why), launches [`model`] through it, and checks that the
/// file then serves this CPU with nothing to pack.
#[test]
#[ignore = "run by cpu_identity:: under an emulated CPU"]
fn launch_on_the_emulated_cpu() {
    let path = PathBuf::from(std::env::var_os(CACHE_VAR).expect("cpu_identity:: sets the file"));
    let fingerprint = cpu_fingerprint();
    // libtest prints the test's name on the line its output starts on.
    println!();
    println!(
        "FINGERPRINT {fingerprint:#x} {}",
        describe_cpu_fingerprint(fingerprint)
    );
    for weights in Qd8Weights::ALL {
        if let Some(kernel) = qd8_gemm_kernel(weights).unwrap() {
            println!("KERNEL {kernel}");
        }
    }
    let mlp = model();
    let cache = reopen(&path);
    match cache.load_outcome() {
        LoadOutcome::Fresh => println!("OUTCOME fresh"),
        LoadOutcome::Loaded { dropped: 0, .. } => println!("OUTCOME loaded"),
        LoadOutcome::Rejected(FileError::CpuMismatch { .. }) => {
            println!("OUTCOME rejected: {}", cache.load_note().unwrap())
        }
        other => panic!("the file was neither used nor rejected for its CPU: {other:?}"),
    }
    let out = launch(&cache, &mlp);
    assert_matches_reference(&mlp, &out);
    println!("PACKED {}", cache.stats().packed);
    drop(cache);
    let cache = reopen(&path);
    assert!(
        matches!(cache.load_outcome(), LoadOutcome::Loaded { dropped: 0, .. }),
        "{:?}",
        cache.load_outcome()
    );
    assert_eq!(launch(&cache, &mlp), out);
    assert_eq!(cache.stats().packed, 0, "the file serves this CPU");
}

/// What one emulated launch printed.
struct Emulated {
    fingerprint: u64,
    outcome: String,
    kernels: Vec<String>,
    packed: usize,
}

/// Runs [`launch_on_the_emulated_cpu`] under `qemu-x86_64 -cpu <cpu>` on the file at `path`.
fn launch_under(cpu: &str, path: &Path) -> Emulated {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new("qemu-x86_64")
        .args(["-cpu", cpu])
        .arg(&exe)
        .arg(common::test_path(
            module_path!(),
            "launch_on_the_emulated_cpu",
        ))
        .args(["--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(common::EMULATED_CPU_VAR, cpu)
        .env(CACHE_VAR, path)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run qemu-x86_64 ({e}): install qemu-user \
                 (./scripts/install-system-deps.sh)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "the launch failed on an emulated {cpu}:\n{text}"
    );
    let field = |tag: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag} line under {cpu}:\n{text}"))
            .to_string()
    };
    let cpu_line = field("FINGERPRINT ");
    let hex = cpu_line.split_whitespace().next().unwrap();
    let emulated = Emulated {
        fingerprint: u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap(),
        outcome: field("OUTCOME "),
        kernels: text
            .lines()
            .filter_map(|l| l.strip_prefix("KERNEL "))
            .map(str::to_string)
            .collect(),
        packed: field("PACKED ").parse().unwrap(),
    };
    eprintln!(
        "-cpu {cpu}: {cpu_line}\n  {}\n  kernels {:?}",
        emulated.outcome, emulated.kernels
    );
    emulated
}

/// Packs a file under `cpu` in `dir`, checks that the same CPU then uses it, and returns it
/// with what the packing launch printed.
fn packed_under(cpu: &str, dir: &Path, name: &str) -> (PathBuf, Emulated) {
    let path = dir.join(format!("{name}.xbc"));
    let packing = launch_under(cpu, &path);
    assert_eq!(packing.outcome, "fresh");
    assert_eq!(packing.packed, 3);
    let again = dir.join(format!("{name}-again.xbc"));
    std::fs::copy(&path, &again).unwrap();
    let reuse = launch_under(cpu, &again);
    assert_eq!(
        (reuse.outcome.as_str(), reuse.packed),
        ("loaded", 0),
        "the CPU that packed a file uses it"
    );
    assert_eq!(reuse.fingerprint, packing.fingerprint);
    (path, packing)
}

/// Launches under `cpu` on a copy of `file` and returns what the launch printed, asserting that
/// the copy was rejected for its CPU and every weight repacked.
fn rejected_under(cpu: &str, file: &Path, copy: &Path) -> Emulated {
    std::fs::copy(file, copy).unwrap();
    let launch = launch_under(cpu, copy);
    assert!(
        launch
            .outcome
            .starts_with(&format!("rejected: packed-weight cache {}", copy.display())),
        "under {cpu}: {}",
        launch.outcome
    );
    assert_eq!(launch.packed, 3, "under {cpu}: every weight repacked");
    launch
}

/// The packed bytes of a file, as the set of its entries' checksums.
fn packed_bytes(path: &Path, fingerprint: u64) -> Vec<u64> {
    let compat = format::Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: fingerprint,
    };
    let decoded = format::decode(&std::fs::read(path).unwrap(), &compat).unwrap();
    let mut sums: Vec<u64> = decoded.entries.iter().map(|e| e.checksum).collect();
    sums.sort_unstable();
    sums
}

#[test]
fn a_file_is_rejected_on_an_emulated_cpu_lacking_one_isa_feature_xnnpack_reads() {
    if common::under_emulation() {
        return;
    }
    // Each feature TCG emulates and XNNPACK reads, by qemu's name, and what the fingerprint
    // then lacks. Without AVX, qemu also stops offering YMM state (CPUID.0xD), and cpuinfo,
    // which XNNPACK asks, drops every feature that needs it.
    const FEATURES: [(&str, &str); 6] = [
        ("ssse3", "ssse3"),
        ("sse4.1", "sse4.1"),
        ("avx", "avx f16c fma3 avx2"),
        ("f16c", "f16c"),
        ("fma", "fma3"),
        ("avx2", "avx2"),
    ];
    let dir = common::scratch("cpu_identity_isa");
    let (file, max) = packed_under("max", &dir, "max");
    for (qemu, lacks) in FEATURES {
        let cpu = format!("max,-{qemu}");
        let without = rejected_under(&cpu, &file, &dir.join(format!("without-{qemu}.xbc")));
        // The reason names what the emulated CPU lacks, and nothing else.
        assert!(
            without
                .outcome
                .contains(&format!(": only the file's CPU has {lacks});")),
            "under {cpu}: {}",
            without.outcome
        );
        if qemu == "avx2" {
            // XNNPACK's own choice moves with it: its AVX2 qd8 kernels pack 8 columns to a
            // tile, the SSSE3, SSE4.1 and AVX ones that replace them 4.
            assert!(
                max.kernels.iter().all(|k| k.contains("x8c8__avx2")),
                "{:?}",
                max.kernels
            );
            assert!(
                without
                    .kernels
                    .iter()
                    .all(|k| k.contains("x4c8__") && !k.contains("avx2")),
                "{:?}",
                without.kernels
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_is_rejected_on_an_emulated_cpu_of_another_amd_microarchitecture() {
    if common::under_emulation() {
        return;
    }
    let amd =
        |family: u32, model: u32| format!("max,vendor=AuthenticAMD,family={family},model={model}");
    let dir = common::scratch("cpu_identity_uarch");

    // Zen (family 0x17, model 0x01) against Zen 2 (model 0x31): same features, but XNNPACK's f32
    // GEMM uses 16s4 kernels on Zen, and so packs this model's f32 weights in another layout.
    let (zen_file, zen) = packed_under(&amd(0x17, 0x01), &dir, "zen");
    let zen2_file = dir.join("zen2.xbc");
    let zen2 = rejected_under(&amd(0x17, 0x31), &zen_file, &zen2_file);
    assert!(
        zen2.outcome.contains(
            ": CPU model AMD family 0x17 model 0x1 (Zen: XNNPACK's f32 GEMM packs 16s4) in the \
             file, AMD family 0x17 model 0x31 here);"
        ),
        "{}",
        zen2.outcome
    );
    assert_ne!(
        packed_bytes(&zen_file, zen.fingerprint),
        packed_bytes(&zen2_file, zen2.fingerprint),
        "XNNPACK packs f32 weights differently on Zen and Zen 2"
    );

    // Zen 3 (family 0x19, model 0x21) against Zen 4 (model 0x61): the same features here (TCG
    // runs no AVX-512), another model: the file is rejected by its model.
    let (zen3_file, _) = packed_under(&amd(0x19, 0x21), &dir, "zen3");
    let zen4 = rejected_under(&amd(0x19, 0x61), &zen3_file, &dir.join("zen4.xbc"));
    assert!(
        zen4.outcome.contains(
            ": CPU model AMD family 0x19 model 0x21 in the file, AMD family 0x19 model 0x61 here);"
        ),
        "{}",
        zen4.outcome
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// This CPU's fingerprint under `qemu-aarch64 -cpu <cpu>`, from the library's own unit test
/// (`exe`, built for aarch64).
fn aarch64_fingerprint(exe: &Path, cpu: &str) -> u64 {
    let out = common::cross::under_qemu(cpu, exe)
        .args([
            "cache::cpu::tests::this_cpus_fingerprint_is_stable_and_tagged",
            "--exact",
            "--nocapture",
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run qemu-aarch64 ({e}): install qemu-user \
                 (./scripts/install-system-deps.sh)"
            )
        });
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "under {cpu}:\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.split_once("this CPU: ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no fingerprint under {cpu}:\n{text}"));
    eprintln!("-cpu {cpu}: {line}");
    let hex = line.split_whitespace().next().unwrap();
    u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn a_file_is_rejected_under_the_identity_of_an_emulated_aarch64_cpu_lacking_features() {
    if common::under_emulation() {
        return;
    }
    // The fingerprint is detected under each emulated CPU by the library built for aarch64
    // without XNNPACK (it needs none); the file is packed and opened here with the fingerprints
    // detected there, since what a load compares is the fingerprint alone. (`aarch64::` runs
    // whole files across aarch64 CPU classes, with an aarch64 XNNPACK.)
    let exe = common::cross::cargo_for_target(
        common::repo_root(),
        &[
            "test",
            "-p",
            "xnnblob",
            "--lib",
            "--no-default-features",
            "--no-run",
        ],
        &[],
    )
    .artifacts
    .into_iter()
    .find(|a| a.name == "xnnblob" && a.executable.is_some())
    .and_then(|a| a.executable)
    .expect("cargo names the library's tests built for aarch64");
    let max = aarch64_fingerprint(&exe, "max");
    // qemu 7.2 turns SVE (with SVE2 and SME) and SME off in `max`, and its older models lack
    // more: what each then lacks against `max`.
    let cases = [
        ("max,sme=off", "sme"),
        ("max,sve=off", "sve sve2 sme"),
        ("neoverse-n1", "i8mm bf16 sve sve2 sme fhm"),
        ("cortex-a53", "fp16-arith dot i8mm bf16 sve sve2 sme fhm"),
    ];
    let dir = common::scratch("cpu_identity_aarch64");
    let mlp = model();
    for (cpu, lacks) in cases {
        let this = aarch64_fingerprint(&exe, cpu);
        let path = dir.join(format!("{cpu}.xbc"));
        let options = |fingerprint| xnnblob::cache::CacheOptions {
            cpu_fingerprint: Some(fingerprint),
            ..Default::default()
        };
        let packing = xnnblob::cache::PackedWeightsCache::open_with(&path, options(max)).unwrap();
        launch(&packing, &mlp);
        drop(packing);
        let cache = xnnblob::cache::PackedWeightsCache::open_with(&path, options(this)).unwrap();
        assert!(
            matches!(
                cache.load_outcome(),
                LoadOutcome::Rejected(FileError::CpuMismatch { .. })
            ),
            "{cpu}: {:?}",
            cache.load_outcome()
        );
        let note = cache.load_note().unwrap();
        assert!(
            note.contains(&format!(": only the file's CPU has {lacks});")),
            "{cpu}: {note}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
