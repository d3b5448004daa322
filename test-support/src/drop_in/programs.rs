//! The programs the drop-in's tests run through `xnnblob-et-run` with both backends, their
//! expected outputs (ExecuTorch's stored ones) and tolerances, and how a launch is started: on
//! this machine, or under qemu (an emulated x86-64 CPU, or an aarch64 build).

use super::f32s;
use crate::close::relative_difference;
use crate::io_steps::call_arg;
use crate::{XNNPACK_FIXTURES, scratch};

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/data/executorch`.
pub fn data() -> PathBuf {
    crate::dir()
}

pub fn s(v: &str) -> String {
    v.to_string()
}

pub fn f16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| xnnblob::tensor::f16_to_f32(u16::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

/// How a runner launch starts: `xnnblob-et-run` (with `libxnnblob_executorch.so` beside it),
/// directly or after a qemu command line.
pub struct Runner {
    exe: PathBuf,
    qemu: Vec<String>,
}

impl Runner {
    /// The runner `et_run` built for this host (with the backend library beside it), on this
    /// machine's CPU or, when `cpu` names one, on that x86-64 CPU as `qemu-x86_64 -cpu CPU`
    /// emulates it.
    pub fn host(et_run: impl AsRef<Path>, cpu: Option<&str>) -> Runner {
        super::backend_library(&et_run);
        Runner {
            exe: et_run.as_ref().into(),
            qemu: cpu
                .map(|cpu| vec![s("qemu-x86_64"), s("-cpu"), s(cpu)])
                .unwrap_or_default(),
        }
    }

    /// `exe` started after the `qemu` command line (program, then arguments).
    pub fn emulated(exe: PathBuf, qemu: Vec<String>) -> Runner {
        Runner { exe, qemu }
    }

    /// A command that starts the runner, before its arguments.
    pub fn command(&self) -> Command {
        match self.qemu.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&self.exe);
                command
            }
            None => Command::new(&self.exe),
        }
    }

    /// One launch: its key=value lines, or its exit status, stderr and stdout on failure.
    pub fn run(&self, args: &[String]) -> Result<Run, String> {
        // One launch takes seconds, under qemu too: ten minutes is a hang.
        let out = crate::bounded::output(
            self.command().args(args),
            std::time::Duration::from_secs(600),
            &format!("xnnblob-et-run {args:?}"),
        );
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
}

/// One runner launch: its key=value lines (and the raw stdout).
#[derive(Debug)]
pub struct Run {
    values: HashMap<String, String>,
    pub stdout: String,
}

impl Run {
    pub fn number(&self, key: &str) -> f64 {
        self.values
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in:\n{}", self.stdout))
            .parse()
            .unwrap()
    }

    /// The xnnblob cache line's counters for the cache at `which` ("memory" or a path).
    pub fn cache(&self, which: &str) -> HashMap<String, u64> {
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

/// Expected outputs per step: each output's file (ExecuTorch's stored output) and dtype.
pub type Expected = Vec<Vec<(PathBuf, String)>>;

/// A program to run: a label, its runner arguments, its expected outputs and the tolerance
/// relative to their range.
pub struct Program {
    pub label: String,
    pub args: Vec<String>,
    pub expected: Expected,
    pub tolerance: f32,
}

/// The runtime-c programs with their tolerances relative to the output range.
pub const RUNTIME_C: [(&str, f32); 6] = [
    ("c_partial_xnn_external", 1e-5),
    ("c_dynbatch_xnn_external", 1e-5),
    // Stateful over three steps: the mutable buffer is ExecuTorch's.
    ("c_kvcache_xnn_external", 1e-5),
    ("c_shared_a_xnn_external", 1e-5),
    ("c_shared_b_xnn_external", 1e-5),
    // fp16 accumulation rounds differently in the XNNPACK xnnblob builds (docs/executorch.md).
    ("c_mlp_fp16_xnn_inline", 2e-3),
];

/// The runtime-c programs.
pub fn runtime_c_programs() -> Vec<Program> {
    RUNTIME_C
        .iter()
        .map(|&(name, tolerance)| {
            let (args, expected) = runtime_c(name);
            Program {
                label: s(name),
                args,
                expected,
                tolerance,
            }
        })
        .collect()
}

/// Every method of every XNNPACK fixture.
pub fn fixture_programs() -> Vec<Program> {
    XNNPACK_FIXTURES
        .iter()
        .flat_map(|name| {
            let (methods, outputs, tolerance) = fixture(name);
            methods
                .into_iter()
                .zip(outputs)
                .map(move |((method, args), expected)| Program {
                    label: format!("{name}.{method}"),
                    args,
                    expected: vec![vec![(expected, s("float32"))]],
                    tolerance,
                })
        })
        .collect()
}

/// Programs exported by ExecuTorch 1.5.1 (scripts/export-executorch-fixtures.py), with the
/// issue's bounds of the output range: 1e-5 for fp32, 2e-3 for fp16 (a few ulp near the range's
/// top) and 1e-3 for quantized programs.
pub fn exported_programs() -> Vec<Program> {
    let dir = data().join("export");
    let names = crate::exported_names();
    assert!(
        names.len() >= 10,
        "the exported programs are there: {names:?}"
    );
    names
        .into_iter()
        .map(|name| {
            let tolerance =
                if name.contains("int8") || name.contains("8da4w") || name.contains("8da8w") {
                    1e-3
                } else if name.contains("fp16") {
                    2e-3
                } else {
                    1e-5
                };
            let (args, expected) = io_program(&dir, &name);
            Program {
                label: name,
                args,
                expected,
                tolerance,
            }
        })
        .collect()
}

/// The runner arguments of `mlp_qd8_qc8w_external` (qd8 activations, qc8w weights in a `.ptd`)
/// on its input; its expected output is `mlp_qd8_qc8w_external.output_et.f32`.
pub fn mlp_args() -> Vec<String> {
    let dir = data();
    vec![
        dir.join("mlp_qd8_qc8w_external.pte").display().to_string(),
        s("--data"),
        dir.join("mlp_qd8_qc8w_external.ptd").display().to_string(),
        s("--input"),
        dir.join("mlp_qd8.input.f32").display().to_string(),
    ]
}

/// A runtime-c program's runner arguments and expected outputs per step.
pub fn runtime_c(name: &str) -> (Vec<String>, Expected) {
    io_program(&data().join("runtime-c"), name)
}

/// A program described by `dir/NAME.io.json` (steps of inputs and ExecuTorch's outputs): its
/// runner arguments and expected outputs per step.
pub fn io_program(dir: &Path, name: &str) -> (Vec<String>, Expected) {
    let io: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.io.json"))).unwrap())
            .unwrap();
    let mut args = vec![
        dir.join(io["program"].as_str().unwrap())
            .display()
            .to_string(),
    ];
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

/// (method, runner arguments) for each method of a program.
pub type Methods = Vec<(String, Vec<String>)>;

/// A fixture of tests/data/executorch: runner arguments and the expected output per method.
pub fn fixture(name: &str) -> (Methods, Vec<PathBuf>, f32) {
    let dir = data();
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let mut program = vec![
        dir.join(m["pte"]["file"].as_str().unwrap())
            .display()
            .to_string(),
    ];
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

/// Turns an output file's bytes into f32 values.
type Decode = fn(&[u8]) -> Vec<f32>;

/// How far a launch's outputs are from the expected ones.
pub struct Measured {
    /// The largest difference relative to the expected output's range.
    pub worst: f32,
    /// Where it is ("step S output J").
    pub at: String,
    pub run: Run,
}

/// Runs `args` with `backend`, writing outputs into a fresh directory, and measures every
/// step's outputs against `expected`; Err with the runner's words when the launch fails.
pub fn measure(
    runner: &Runner,
    label: &str,
    backend: &str,
    args: &[String],
    expected: &[Vec<(PathBuf, String)>],
) -> Result<Measured, String> {
    let out = scratch(&format!("{label}-{backend}"));
    let mut all = args.to_vec();
    all.extend([
        s("--backend"),
        s(backend),
        s("--output-dir"),
        out.display().to_string(),
    ]);
    let run = runner.run(&all)?;
    if backend == "xnnblob" {
        // Every weight was read in once, where its look-up missed, and nothing packed was thrown
        // away: a placeholder whose read failed would have sent init back to read everything,
        // packing twice (as keys handed to ExecuTorch's map without a terminating NUL once did).
        let cache = run.cache("memory");
        assert_eq!(cache["packed"], cache["entries"], "{label}: {}", run.stdout);
    }
    let mut worst = (0.0f32, String::new());
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
            // A length mismatch or a NaN output is infinite (close.rs), so never passed over.
            if d > worst.0 || worst.1.is_empty() {
                worst = (d, format!("step {step} output {j}"));
            }
        }
    }
    Ok(Measured {
        worst: worst.0,
        at: worst.1,
        run,
    })
}

/// [`measure`], asserting the launch succeeds and every output is within `tolerance` of its
/// range; returns the largest difference.
pub fn check_outputs(
    runner: &Runner,
    label: &str,
    backend: &str,
    args: &[String],
    expected: &[Vec<(PathBuf, String)>],
    tolerance: f32,
) -> f32 {
    let m = measure(runner, label, backend, args, expected)
        .unwrap_or_else(|e| panic!("xnnblob-et-run {label} ({backend}) failed: {e}"));
    assert!(
        m.worst <= tolerance,
        "{label} ({backend}) {}: {} > {tolerance}",
        m.at,
        m.worst
    );
    m.worst
}

/// The exports whose methods share mutable buffers (`shared_*.calls.json` in the export
/// directory: a sequence of method calls with eager PyTorch's outputs), by name. The
/// `frozen_*` ones are exported without the recipe that keeps a buffer shared, and are wrong with
/// every backend (the CLI's tests check that they are warned about).
pub fn sharing_programs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data().join("export"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".calls.json")
                .filter(|n| n.starts_with("shared_"))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Runs `name`'s calls in sequence with `runner` (issue 43): each output within 1e-5 of the
/// range of eager's, through ExecuTorch's backend and xnnblob's cold and warm with a cache file
/// (the warm launch packs nothing), with the arenas shared; with them apart, both backends
/// differ from eager.
pub fn sharing_program_matches_eager(runner: &Runner, dir: &Path, name: &str) {
    let description: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.calls.json"))).unwrap())
            .unwrap();
    let calls = description["calls"].as_array().unwrap();
    let out = scratch(&format!("shared-{name}"));
    let cache = out.join("weights.xbc");
    let mut args = vec![dir.join(format!("{name}.pte")).display().to_string()];
    for data in description["data"].as_array().unwrap() {
        args.extend([
            s("--data"),
            dir.join(data.as_str().unwrap()).display().to_string(),
        ]);
    }
    for c in calls {
        // Each input of the dtype and shape the method declares (tokens and positions as int64).
        args.extend([s("--call"), call_arg(dir, c)]);
    }
    // The largest difference from eager over every call (of the range of eager's output), whether
    // the arenas were shared, and the launch.
    let launch = |tag: &str, backend: &str, extra: &[&str]| -> (f32, bool, Run) {
        let outputs = out.join(tag);
        std::fs::create_dir_all(&outputs).unwrap();
        let mut a = args.clone();
        a.extend([s("--backend"), s(backend), s("--output-dir")]);
        a.push(outputs.display().to_string());
        a.extend(extra.iter().map(|e| e.to_string()));
        let run = runner
            .run(&a)
            .unwrap_or_else(|e| panic!("xnnblob-et-run {a:?} failed: {e}"));
        let mut worst = 0f32;
        for (k, c) in calls.iter().enumerate() {
            let eager = f32s(
                &std::fs::read(dir.join(c["outputs_eager"][0]["file"].as_str().unwrap())).unwrap(),
            );
            let ours = f32s(&std::fs::read(outputs.join(format!("step{k}.output0.f32"))).unwrap());
            assert_eq!(ours.len(), eager.len(), "{name} {tag}: call {k}");
            worst = worst.max(relative_difference(&ours, &eager));
        }
        let shared = run.number("share_memory_arenas") == 1.0;
        (worst, shared, run)
    };
    let cache_arg = cache.display().to_string();
    for (tag, backend, extra) in [
        ("executorch", "executorch", vec![]),
        (
            "xnnblob-cold",
            "xnnblob",
            vec!["--cache", cache_arg.as_str()],
        ),
        (
            "xnnblob-warm",
            "xnnblob",
            vec!["--cache", cache_arg.as_str()],
        ),
    ] {
        let (worst, shared, run) = launch(tag, backend, &extra);
        assert!(
            shared,
            "{name} {tag}: calls of two methods share the arenas"
        );
        assert!(
            worst < 1e-5,
            "{name} {tag}: {worst:e} of the range from eager"
        );
        if tag == "xnnblob-warm" {
            assert_eq!(
                run.cache(&cache_arg)["packed"],
                0,
                "{name} warm: nothing packed"
            );
        }
    }
    for backend in ["xnnblob", "executorch"] {
        let (worst, shared, _) = launch(
            &format!("{backend}-apart"),
            backend,
            &["--share-arenas", "off"],
        );
        assert!(!shared);
        assert!(
            worst > 1e-2,
            "{name} {backend}: with the arenas apart, a method reads state the other never \
             wrote ({worst:e})"
        );
    }
}
