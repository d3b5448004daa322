//! ExecuTorch 1.5.1's own runtime (the wheel's Module, executor, memory planning and kernels)
//! running programs through xnnblob's "XnnpackBackend", with ExecuTorch's own XNNPACK backend as
//! the witness in the same test. Each launch is a fresh `xnnblob-et-run` process.

mod support;

use support::{f32s, relative_difference, scratch};

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/executorch")
}

/// One runner launch: its key=value lines (and the raw stdout), or its stderr on failure.
#[derive(Debug)]
struct Run {
    values: HashMap<String, String>,
    stdout: String,
}

impl Run {
    fn number(&self, key: &str) -> f64 {
        self.values
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in:\n{}", self.stdout))
            .parse()
            .unwrap()
    }

    /// The xnnblob cache line's counters for the cache at `which` ("memory" or a path).
    fn cache(&self, which: &str) -> HashMap<String, u64> {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("cache {which}:")))
            .unwrap_or_else(|| panic!("no cache line for {which} in:\n{}", self.stdout));
        let words: Vec<&str> = line.split_whitespace().skip(2).collect();
        words
            .chunks(2)
            .map(|kv| (kv[0].to_string(), kv[1].parse().unwrap()))
            .collect()
    }
}

fn runner(args: &[String]) -> Result<Run, String> {
    runner_on(None, args)
}

/// As [`runner`], on an emulated CPU (`qemu-x86_64 -cpu CPU`) when one is named.
fn runner_on(cpu: Option<&str>, args: &[String]) -> Result<Run, String> {
    support::backend_library();
    let exe = env!("CARGO_BIN_EXE_xnnblob-et-run");
    let mut command = match cpu {
        Some(cpu) => {
            let mut c = Command::new("qemu-x86_64");
            c.args(["-cpu", cpu, exe]);
            c
        }
        None => Command::new(exe),
    };
    let out = command.args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{:?}: {}\n{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let values = stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.contains(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(Run { values, stdout })
}

fn run_ok(args: &[String]) -> Run {
    runner(args).unwrap_or_else(|e| panic!("xnnblob-et-run {args:?} failed: {e}"))
}

fn s(v: &str) -> String {
    v.to_string()
}

fn f16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| xnnblob::tensor::f16_to_f32(u16::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

/// A runtime-c program's runner arguments and expected outputs per step.
fn runtime_c(name: &str) -> (Vec<String>, Vec<Vec<(PathBuf, String)>>) {
    io_program(&data().join("runtime-c"), name)
}

/// A program described by `dir/NAME.io.json` (steps of inputs and ExecuTorch's outputs): its
/// runner arguments and expected outputs per step.
fn io_program(dir: &Path, name: &str) -> (Vec<String>, Vec<Vec<(PathBuf, String)>>) {
    let io: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.io.json"))).unwrap())
            .unwrap();
    let mut args = vec![dir
        .join(io["program"].as_str().unwrap())
        .display()
        .to_string()];
    for d in io["data"].as_array().into_iter().flatten() {
        args.extend([
            s("--data"),
            dir.join(d.as_str().unwrap()).display().to_string(),
        ]);
    }
    let steps = io["steps"].as_array().unwrap();
    for input in steps[0]["inputs"].as_array().unwrap() {
        let file = input["file"].as_str().unwrap().replace(".s0.", ".s{step}.");
        args.extend([
            s("--input"),
            dir.join(file).display().to_string(),
            s("--dtype"),
            input["dtype"].as_str().unwrap().to_string(),
        ]);
    }
    args.extend([s("--steps"), steps.len().to_string()]);
    let expected = steps
        .iter()
        .map(|step| {
            step["outputs_et"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| {
                    (
                        dir.join(o["file"].as_str().unwrap()),
                        o["dtype"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .collect();
    (args, expected)
}

/// Turns an output file's bytes into f32 values.
type Decode = fn(&[u8]) -> Vec<f32>;

/// Runs `args` with `backend`, writing outputs into a fresh directory; compares every step's
/// outputs with `expected` within `tolerance` of their range; returns the largest difference.
fn check_outputs(
    label: &str,
    backend: &str,
    args: &[String],
    expected: &[Vec<(PathBuf, String)>],
    tolerance: f32,
) -> f32 {
    check_outputs_on(None, label, backend, args, expected, tolerance)
}

/// As [`check_outputs`], on an emulated CPU when one is named.
fn check_outputs_on(
    cpu: Option<&str>,
    label: &str,
    backend: &str,
    args: &[String],
    expected: &[Vec<(PathBuf, String)>],
    tolerance: f32,
) -> f32 {
    let out = scratch(&format!("{label}-{backend}"));
    let mut all = args.to_vec();
    all.extend([
        s("--backend"),
        s(backend),
        s("--output-dir"),
        out.display().to_string(),
    ]);
    let run = runner_on(cpu, &all)
        .unwrap_or_else(|e| panic!("xnnblob-et-run {all:?} on {cpu:?} failed: {e}"));
    if backend == "xnnblob" {
        // Every weight was read in once, where its look-up missed, and nothing packed was thrown
        // away: a placeholder whose read failed would have sent init back to read everything,
        // packing twice (as keys handed to ExecuTorch's map without a terminating NUL once did).
        let cache = run.cache("memory");
        assert_eq!(cache["packed"], cache["entries"], "{label}: {}", run.stdout);
    }
    let mut worst = 0.0f32;
    for (step, outputs) in expected.iter().enumerate() {
        for (j, (file, dtype)) in outputs.iter().enumerate() {
            let (decode, ext): (Decode, &str) = match dtype.as_str() {
                "float16" => (f16s, "f16"),
                _ => (f32s, "f32"),
            };
            let name = if expected.len() > 1 {
                format!("step{step}.output{j}.{ext}")
            } else {
                format!("output{j}.{ext}")
            };
            let got =
                decode(&std::fs::read(out.join(&name)).unwrap_or_else(|e| {
                    panic!("{label} ({backend}): {name}: {e}\n{}", run.stdout)
                }));
            let want = decode(&std::fs::read(file).unwrap());
            let d = relative_difference(&got, &want);
            assert!(
                d <= tolerance,
                "{label} ({backend}) step {step} output {j}: {d} > {tolerance}"
            );
            worst = worst.max(d);
        }
    }
    worst
}

/// Programs exported by ExecuTorch 1.5.1 (scripts/export-executorch-fixtures.py): every node type
/// its XNNPACK lowering emits, in fp32, fp16 and static int8, and small real architectures.
/// xnnblob's backend must match ExecuTorch's own, run in the same test, within the bounds
/// of the output range: 1e-5 for fp32, 2e-3 for fp16 (a few ulp near the range's top) and 1e-3
/// for quantized programs.
#[test]
fn exported_programs_match_executorchs_own_backend() {
    exported_programs_on(None);
}

/// The same on an AVX2-only CPU (emulated: qemu has no AVX-512), where both backends' XNNPACK
/// dispatch their AVX2 kernels; compared with ExecuTorch's stored outputs (from this machine).
#[cfg(target_arch = "x86_64")]
#[test]
fn exported_programs_match_on_an_avx2_only_cpu() {
    exported_programs_on(Some("Haswell-v4"));
}

fn exported_programs_on(cpu: Option<&str>) {
    let dir = data().join("export");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".io.json").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(
        names.len() >= 10,
        "the exported programs are there: {names:?}"
    );
    for name in names {
        let tolerance = if name.contains("int8") || name.contains("8da4w") {
            1e-3
        } else if name.contains("fp16") {
            2e-3
        } else {
            1e-5
        };
        let (args, expected) = io_program(&dir, &name);
        for (file, dtype) in expected.iter().flatten() {
            let bytes = std::fs::read(file).unwrap();
            let values = if dtype == "float16" {
                f16s(&bytes)
            } else {
                f32s(&bytes)
            };
            assert!(
                values.iter().any(|v| *v != values[0]),
                "{}: ExecuTorch's output is constant, so it checks nothing",
                file.display()
            );
        }
        let witness = check_outputs_on(cpu, &name, "executorch", &args, &expected, tolerance);
        let ours = check_outputs_on(cpu, &name, "xnnblob", &args, &expected, tolerance);
        eprintln!(
            "{name} on {cpu:?}: xnnblob {ours:e}, ExecuTorch's backend {witness:e} of the range"
        );
    }
}

#[test]
fn runtime_c_programs_match_executorch_with_both_backends() {
    // (program, tolerance relative to the output range)
    let programs = [
        ("c_partial_xnn_external", 1e-5),
        ("c_dynbatch_xnn_external", 1e-5),
        // Stateful over three steps: the mutable buffer is ExecuTorch's.
        ("c_kvcache_xnn_external", 1e-5),
        ("c_shared_a_xnn_external", 1e-5),
        ("c_shared_b_xnn_external", 1e-5),
        // fp16 accumulation rounds differently in the XNNPACK xnnblob builds (README).
        ("c_mlp_fp16_xnn_inline", 2e-3),
    ];
    for (name, tolerance) in programs {
        let (args, expected) = runtime_c(name);
        let witness = check_outputs(name, "executorch", &args, &expected, tolerance);
        let ours = check_outputs(name, "xnnblob", &args, &expected, tolerance);
        eprintln!("{name}: xnnblob {ours:e}, ExecuTorch's backend {witness:e} of the range");
    }
}

/// (method, runner arguments) for each method of a program.
type Methods = Vec<(String, Vec<String>)>;

/// A fixture of tests/data/executorch: runner arguments and the expected output per method.
fn fixture(name: &str) -> (Methods, Vec<PathBuf>, f32) {
    let dir = data();
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let mut program = vec![dir
        .join(m["pte"]["file"].as_str().unwrap())
        .display()
        .to_string()];
    for p in m["ptd"].as_array().into_iter().flatten() {
        program.extend([
            s("--data"),
            dir.join(p["file"].as_str().unwrap()).display().to_string(),
        ]);
    }
    let (input, outputs, tolerance) = if let Some(io) = m.get("io") {
        let input = io["inputs"][0]["f32"].as_str().unwrap().to_string();
        if name.starts_with("cnn") {
            (input, vec![format!("{name}.output_et.f32")], 1e-5)
        } else {
            (input, vec![format!("{name}.output_et.f32")], 1e-3)
        }
    } else {
        let io = m["model"]["io"].as_str().unwrap();
        let outputs = if io == "two_methods" {
            vec![s("two_methods.output0.f32"), s("two_methods.output1.f32")]
        } else {
            vec![format!("{io}.output.f32")]
        };
        (format!("{io}.input.f32"), outputs, 1e-5)
    };
    let methods: Vec<String> = m["pte"]["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let per_method = methods
        .into_iter()
        .map(|method| {
            let mut args = program.clone();
            args.extend([
                s("--method"),
                method.clone(),
                s("--input"),
                dir.join(&input).display().to_string(),
            ]);
            (method, args)
        })
        .collect();
    (
        per_method,
        outputs.iter().map(|o| dir.join(o)).collect(),
        tolerance,
    )
}

#[test]
fn every_xnnpack_fixture_matches_with_both_backends() {
    for name in [
        "mlp_xnn_inline",
        "mlp_xnn_external",
        "two_methods_xnn_external",
        "cnn_xnn_external",
        "mlp_qd8_qc8w_external",
        "mlp_qc4w_inline",
        "mlp_qb4w_inline",
        "mlp_qb4w_gk_inline",
    ] {
        let (methods, outputs, tolerance) = fixture(name);
        for ((method, args), expected) in methods.iter().zip(&outputs) {
            let expected = vec![vec![(expected.clone(), s("float32"))]];
            let label = format!("{name}.{method}");
            let witness = check_outputs(&label, "executorch", args, &expected, tolerance);
            let ours = check_outputs(&label, "xnnblob", args, &expected, tolerance);
            eprintln!("{label}: xnnblob {ours:e}, ExecuTorch's backend {witness:e}");
        }
    }
}

#[test]
fn two_programs_sharing_a_weight_pack_it_once() {
    let (a, _) = runtime_c("c_shared_a_xnn_external");
    let (b, _) = runtime_c("c_shared_b_xnn_external");
    // Entries, not packs: a launch whose placeholder read failed packs again (README, gaps).
    let entries = |args: Vec<String>| run_ok(&args).cache("memory")["entries"];
    let alone = entries(a.clone()) + entries(b.clone());
    let together = run_ok(&[a, b].concat()).cache("memory");
    assert_eq!(
        together["entries"],
        alone - 1,
        "the shared Linear is one entry"
    );
    assert!(together["hits"] >= 1, "found by the second program");
}

fn mlp_args() -> Vec<String> {
    let dir = data();
    vec![
        dir.join("mlp_qd8_qc8w_external.pte").display().to_string(),
        s("--data"),
        dir.join("mlp_qd8_qc8w_external.ptd").display().to_string(),
        s("--input"),
        dir.join("mlp_qd8.input.f32").display().to_string(),
    ]
}

#[test]
fn a_warm_launch_with_the_file_loader_reads_no_weights_and_the_cache_does_not_grow() {
    let dir = scratch("warm");
    let cache = dir.join("weights.xbc");
    let launch = |out: &str| {
        let mut args = mlp_args();
        args.extend([
            s("--load-mode"),
            s("file"),
            s("--cache"),
            cache.display().to_string(),
            s("--output-dir"),
            dir.join(out).display().to_string(),
        ]);
        std::fs::create_dir_all(dir.join(out)).unwrap();
        run_ok(&args)
    };
    let weights = std::fs::metadata(data().join("mlp_qd8_qc8w_external.ptd"))
        .unwrap()
        .len() as f64;
    let cold = launch("cold");
    let c = cold.cache(&cache.display().to_string());
    // Packed ahead of runtime creation on the backend's threads, then found by the creation.
    // Packing reads the loader's own bytes, except for a weight whose buffer ends on a page
    // boundary (no room for XNNPACK's over-read): that one is read into its placeholder, a
    // copy. Where the file loader's allocations end depends on the allocator's state (one
    // debug run here copied one 64 KiB weight, the release runs none).
    let parallel = xnnblob::backend::machine_threads() > 1;
    assert!(
        c["packed"] > 0 && (!parallel || c["hits"] == c["packed"]),
        "{}",
        cold.stdout
    );
    // No weight is copied twice: the cold launch copies at most the weight file once.
    assert!(
        cold.number("named_data_copied_bytes") <= weights,
        "{}",
        cold.stdout
    );
    let size = std::fs::metadata(&cache).unwrap().len();
    let mut first_warm = None;
    for i in 0..20 {
        let warm = launch(&format!("warm{i}"));
        let w = warm.cache(&cache.display().to_string());
        assert_eq!(w["packed"], 0, "warm launch {i} packs nothing");
        assert_eq!(w["deferred_fills"], 0, "no placeholder was read in");
        // No weight is read; a constant XNNPACK reads as it is would get a padded copy if its
        // buffer ended on a page boundary.
        assert!(
            warm.number("named_data_copied_bytes") < 0.02 * weights,
            "warm launch {i} copies: {}",
            warm.stdout
        );
        assert_eq!(std::fs::metadata(&cache).unwrap().len(), size, "no growth");
        first_warm.get_or_insert(warm.number("load_rchar"));
        assert_eq!(
            std::fs::read(dir.join(format!("warm{i}/output0.f32"))).unwrap(),
            std::fs::read(dir.join("cold/output0.f32")).unwrap(),
            "warm outputs are the cold ones"
        );
    }
    let warm_read = first_warm.unwrap();
    assert!(warm_read < 1024.0 * 1024.0);
    assert!(
        cold.number("load_rchar") - warm_read > 0.9 * weights,
        "the cold launch read the weights ({} B), the warm one did not ({warm_read} B)",
        cold.number("load_rchar")
    );
}

#[test]
fn no_launch_under_the_mmap_loader_copies_named_data() {
    // The mmap loader's buffers are pages of the file: every constant has room for XNNPACK's
    // over-read, so nothing is copied, cold or warm, and the outputs are ExecuTorch's.
    let dir = scratch("mmap-copies");
    let cache = dir.join("weights.xbc");
    for launch in ["cold", "warm"] {
        let mut args = mlp_args();
        args.extend([
            s("--load-mode"),
            s("mmap"),
            s("--cache"),
            cache.display().to_string(),
        ]);
        let run = run_ok(&args);
        assert_eq!(
            run.number("named_data_copied_bytes"),
            0.0,
            "{launch}: {}",
            run.stdout
        );
    }
}

#[test]
fn eight_threads_loading_one_program_share_one_cache_file() {
    let dir = scratch("threads");
    let cache = dir.join("weights.xbc");
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        cache.display().to_string(),
        s("--threads"),
        s("8"),
    ]);
    // The runner fails if any thread's outputs differ from the first's.
    let run = run_ok(&args);
    let c = run.cache(&cache.display().to_string());
    let single = {
        let one_dir = scratch("threads-one");
        let one = one_dir.join("weights.xbc");
        let mut a = mlp_args();
        a.extend([s("--cache"), one.display().to_string()]);
        run_ok(&a);
        std::fs::metadata(&one).unwrap().len()
    };
    assert_eq!(
        std::fs::metadata(&cache).unwrap().len(),
        single,
        "one cache of 1x size"
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["weights.xbc", "weights.xbc.lock"],
        "no stray temporary files"
    );
    assert_eq!(c["entries"], 3, "{}", run.stdout);
}

#[test]
fn bad_input_gets_a_clear_executorch_error() {
    let dir = data();
    let pte = dir.join("mlp_qd8_qc8w_external.pte").display().to_string();
    let input = dir.join("mlp_qd8.input.f32").display().to_string();
    // A missing .ptd (ExecuTorch's own backend crashes here).
    let missing = runner(&[pte.clone(), s("--input"), input.clone()]).unwrap_err();
    assert!(missing.contains("error 0x24"), "{missing}");
    assert!(!missing.contains("signal"), "{missing}");
    // Another model's .ptd.
    let other = runner(&[
        pte.clone(),
        s("--data"),
        dir.join("mlp_xnn_external.ptd").display().to_string(),
        s("--input"),
        input.clone(),
    ])
    .unwrap_err();
    assert!(other.contains("error 0x24"), "{other}");
    // A corrupt payload: the program with its delegate segment's header flipped.
    let bytes = std::fs::read(dir.join("mlp_xnn_inline.pte")).unwrap();
    let at = bytes
        .windows(4)
        .position(|w| w == b"XH00")
        .expect("an XNNPACK payload");
    let mut corrupt = bytes.clone();
    corrupt[at..at + 4].copy_from_slice(b"XX99");
    let corrupt_dir = scratch("corrupt");
    let path = corrupt_dir.join("corrupt.pte");
    std::fs::write(&path, corrupt).unwrap();
    let bad = runner(&[
        path.display().to_string(),
        s("--input"),
        dir.join("mlp.input.f32").display().to_string(),
    ])
    .unwrap_err();
    assert!(bad.contains("ExecuTorch error"), "{bad}");
    assert!(!bad.contains("signal"), "{bad}");
    // An unwritable cache path: falls back to memory, says so, and runs.
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        s("/proc/xnnblob-cannot-write-here/weights.xbc"),
    ]);
    let out = Command::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("kept in memory").count(),
        1,
        "said once: {stderr}"
    );
}

#[test]
fn programs_written_by_xnnblob_run_in_executorch_with_both_backends() {
    // A generated MLP written as a .pte and .ptd by xnnblob's program writer: ExecuTorch's
    // runtime must load it as it loads an exported program, and both backends must compute the
    // plain Rust reference.
    let dir = scratch("written");
    let mlp = xnnblob::synthetic::Mlp::random(&[48, 96, 64, 24], 17);
    let built = xnnblob::synthetic::mlp_payload(&mlp, 2);
    built.write_pte(&dir.join("mlp.pte"), "forward").unwrap();
    built.write_ptd(&dir.join("mlp.ptd")).unwrap();
    let input: Vec<f32> = (0..96).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(dir.join("input.f32"), bytes).unwrap();
    let reference = mlp.reference_forward(&input, 2);
    for backend in ["executorch", "xnnblob"] {
        let out = dir.join(backend);
        std::fs::create_dir_all(&out).unwrap();
        run_ok(&[
            dir.join("mlp.pte").display().to_string(),
            s("--data"),
            dir.join("mlp.ptd").display().to_string(),
            s("--input"),
            dir.join("input.f32").display().to_string(),
            s("--backend"),
            s(backend),
            s("--output-dir"),
            out.display().to_string(),
        ]);
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        let d = relative_difference(&got, &reference);
        assert!(d <= 1e-5, "{backend}: {d} of the range");
    }
}

/// A peer bench model at `mib`, written into `dir`, with an input file: its runner arguments.
fn bench_model(spec: xnnblob::synthetic::model::ModelSpec, dir: &Path) -> Vec<String> {
    let files = xnnblob::synthetic::model::ensure(&spec, dir).unwrap();
    let input_path = dir.join(format!("{}.input.f32", spec.name()));
    spec.write_input(&input_path).unwrap();
    vec![
        files.pte.display().to_string(),
        s("--data"),
        files.ptd.display().to_string(),
        s("--input"),
        input_path.display().to_string(),
    ]
}

#[test]
fn every_peer_bench_model_runs_alike_in_both_backends() {
    // The peer bench compares load times only if both backends compute the same model: every
    // kind it generates (fp32, qd8 with qc8w or qb4w weights, a CNN) runs in ExecuTorch's own
    // backend and in xnnblob's, cold and warm, to the same outputs.
    use xnnblob::synthetic::model::{Dtype, ModelSpec, Preset};
    let dir = scratch("peer-models");
    let llm = |dtype| ModelSpec {
        preset: Preset::LlmLike,
        dtype,
        mib: 2,
        layers: 3,
    };
    let specs = [
        llm(Dtype::Fp32),
        llm(Dtype::Qd8),
        llm(Dtype::Qb4w),
        ModelSpec {
            layers: 3,
            ..ModelSpec::cnn(2)
        },
    ];
    for spec in specs {
        let program = bench_model(spec, &dir);
        let mut outputs = Vec::new();
        for (backend, launch) in [
            ("executorch", "cold"),
            ("xnnblob", "cold"),
            ("xnnblob", "warm"),
        ] {
            let out = dir.join(format!("{}-{backend}-{launch}", spec.name()));
            std::fs::create_dir_all(&out).unwrap();
            let mut args = program.clone();
            args.extend([
                s("--backend"),
                s(backend),
                s("--load-mode"),
                s("mmap"),
                s("--cache"),
                dir.join(format!("{}.{backend}.cache", spec.name()))
                    .display()
                    .to_string(),
                s("--output-dir"),
                out.display().to_string(),
            ]);
            run_ok(&args);
            outputs.push(f32s(&std::fs::read(out.join("output0.f32")).unwrap()));
        }
        assert!(
            outputs[0].iter().all(|v| v.is_finite()) && outputs[0].iter().any(|v| *v != 0.0),
            "{}: a live output",
            spec.name()
        );
        // ExecuTorch bundles another XNNPACK build: its kernels may round differently, and in a
        // chain of dynamically quantized layers one quantization step apart in one layer moves
        // the next layer's input. A wrong weight layout or scale is off by the whole range.
        let tolerance = match spec.dtype {
            Dtype::Fp32 => 1e-4,
            Dtype::Qd8 | Dtype::Qb4w => 1e-2,
        };
        let d = relative_difference(&outputs[1], &outputs[0]);
        assert!(d <= tolerance, "{}: {d} of the range apart", spec.name());
        assert_eq!(outputs[1], outputs[2], "{}: warm is cold", spec.name());
    }
}

/// The fraction of `path`'s pages in the page cache (`mincore` over a map of it).
fn resident_fraction(path: &Path) -> f64 {
    let map = xnnblob::mmap::MappedFile::open(path).unwrap();
    let pages = map.bytes().len().div_ceil(4096);
    let resident = (0..pages)
        .filter(|p| {
            let mut v = 0u8;
            // SAFETY: a page-aligned page inside the live map; mincore writes one byte.
            unsafe {
                libc::mincore(
                    map.as_ptr().add(p * 4096) as *mut libc::c_void,
                    4096,
                    &mut v,
                )
            };
            v & 1 == 1
        })
        .count();
    resident as f64 / pages as f64
}

fn drop_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a valid descriptor; the advice changes no data.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[test]
fn a_warm_launch_with_the_mmap_loader_leaves_the_weights_on_disk() {
    // Depthwise filters are packed at every launch (XNNPACK keeps no cache entry for them), so
    // a warm launch reads those few KiB: it must not fault in the device's readahead window
    // around each (8 MiB on some disks), which read a CNN's whole weight file before.
    let dir = scratch("mmap-warm-disk");
    let spec = xnnblob::synthetic::model::ModelSpec::cnn(48);
    let mut args = bench_model(spec, &dir);
    let ptd = PathBuf::from(&args[2]);
    args.extend([
        s("--backend"),
        s("xnnblob"),
        s("--load-mode"),
        s("mmap"),
        s("--cache"),
        dir.join("cnn.cache").display().to_string(),
        s("--steps"),
        s("0"),
    ]);
    run_ok(&args);
    std::fs::File::open(&ptd).unwrap().sync_all().unwrap();
    drop_from_page_cache(&ptd);
    if resident_fraction(&ptd) > 0.01 {
        eprintln!(
            "skipped: {} stays in the page cache after POSIX_FADV_DONTNEED (tmpfs?)",
            ptd.display()
        );
        return;
    }
    let warm = run_ok(&args);
    assert_eq!(
        warm.cache(&dir.join("cnn.cache").display().to_string())["packed"],
        0
    );
    // ExecuTorch's loader reads the file's header itself (and a window around it).
    let resident = resident_fraction(&ptd);
    assert!(
        resident < 0.3,
        "{:.0}% of the weight file was read by a warm launch",
        resident * 100.0
    );
}

/// The CNN fixture's runner arguments, writing its outputs into `out` (made here).
fn cnn_args(out: &Path) -> Vec<String> {
    std::fs::create_dir_all(out).unwrap();
    let dir = data();
    vec![
        dir.join("cnn_xnn_external.pte").display().to_string(),
        s("--data"),
        dir.join("cnn_xnn_external.ptd").display().to_string(),
        s("--input"),
        dir.join("cnn.input.f32").display().to_string(),
        s("--repeat"),
        s("3"),
        s("--output-dir"),
        out.display().to_string(),
    ]
}

/// The runner's `pool executorch:` line: threads, operator calls run on ExecuTorch's pool, and
/// run on the caller for want of one.
fn pool_line(run: &Run) -> (u64, u64, u64) {
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("pool executorch: "))
        .unwrap_or_else(|| panic!("no pool line in:\n{}", run.stdout));
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |key: &str| -> u64 {
        let at = words.iter().position(|w| *w == key).unwrap();
        words[at + 1].parse().unwrap()
    };
    (
        value("threads"),
        value("operator_runs"),
        value("inline_runs"),
    )
}

#[test]
fn xnnblob_runs_on_executorchs_own_thread_pool_at_the_size_the_app_gives_it() {
    let dir = scratch("et-pool");
    let witness_dir = dir.join("executorch");
    let mut witness = cnn_args(&witness_dir);
    witness.extend([s("--backend"), s("executorch")]);
    run_ok(&witness);
    let expected = f32s(&std::fs::read(witness_dir.join("output0.f32")).unwrap());
    let machine = xnnblob::backend::machine_threads() as u64;

    let cases: [(&str, &[&str]); 4] = [
        ("default", &[]),
        ("three", &["--pool-threads", "3"]),
        ("one", &["--pool-threads", "1"]),
        ("guarded", &["--no-pool"]),
    ];
    for (name, extra) in cases {
        let out = dir.join(name);
        let mut args = cnn_args(&out);
        args.extend(extra.iter().map(|a| a.to_string()));
        let run = run_ok(&args);
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        assert_eq!(got.len(), expected.len(), "{name}: output length");
        let diff = relative_difference(&got, &expected);
        assert!(
            diff <= 1e-5,
            "{name}: {diff} of the range from ExecuTorch's backend"
        );
        // No pool of xnnblob's own: every worker the process had was ExecuTorch's.
        assert_eq!(
            run.number("own_pool_threads"),
            0.0,
            "{name}:\n{}",
            run.stdout
        );
        let (threads, on_pool, inline) = pool_line(&run);
        match name {
            "default" => {
                assert_eq!(
                    threads, machine,
                    "ExecuTorch's default: one thread per core"
                );
                if machine > 1 {
                    assert!(
                        on_pool > 0,
                        "operators ran on ExecuTorch's pool:\n{}",
                        run.stdout
                    );
                }
            }
            "three" => {
                assert_eq!(threads, 3, "_unsafe_reset_threadpool(3) is honoured");
                assert!(
                    on_pool > 0,
                    "operators ran on ExecuTorch's pool:\n{}",
                    run.stdout
                );
            }
            "one" => {
                assert_eq!(threads, 1);
                assert_eq!(
                    on_pool, 0,
                    "a pool of one runs on the caller:\n{}",
                    run.stdout
                );
            }
            _ => {
                // Created under a NoThreadPoolGuard: the runtime has no pool, as ExecuTorch's.
                assert_eq!((on_pool, inline), (0, 0), "{}", run.stdout);
            }
        }
    }
}

/// Runs the runner and returns its exit status, stdout and stderr, however it ended.
fn run_any(args: &[String]) -> (bool, String, String) {
    support::backend_library();
    let out = Command::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_file_at_the_cache_path_that_is_not_a_cache_is_left_alone() {
    let dir = scratch("foreign-cache");
    let expected =
        f32s(&std::fs::read(data().join("mlp_qd8_qc8w_external.output_et.f32")).unwrap());
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, b"my notes\n").unwrap();
    // The program's own weights as the cache path too.
    let ptd = dir.join("weights.ptd");
    std::fs::copy(data().join("mlp_qd8_qc8w_external.ptd"), &ptd).unwrap();
    for (path, data_file) in [
        (notes.clone(), data().join("mlp_qd8_qc8w_external.ptd")),
        (ptd.clone(), ptd.clone()),
    ] {
        let before = std::fs::read(&path).unwrap();
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let args = vec![
            data()
                .join("mlp_qd8_qc8w_external.pte")
                .display()
                .to_string(),
            s("--data"),
            data_file.display().to_string(),
            s("--input"),
            data().join("mlp_qd8.input.f32").display().to_string(),
            s("--cache"),
            path.display().to_string(),
            s("--output-dir"),
            out.display().to_string(),
        ];
        let (ok, stdout, stderr) = run_any(&args);
        assert!(ok, "{}: {stdout}{stderr}", path.display());
        assert!(
            stderr.contains("not a packed-weight cache"),
            "{}: said why: {stderr}",
            path.display()
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{}: untouched",
            path.display()
        );
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        assert!(
            relative_difference(&got, &expected) <= 1e-3,
            "{}",
            path.display()
        );
    }
}

#[test]
fn a_writer_lock_held_elsewhere_delays_exit_by_a_bounded_time_and_leaves_the_file() {
    let dir = scratch("held-lock");
    let cache = dir.join("weights.xbc");
    let holder = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("weights.xbc.lock"))
        .unwrap();
    holder.lock().unwrap();
    // One delegate, and an export with several: a save given up must not fail the next
    // delegate's init (it did, with the lock's error) nor make each of them wait again.
    let export = data().join("export");
    let vit = |file: &str| export.join(file).display().to_string();
    let programs = [
        mlp_args(),
        vec![
            vit("arch_vit_fp32.pte"),
            s("--data"),
            vit("arch_vit_fp32.ptd"),
            s("--input"),
            vit("arch_vit_fp32.s0.in0.bin"),
        ],
    ];
    for mut args in programs {
        args.extend([s("--cache"), cache.display().to_string()]);
        // Without a limit the runner never exited: it waited for the lock at exit.
        let (ok, stdout, stderr) = run_any(&args);
        assert!(ok, "{stdout}{stderr}");
        assert_eq!(
            stderr.matches("writer lock").count(),
            1,
            "the save said once why it gave up: {stderr}"
        );
        assert!(!cache.exists(), "nothing was written at the path");
    }
    drop(holder);
}

#[test]
fn damaged_packed_bytes_are_found_after_the_launch_and_never_served_again() {
    let dir = scratch("damage");
    let cache = dir.join("weights.xbc");
    let expected =
        f32s(&std::fs::read(data().join("mlp_qd8_qc8w_external.output_et.f32")).unwrap());
    let launch = |tag: &str| -> (Vec<f32>, String) {
        let out = dir.join(tag);
        std::fs::create_dir_all(&out).unwrap();
        let mut args = mlp_args();
        args.extend([
            s("--cache"),
            cache.display().to_string(),
            s("--output-dir"),
            out.display().to_string(),
        ]);
        let (ok, stdout, stderr) = run_any(&args);
        assert!(ok, "{tag}: {stdout}{stderr}");
        (
            f32s(&std::fs::read(out.join("output0.f32")).unwrap()),
            stderr,
        )
    };
    let (cold, _) = launch("cold");
    assert!(relative_difference(&cold, &expected) <= 1e-3);
    // Flip one byte inside the first entry's packed bytes.
    let mut bytes = std::fs::read(&cache).unwrap();
    let compat = xnnblob::cache::format::Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let decoded = xnnblob::cache::format::decode(&bytes, &compat).unwrap();
    let first = &decoded.entries[0];
    let at = (first.offset + first.size / 2) as usize;
    bytes[at] ^= 0x5A;
    std::fs::write(&cache, &bytes).unwrap();
    // The launch that meets the damage has handed those bytes to XNNPACK already; it finds them
    // afterwards, says so, and leaves the entry out of the file.
    let (_, said) = launch("damaged");
    assert!(said.contains("damaged packed weights"), "{said}");
    let (after, _) = launch("after");
    assert_eq!(after, cold, "the next launch repacked the damaged weight");

    // With verify_on_load, the launch that meets the damage is right too.
    let mut bytes = std::fs::read(&cache).unwrap();
    let decoded = xnnblob::cache::format::decode(&bytes, &compat).unwrap();
    let first = &decoded.entries[0];
    bytes[(first.offset + first.size / 2) as usize] ^= 0x5A;
    std::fs::write(&cache, &bytes).unwrap();
    let out = dir.join("verified");
    std::fs::create_dir_all(&out).unwrap();
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        cache.display().to_string(),
        s("--verify-on-load"),
        s("--output-dir"),
        out.display().to_string(),
    ]);
    let (ok, stdout, stderr) = run_any(&args);
    assert!(ok, "{stdout}{stderr}");
    let verified = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
    assert_eq!(
        verified, cold,
        "checked before use: the damaged weight was packed again"
    );
}

/// Makes `dir` take no new files, even for root (the immutable attribute), until dropped.
struct Immutable<'a>(&'a Path);

impl<'a> Immutable<'a> {
    fn set(dir: &'a Path) -> Option<Immutable<'a>> {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Immutable(dir))
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(self.0).status();
    }
}

#[test]
fn a_valid_cache_in_a_directory_that_takes_no_new_files_is_used_warm() {
    let dir = scratch("read-only");
    let cache = dir.join("weights.xbc");
    let mut args = mlp_args();
    args.extend([s("--cache"), cache.display().to_string()]);
    let (ok, stdout, stderr) = run_any(&args);
    assert!(ok, "cold: {stdout}{stderr}");
    let before = std::fs::read(&cache).unwrap();
    let Some(_frozen) = Immutable::set(&dir) else {
        eprintln!("skipped: this file system has no immutable attribute (chattr +i)");
        return;
    };
    let (ok, stdout, said) = run_any(&args);
    drop(_frozen);
    assert!(ok, "warm, read-only: {stdout}{said}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("cache {}:", cache.display())))
        .unwrap_or_else(|| panic!("the file was opened:\n{stdout}{said}"));
    assert!(
        line.contains(" packed 0 "),
        "nothing packed, the file was used: {line}"
    );
    assert!(said.contains("takes no new files"), "said once why: {said}");
    assert!(!said.contains("not saved"), "no failed save: {said}");
    assert_eq!(
        std::fs::read(&cache).unwrap(),
        before,
        "the file is as it was"
    );
}

/// Cuts the cache file short between two executes of a warm launch: the second execute fails
/// (ExecuTorch's `Internal`, the cause in its log), the process exits normally rather than of
/// SIGBUS, and the next launch rebuilds the file and computes what the cold launch did.
#[test]
fn a_cache_file_cut_short_during_executes_fails_them_without_sigbus() {
    use std::io::{BufRead, Write};
    use std::process::Stdio;
    let dir = scratch("cut-short");
    let spec = xnnblob::synthetic::model::ModelSpec {
        preset: xnnblob::synthetic::model::Preset::LlmLike,
        dtype: xnnblob::synthetic::model::Dtype::Qd8,
        mib: 2,
        layers: 8,
    };
    let model = bench_model(spec, &dir.join("model"));
    let launch_args = |cache: &Path, out: &str, extra: &[&str]| {
        let mut args = model.clone();
        let out = dir.join(out);
        std::fs::create_dir_all(&out).unwrap();
        args.extend([
            s("--cache"),
            cache.display().to_string(),
            s("--output-dir"),
            out.display().to_string(),
        ]);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    type Cut = fn(u64) -> u64;
    let cuts: [(&str, Cut); 3] = [
        ("to nothing", |_| 0),
        ("in half", |len| len / 2),
        ("by 4 KiB", |len| len - 4096),
    ];
    for (i, (cut, to)) in cuts.into_iter().enumerate() {
        for load_mode in ["file", "mmap"] {
            let cache = dir.join(format!("w{i}-{load_mode}.xbc"));
            let mode = ["--load-mode", load_mode];
            run_ok(&launch_args(&cache, "cold", &mode));
            let cold = f32s(&std::fs::read(dir.join("cold/output0.f32")).unwrap());
            support::backend_library();
            let mut child = Command::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
                .args(launch_args(
                    &cache,
                    "warm",
                    &[&mode[..], &["--repeat", "3", "--wait-between-executes"]].concat(),
                ))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
            let mut said = String::new();
            while !said.contains("waiting for a line") {
                let before = said.len();
                stderr.read_line(&mut said).unwrap();
                assert!(said.len() > before, "{cut}: the runner ended early: {said}");
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&cache)
                .unwrap();
            file.set_len(to(file.metadata().unwrap().len())).unwrap();
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin).unwrap();
            writeln!(stdin).unwrap();
            drop(stdin);
            let mut rest = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
            said.push_str(&rest);
            let status = child.wait().unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                None,
                "{cut}, {load_mode}: no SIGBUS: {said}"
            );
            assert_eq!(status.code(), Some(1), "{cut}, {load_mode}: {said}");
            assert!(
                said.contains("cut short while mapped"),
                "{cut}, {load_mode}: the cause was said: {said}"
            );

            let next = run_ok(&launch_args(&cache, "next", &mode));
            let got = f32s(&std::fs::read(dir.join("next/output0.f32")).unwrap());
            assert_eq!(got, cold, "{cut}, {load_mode}: the next launch is right");
            assert!(
                next.cache(&cache.display().to_string())["packed"] > 0,
                "{cut}, {load_mode}: the next launch packed anew"
            );
        }
    }
}

/// Every reason a cache path cannot be saved to is said once, at ExecuTorch's Error level (or
/// at exit for a disk that fills up during the save), naming the path and the cause; the
/// launch still computes the right outputs, and nothing is left at the path.
#[test]
fn every_failed_save_is_said_once_with_its_path_and_cause() {
    use support::{without_permission_override, Tmpfs};
    let dir = scratch("failed-saves");
    let expected =
        f32s(&std::fs::read(data().join("mlp_qd8_qc8w_external.output_et.f32")).unwrap());
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let directory = dir.join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let closed = dir.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    // 16 KiB: the launch opens the path, the save at exit runs out of room.
    let full = Tmpfs::mount(&dir.join("full"), "size=16k");
    let read_only = Tmpfs::mount(&dir.join("ro"), "size=1m,ro");
    let mut cases: Vec<(PathBuf, &str)> = vec![
        (fifo.clone(), "a FIFO, not a regular file"),
        (directory.clone(), "a directory, not a regular file"),
        (closed.join("w.xbc"), "Permission denied"),
    ];
    if let Some(full) = &full {
        cases.push((full.join("w.xbc"), "No space left on device"));
    }
    if let Some(ro) = &read_only {
        cases.push((ro.join("w.xbc"), "Read-only file system"));
    }
    for (path, cause) in cases {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let _ = std::fs::remove_file(out.join("output0.f32"));
        let mut args = mlp_args();
        args.extend([
            s("--cache"),
            path.display().to_string(),
            s("--output-dir"),
            out.display().to_string(),
        ]);
        support::backend_library();
        let exe = Path::new(env!("CARGO_BIN_EXE_xnnblob-et-run"));
        let mut command = if cause == "Permission denied" {
            match without_permission_override(exe) {
                Some(c) => c,
                None => continue,
            }
        } else {
            Command::new(exe)
        };
        let run = command.args(&args).output().unwrap();
        let said = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "{}: {said}", path.display());
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        assert!(
            relative_difference(&got, &expected) <= 1e-3,
            "{}: right outputs",
            path.display()
        );
        let lines: Vec<&str> = said.lines().filter(|l| l.contains(cause)).collect();
        assert_eq!(lines.len(), 1, "{}: said once: {said}", path.display());
        let line = lines[0];
        assert!(
            line.contains(&path.display().to_string()),
            "names the path: {line}"
        );
        assert!(
            line.starts_with("E ") || line.contains("not saved"),
            "at Error level: {line}"
        );
        if cause.contains("not a regular file") {
            continue;
        }
        assert!(
            !path.exists(),
            "{}: nothing left at the path",
            path.display()
        );
    }
}
