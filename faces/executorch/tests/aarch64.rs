//! The drop-in on aarch64, the CPU ExecuTorch apps ship on. From an x86-64 host, `xnnblob-et-run`
//! and `libxnnblob_executorch.so` are cross-built for `aarch64-unknown-linux-gnu` (a nested
//! cargo, into this build's target directory) and run under `qemu-aarch64` with ExecuTorch
//! 1.5.1's aarch64 runtime (its `manylinux_2_28_aarch64` wheel), on three CPU models whose
//! features make XNNPACK pick different kernel classes: `cortex-a53` (Armv8.0: no dot product,
//! no fp16 arithmetic), `neoverse-n1` (dot product, fp16) and `max` (i8mm, SVE, SME).
//!
//! On each, every XNNPACK fixture, every runtime-c program and every exported program runs with
//! both backends, xnnblob's and ExecuTorch's own aarch64 one, and is compared with ExecuTorch's
//! stored outputs (made on x86-64) within the x86-64 tests' tolerances. Then one cold and one
//! warm launch with a cache file: the warm one packs nothing and gives the cold one's outputs.
//!
//! Two differences from x86-64 are expected and asserted as they are:
//! - ExecuTorch's own backend is wrong on `max` for qd8 linear layers with qc8w and qc4w weights
//!   (off by 1.03 and 1.40 of the range) and for static int8 programs (convolutions: up to 0.61),
//!   and right on the same CPU without SME (`max,sme=off`, checked here for each deviation): its
//!   XNNPACK, built with KleidiAI, runs them on SME kernels (such as
//!   `qp8_f32_qc{8,4}w_gemm_minmax_ukernel_16x64c4__neonsme` and
//!   `pqs8_qc8w_igemm_minmax_fp32_ukernel_32x32c4__neonsme`). Those rest on SME's int8 outer
//!   product, SMOPA, which qemu 7.2 gets wrong: tests/sme_outer_products.c, run here when
//!   ExecuTorch's backend deviates, finds 48 of 64 SMOPA elements wrong (odd rows of the tile
//!   left zero) while FMOPA, behind its right fp32 SME kernels, is exact. So the deviation is
//!   qemu's; a deviation with a right SMOPA fails the test. xnnblob's XNNPACK has no SME kernels
//!   (no KleidiAI). Each deviation is printed; on a CPU without SME, ExecuTorch's backend must
//!   match.
//! - A program with fp16 fully connected layers, softmax, pooling or reductions needs fp16
//!   arithmetic, which `cortex-a53` lacks: there both backends compute fp16 values as fp32
//!   (ExecuTorch's XNNPACK the nodes without fp16 kernels, in its subgraph optimizer; xnnblob
//!   every fp16 graph, while defining the subgraph), with fp16 inputs and outputs all the
//!   same. The runner's `fp16_as_fp32_delegates` must say so there and only there, and a
//!   cold and a warm launch with a cache file run it too: the warm one packs nothing.

use xnnblob_test_support::close::relative_difference;
use xnnblob_test_support::cross;
use xnnblob_test_support::drop_in::programs::{
    Program, Run, Runner, data, exported_programs, f16s, fixture_programs, measure, mlp_args,
    runtime_c_programs, s, sharing_program_matches_eager, sharing_programs,
};
use xnnblob_test_support::drop_in::{self, f32s};
use xnnblob_test_support::scratch;

use std::path::Path;
use std::sync::OnceLock;

/// The drop-in's runner, where cargo built it for these tests (the backend library is built
/// beside it).
const ET_RUN: &str = env!("CARGO_BIN_EXE_xnnblob-et-run");

/// A qemu CPU model and what it has that changes the outcome.
#[derive(Clone, Copy)]
struct Cpu {
    model: &'static str,
    /// FEAT_FP16: XNNPACK's fp16 GEMMs need it.
    fp16_arithmetic: bool,
    /// FEAT_SME: where ExecuTorch's XNNPACK runs its KleidiAI SME kernels.
    sme: bool,
}

/// Whether a program's delegates have fp16 values (its name says fp16): without fp16
/// arithmetic xnnblob computes them as fp32, element-wise ones included (this XNNPACK has no
/// fp16 softmax, pooling, resize or reduction kernels there, so the rule covers whole graphs).
fn has_fp16_values(label: &str) -> bool {
    label.contains("fp16")
}

/// The program with fp16 fully connected layers, whose fp16 weights a cache file holds.
const FP16_WEIGHTS: &str = "c_mlp_fp16_xnn_inline";

/// How this qemu computes SME outer products on `cpu`: tests/sme_outer_products.c's line,
/// "fmopa WRONG/N smopa WRONG/N", and the number of wrong SMOPA (int8) elements.
fn sme_outer_products(cpu: &str) -> (String, u32) {
    let dir = scratch("sme-outer-products");
    let exe = dir.join("sme_outer_products");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sme_outer_products.c");
    let built = std::process::Command::new("aarch64-linux-gnu-gcc")
        .args(["-O1", "-march=armv8.6-a+sve", "-o"])
        .arg(&exe)
        .arg(&source)
        .output()
        .expect("aarch64-linux-gnu-gcc (./scripts/install-system-deps.sh installs it)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = cross::under_qemu(cpu, &exe).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let count = |op: &str| -> u32 {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == op)
            .expect("the line names it");
        words[at + 1].split('/').next().unwrap().parse().unwrap()
    };
    assert_eq!(
        count("fmopa"),
        0,
        "qemu's fp32 outer product on {cpu}: {line}"
    );
    let wrong = count("smopa");
    (line, wrong)
}

fn runner_on(cpu: &str) -> Runner {
    Runner::emulated(
        drop_in::aarch64_drop_in(ET_RUN).runner.clone(),
        cross::qemu(cpu),
    )
}

#[test]
fn every_program_matches_with_both_backends_on_an_emulated_cortex_a53() {
    drop_in_on(Cpu {
        model: "cortex-a53",
        fp16_arithmetic: false,
        sme: false,
    });
}

#[test]
fn every_program_matches_with_both_backends_on_an_emulated_neoverse_n1() {
    // Issue 43's exports whose methods share mutable buffers, on one aarch64 class: called in
    // sequence with the arenas shared, both backends give eager PyTorch's outputs.
    let runner = runner_on("neoverse-n1");
    for name in sharing_programs() {
        sharing_program_matches_eager(&runner, &data().join("export"), &name);
    }
    drop_in_on(Cpu {
        model: "neoverse-n1",
        fp16_arithmetic: true,
        sme: false,
    });
}

/// ExecuTorch's own backend deviates here on its SME kernels (module docs); xnnblob must match.
#[test]
fn every_program_matches_with_xnnblob_on_an_emulated_max_cpu() {
    drop_in_on(Cpu {
        model: "max",
        fp16_arithmetic: true,
        sme: true,
    });
}

fn drop_in_on(cpu: Cpu) {
    // From an x86-64 host only (on aarch64 the plain tests are the native run).
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the aarch64 runs are cross-built from an x86-64 host");
        return;
    }
    let started = std::time::Instant::now();
    let runner = runner_on(cpu.model);
    let programs: Vec<Program> = fixture_programs()
        .into_iter()
        .chain(runtime_c_programs())
        .chain(exported_programs())
        .collect();
    let mut deviations = Vec::new();
    let smopa = OnceLock::new();
    for p in &programs {
        let label = format!("aarch64-{}-{}", cpu.model, p.label);
        let launch = |runner: &Runner, backend: &str| {
            measure(runner, &label, backend, &p.args, &p.expected)
                .unwrap_or_else(|e| panic!("{} on {}: {backend} failed: {e}", p.label, cpu.model))
        };
        let theirs = launch(&runner, "executorch");
        let witness = if theirs.worst <= p.tolerance {
            format!("{:e}", theirs.worst)
        } else {
            // Not hidden: said here and in the summary, and shown to be the SME kernels.
            assert!(
                cpu.sme,
                "{} on {}: ExecuTorch's own backend {}: {} > {}",
                p.label, cpu.model, theirs.at, theirs.worst, p.tolerance
            );
            // Where qemu's own int8 outer product is right, this is ExecuTorch's fault.
            let (line, wrong) = smopa.get_or_init(|| sme_outer_products(cpu.model));
            assert!(
                *wrong > 0,
                "{} on {}: ExecuTorch's own backend {}: {} > {}, and this qemu's SME outer \
                 products are right ({line})",
                p.label,
                cpu.model,
                theirs.at,
                theirs.worst,
                p.tolerance
            );
            let without = format!("{},sme=off", cpu.model);
            let plain = launch(&runner_on(&without), "executorch");
            assert!(
                plain.worst <= p.tolerance,
                "{} on {without}: ExecuTorch's own backend {}: {} > {}",
                p.label,
                plain.at,
                plain.worst,
                p.tolerance
            );
            deviations.push(format!(
                "{}: {:e} at {} ({:e} on {without})",
                p.label, theirs.worst, theirs.at, plain.worst
            ));
            format!(
                "{:e} OUT OF TOLERANCE ({:e} on {without})",
                theirs.worst, plain.worst
            )
        };
        let m = launch(&runner, "xnnblob");
        assert!(
            m.worst <= p.tolerance,
            "{} on {}: xnnblob {}: {} > {}",
            p.label,
            cpu.model,
            m.at,
            m.worst,
            p.tolerance
        );
        // fp16 computed as fp32 where, and only where, XNNPACK has no fp16 GEMMs.
        let as_fp32 = m.run.number("fp16_as_fp32_delegates");
        let expected = !cpu.fp16_arithmetic && has_fp16_values(&p.label);
        assert_eq!(
            as_fp32 > 0.0,
            expected,
            "{} on {}: {as_fp32} delegates computed fp16 as fp32",
            p.label,
            cpu.model
        );
        let ours = if expected {
            let times = |r: &Run| {
                format!(
                    "{:.1} ms to ready, first execute {:.2} ms",
                    r.number("load_to_ready_ms"),
                    r.number("first_execute_ms")
                )
            };
            format!(
                "{:e} (fp16 computed as fp32; {}, ExecuTorch's {})",
                m.worst,
                times(&m.run),
                times(&theirs.run)
            )
        } else {
            format!("{:e}", m.worst)
        };
        eprintln!(
            "{} {}: xnnblob {ours}, ExecuTorch's backend {witness} of the range (tolerance {:e})",
            cpu.model, p.label, p.tolerance
        );
    }
    eprintln!(
        "{}: {} programs, both backends, in {:.1} s; ExecuTorch's own backend out of tolerance \
         on {}: {deviations:#?}",
        cpu.model,
        programs.len(),
        started.elapsed().as_secs_f64(),
        deviations.len()
    );
    if let Some((line, _)) = smopa.get() {
        eprintln!(
            "{}: qemu's SME outer products, wrong elements of all (tests/sme_outer_products.c): \
             {line}",
            cpu.model
        );
    }
    if !cpu.sme {
        assert!(deviations.is_empty());
    }
    let qd8 = WarmCheck {
        label: "mlp_qd8_qc8w_external",
        args: mlp_args(),
        output: s("output0.f32"),
        expected: f32s(&std::fs::read(data().join("mlp_qd8_qc8w_external.output_et.f32")).unwrap()),
        tolerance: 1e-3,
    };
    a_warm_launch_packs_nothing_and_gives_the_cold_outputs(&runner, cpu, &qd8);
    // fp16 weights: converted to fp32 on cortex-a53, and found in the file by an identity
    // derived from their fp16 source's, so the warm launch packs nothing there either.
    let fp16 = programs
        .iter()
        .find(|p| p.label == FP16_WEIGHTS)
        .expect("a runtime-c program");
    let fp16 = WarmCheck {
        label: FP16_WEIGHTS,
        args: fp16.args.clone(),
        output: s("output0.f16"),
        expected: f16s(&std::fs::read(&fp16.expected[0][0].0).unwrap()),
        tolerance: fp16.tolerance,
    };
    a_warm_launch_packs_nothing_and_gives_the_cold_outputs(&runner, cpu, &fp16);
}

/// A program launched cold then warm with a cache file: its runner arguments, the output file
/// compared, ExecuTorch's stored output and the tolerance relative to its range.
struct WarmCheck {
    label: &'static str,
    args: Vec<String>,
    output: String,
    expected: Vec<f32>,
    tolerance: f32,
}

fn a_warm_launch_packs_nothing_and_gives_the_cold_outputs(
    runner: &Runner,
    cpu: Cpu,
    check: &WarmCheck,
) {
    let dir = scratch(&format!("aarch64-warm-{}-{}", cpu.model, check.label));
    let cache = dir.join("weights.xbc");
    let key = cache.display().to_string();
    let decode = |bytes: &[u8]| {
        if check.output.ends_with(".f16") {
            f16s(bytes)
        } else {
            f32s(bytes)
        }
    };
    let launch = |tag: &str| {
        let out = dir.join(tag);
        std::fs::create_dir_all(&out).unwrap();
        let mut args = check.args.clone();
        args.extend([
            s("--cache"),
            key.clone(),
            s("--output-dir"),
            out.display().to_string(),
        ]);
        let run = runner
            .run(&args)
            .unwrap_or_else(|e| panic!("{tag} launch of {} on {}: {e}", check.label, cpu.model));
        let output = std::fs::read(out.join(&check.output)).unwrap();
        (run.cache(&key), run.number("load_to_ready_ms"), output)
    };
    let (cold, cold_load, cold_output) = launch("cold");
    assert!(
        cold["packed"] > 0,
        "{} on {}: the cold launch packs",
        check.label,
        cpu.model
    );
    let d = relative_difference(&decode(&cold_output), &check.expected);
    assert!(
        d <= check.tolerance,
        "{} on {}: cold {d} > {}",
        check.label,
        cpu.model,
        check.tolerance
    );
    let (warm, warm_load, warm_output) = launch("warm");
    assert_eq!(
        warm["packed"], 0,
        "{} on {}: the warm launch packs nothing",
        check.label, cpu.model
    );
    assert_eq!(
        warm["deferred_fills"], 0,
        "{} on {}: the warm launch reads no weight in",
        check.label, cpu.model
    );
    assert_eq!(
        warm_output, cold_output,
        "{} on {}: warm outputs are the cold ones",
        check.label, cpu.model
    );
    eprintln!(
        "{} {} cache file: cold packed {} entries ({cold_load:.1} ms to ready), warm packed 0 \
         ({} hits, {warm_load:.1} ms), outputs identical, {d:e} of the range from ExecuTorch's",
        cpu.model, check.label, cold["packed"], warm["hits"]
    );
}

/// Issue 40 on aarch64: `xnnblob prepack` makes one file per aarch64 class (each packed under
/// qemu-aarch64 on a CPU of the class, by the aarch64 build of the command). On each emulated
/// CPU, the file of its class holds the packing the drop-in's own cold launch writes there, and
/// with the whole bundle given as `packed_cache_layers` the first launch misses no weight, keeps
/// nothing new, and matches ExecuTorch's outputs. A Cortex-A72 (Armv8.0, another core than the
/// A53 the class was packed on) is served by the A53's file: under qemu-user no core type can be
/// read, by cpuinfo or by xnnblob, so XNNPACK makes the same choices on both.
#[test]
fn a_bundle_prepacked_for_each_aarch64_class_makes_the_first_launch_warm() {
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the aarch64 runs are cross-built from an x86-64 host");
        return;
    }
    let host = drop_in::xnnblob_command(ET_RUN, false);
    let aarch64 = drop_in::xnnblob_command(ET_RUN, true);
    let names = [
        "arch_llama_8da4w",
        "arch_mobilenet_v2_int8",
        "arch_mobilenet_v3_fp32",
    ];
    let programs: Vec<Program> = exported_programs()
        .into_iter()
        .filter(|p| names.contains(&p.label.as_str()))
        .collect();
    assert_eq!(programs.len(), names.len());
    let dir = scratch("aarch64-bundle");
    let bundle = dir.join("bundle");
    let classes = [
        ("aarch64-neon-mlal", "cortex-a53"),
        ("aarch64-neondot", "neoverse-n1"),
        ("aarch64-i8mm", "max,sme=off"),
    ];
    for p in &programs {
        let mut args = vec![s("prepack"), p.args[0].clone()];
        for w in p.args.windows(2).filter(|w| w[0] == "--data") {
            args.extend(w.iter().cloned());
        }
        for (class, _) in classes {
            args.extend(["--cpu".to_string(), class.to_string()]);
        }
        args.extend(["--out".to_string(), bundle.display().to_string()]);
        args.extend([
            "--aarch64-xnnblob".to_string(),
            aarch64.display().to_string(),
        ]);
        let out = std::process::Command::new(&host)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "prepack {}: {}",
            p.label,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let cpus = classes
        .iter()
        .map(|&(class, cpu)| (class, cpu))
        .chain([("aarch64-neon-mlal", "cortex-a72")]);
    for (class, cpu) in cpus {
        let runner = runner_on(cpu);
        for p in &programs {
            let file = bundle.join(format!("{}.{class}.xbc", p.label));
            let label = format!("aarch64-bundle-{cpu}-{}", p.label);
            let with_cache = |cache: &Path, layers: bool| {
                let mut args = p.args.clone();
                args.extend(["--cache".into(), cache.display().to_string()]);
                if layers {
                    args.extend(["--cache-layers".into(), bundle.display().to_string()]);
                }
                let m = measure(&runner, &label, "xnnblob", &args, &p.expected)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(m.worst <= p.tolerance, "{label} {}: {}", m.at, m.worst);
                m
            };
            // The drop-in's own cold launch on this CPU packs what the class's file holds.
            let cold = dir.join(format!("{cpu}-{}.cold.xbc", p.label));
            with_cache(&cold, false);
            xnnblob_test_support::cache_files::assert_same_packing(&file, &cold);
            // The first launch with the bundle.
            let writable = dir.join(format!("{cpu}-{}.xbc", p.label));
            let m = with_cache(&writable, true);
            let cache = m.run.cache(&writable.display().to_string());
            let entries = xnnblob_test_support::cache_files::packed_entries(&file).len();
            // The bundle holds every program's file of the class: all are loaded, none grows.
            let class_entries: usize = programs
                .iter()
                .map(|q| {
                    let f = bundle.join(format!("{}.{class}.xbc", q.label));
                    xnnblob_test_support::cache_files::packed_entries(&f).len()
                })
                .sum();
            assert_eq!(cache["misses"], 0, "{label}: {}", m.run.stdout);
            assert_eq!(
                cache["entries"] as usize, class_entries,
                "{label}: {}",
                m.run.stdout
            );
            assert!(
                !m.run.stdout.contains("ignored"),
                "{label}: {}",
                m.run.stdout
            );
            eprintln!("{label}: {entries} weights from {class}'s file, no look-up missed");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
