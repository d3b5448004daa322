//! The peer bench: xnnblob's backend against ExecuTorch's own XNNPACK backend and its persistent
//! cache, inside ExecuTorch 1.5.1's runtime, in one run. Each launch is a fresh `xnnblob-et-run`
//! process on a generated program (`.pte` + `.ptd`), under both of `Module`'s load modes.
//!
//! ```sh
//! xnnblob bench --peer [--repeats N] [--models fp32,qd8,qb4w,llm1184,cnn] [--out DIR]
//! cargo bench -p xnnblob-executorch --bench peer -- [the same options]
//! ```
//!
//! Scenarios: ExecuTorch without a cache, with its cache cold (file removed before each launch)
//! and warm; xnnblob cold and warm; and both warm launches again with the program, data and cache
//! files dropped from the page cache first (`posix_fadvise(DONTNEED)`), where the first output
//! waits for the disk. Elsewhere files stay in the page cache between launches: those scenarios
//! measure work, not the disk.
//!
//! Writes `peer.md` (the table, the ratios and each target's verdict), `peer.json` (what
//! `xnnblob bench compare` reads) and `peer.svg` under `--out` (default `target/bench/peer`).

use super::report::{spread, Spread};
use super::runner_values;
use plotters::prelude::*;
use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob_test_support::synthetic::model::{ensure, Dtype, ModelSpec, Preset};

/// One scenario: which backend, and what happens to its cache file around each launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    /// The name the report and the JSON use.
    pub name: &'static str,
    /// `xnnblob-et-run --backend`: `executorch` or `xnnblob`.
    pub backend: &'static str,
    /// What happens to the cache file.
    pub cache: CacheUse,
}

/// What a scenario does with its cache file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// No packed-weight cache (`weight_cache_enabled=false`).
    Off,
    /// The cache file is removed before every launch.
    Cold,
    /// One untimed launch fills the file; the measured launches find it.
    Warm,
    /// As `Warm`, with the program, data and cache files dropped from the page cache before
    /// each launch.
    WarmFromDisk,
    /// As `Warm`, with one thread per core spinning in the bench's process during each launch.
    WarmBusy,
    /// A device's first launch with a bundle: the program packed ahead of time for this CPU's
    /// class (`xnnblob prepack`, untimed, once) as a read-only layer, the writable cache file
    /// removed before every launch.
    Bundle,
}

/// Every scenario, in the order they run and are reported.
pub const SCENARIOS: [Scenario; 11] = [
    Scenario {
        name: "executorch, no cache",
        backend: "executorch",
        cache: CacheUse::Off,
    },
    Scenario {
        name: "executorch cache, cold",
        backend: "executorch",
        cache: CacheUse::Cold,
    },
    Scenario {
        name: "executorch cache, warm",
        backend: "executorch",
        cache: CacheUse::Warm,
    },
    Scenario {
        name: "xnnblob, cold",
        backend: "xnnblob",
        cache: CacheUse::Cold,
    },
    Scenario {
        name: "xnnblob, first launch with a bundle",
        backend: "xnnblob",
        cache: CacheUse::Bundle,
    },
    Scenario {
        name: "xnnblob, warm",
        backend: "xnnblob",
        cache: CacheUse::Warm,
    },
    Scenario {
        name: "executorch cache, warm, cold page cache",
        backend: "executorch",
        cache: CacheUse::WarmFromDisk,
    },
    Scenario {
        name: "xnnblob, warm, cold page cache",
        backend: "xnnblob",
        cache: CacheUse::WarmFromDisk,
    },
    Scenario {
        name: "executorch cache, warm, busy cores",
        backend: "executorch",
        cache: CacheUse::WarmBusy,
    },
    Scenario {
        name: "xnnblob, warm, busy cores",
        backend: "xnnblob",
        cache: CacheUse::WarmBusy,
    },
    // ExecuTorch against itself: how far apart two sets of launches of one backend land
    // beside busy cores, which is what a ratio of worst cases can resolve on this machine.
    Scenario {
        name: "executorch cache, warm, busy cores, again",
        backend: "executorch",
        cache: CacheUse::WarmBusy,
    },
];

/// The load modes of ExecuTorch's `Module` every model is launched under.
pub const LOAD_MODES: [&str; 2] = ["file", "mmap"];

/// What the launches of one scenario measured.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// From `Module`'s construction to the method loaded, ms.
    pub load_to_ready_ms: Spread,
    /// The first `execute`, ms.
    pub first_execute_ms: Spread,
    /// The median of each launch's later executes, ms (the first again when it ran once).
    pub steady_execute_ms: Spread,
    /// Load plus first execute: when the first output is there, ms.
    pub first_output_ms: Spread,
    /// The process's peak resident set, MiB.
    pub peak_rss_mib: Spread,
    /// Anonymous memory right after the load (`RssAnon`: what iOS's `phys_footprint` and
    /// Android's low-memory killer count), MiB.
    pub load_anon_mib: Spread,
    /// File pages resident right after the load (`RssFile`; clean ones the kernel can drop),
    /// MiB.
    pub load_file_mib: Spread,
    /// Bytes the load read through `read` calls (`rchar`), MiB.
    pub read_mib: Spread,
    /// Bytes the load read from the disk (`read_bytes`: page faults of mapped files included),
    /// MiB.
    pub disk_read_mib: Spread,
    /// The cache file's size after the launches, MiB (0 without one).
    pub cache_file_mib: f64,
    /// What no backend avoids in the same launches: the load less xnnblob's delegate inits,
    /// plus ExecuTorch's thread pool and XNNPACK's runtime creation within them, ms (xnnblob's
    /// launches only: ExecuTorch's backend reports no breakdown).
    pub floor_ms: Option<Spread>,
}

/// A scenario of ExecuTorch's backend that could not be measured on a model: its launch
/// failed (ExecuTorch 1.5.1's cache crashes on some programs). xnnblob's failures end the run.
#[derive(Debug, Clone)]
pub struct PeerFailure {
    /// The model's file stem.
    pub model: String,
    /// `file` or `mmap`.
    pub load_mode: &'static str,
    /// The scenario.
    pub scenario: Scenario,
    /// How the launch ended, and the last line it wrote.
    pub reason: String,
}

/// One row of the results: a model under a load mode in one scenario.
#[derive(Debug, Clone)]
pub struct PeerResult {
    /// The model's file stem ([`ModelSpec::name`], or an export's name).
    pub model: String,
    /// Its weights, MiB.
    pub weights_mib: f64,
    /// Exported by ExecuTorch (issue 27's targets apply), not generated by xnnblob.
    pub exported: bool,
    /// Executes per launch on successive inputs (a decoder's tokens; 1 for one forward).
    pub decode_steps: usize,
    /// `file` or `mmap`.
    pub load_mode: &'static str,
    /// The scenario.
    pub scenario: Scenario,
    /// What its launches measured.
    pub measured: Measured,
}

/// A peer bench run's settings.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// `xnnblob-et-run` (with `libxnnblob_executorch.so` beside it).
    pub runner: PathBuf,
    /// Fresh-process launches per scenario (at least 1).
    pub repeats: usize,
    /// The models to generate or find, and launch.
    pub models: Vec<PeerModel>,
    /// Where the models and the reports go.
    pub out: PathBuf,
}

/// The model names `--models` takes (`apps` names every program of [`APPS`]).
pub const MODEL_NAMES: [&str; 19] = [
    "fp32",
    "qd8",
    "qb4w",
    "llm1184",
    "cnn",
    "mlp24",
    "fp32-1184",
    "llm-export",
    "resnet18-export",
    "llm1b-export",
    "llm-prefill-decode-export",
    "unet",
    "elementwise",
    "vit",
    "mobilenet-v3",
    "mobilenet-v2-int8",
    "resnet-int8",
    "llm-small",
    "apps",
];

/// The small programs apps ship, as ExecuTorch 1.5.1 exported them into the repository's
/// `tests/data/executorch/export` (`scripts/export-executorch-fixtures.sh`): `--models` name and
/// file stem. With `mlp24` and `fp32-1184`, the programs `--models apps` measures.
const APPS: [(&str, &str); 7] = [
    ("unet", "arch_unet_fp32"),
    ("elementwise", "op_binary_fp32"),
    ("vit", "arch_vit_fp32"),
    ("mobilenet-v3", "arch_mobilenet_v3_fp32"),
    ("mobilenet-v2-int8", "arch_mobilenet_v2_int8"),
    ("resnet-int8", "arch_resnet_int8"),
    ("llm-small", "arch_llama_8da4w"),
];

/// The generated programs `--models apps` adds to [`APPS`].
const GENERATED_APPS: [&str; 2] = ["mlp24", "fp32-1184"];

/// The generated models, measured by default (with each export that is there).
pub const DEFAULT_MODELS: [&str; 5] = ["fp32", "qd8", "qb4w", "llm1184", "cnn"];

/// The exported programs by `--models` name: the file stem that
/// `scripts/export-executorch-fixtures.sh --bench` writes.
const EXPORTS: [(&str, &str); 4] = [
    ("llm-export", "bench_llama_8da4w"),
    ("resnet18-export", "bench_resnet18_fp32"),
    ("llm1b-export", "bench_llama1b_8da4w"),
    ("llm-prefill-decode-export", "bench_llama_prefill_decode"),
];

/// A model of the peer bench.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerModel {
    /// Generated by xnnblob ([`xnnblob_test_support::synthetic::model`]).
    Generated(ModelSpec),
    /// Exported by ExecuTorch's own exporter into [`exports_dir`]: `STEM.pte`, `STEM.ptd`, and
    /// the inputs of each step, `STEM.s<step>.in<i>.bin`, listed in `STEM.io.json`.
    Exported(&'static str),
    /// Exported by ExecuTorch's own exporter into [`committed_exports_dir`], as `Exported`.
    Committed(&'static str),
}

/// The ExecuTorch exports kept in the repository (`tests/data/executorch/export`).
pub fn committed_exports_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/executorch/export")
}

/// Where `scripts/export-executorch-fixtures.sh --bench` writes the exported programs:
/// `$XNNBLOB_BENCH_EXPORTS`, else `$XDG_CACHE_HOME/xnnblob/bench-exports`, else
/// `~/.cache/xnnblob/bench-exports`.
pub fn exports_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XNNBLOB_BENCH_EXPORTS") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("xnnblob/bench-exports")
}

/// The models measured without `--models`: every generated one, and each export that has been
/// made (the export needs torch, which the bench does not).
pub fn default_models() -> Vec<PeerModel> {
    let mut models: Vec<PeerModel> = DEFAULT_MODELS
        .iter()
        .filter_map(|n| peer_model(n).ok())
        .collect();
    for (_, stem) in EXPORTS {
        if exports_dir().join(format!("{stem}.io.json")).is_file() {
            models.push(PeerModel::Exported(stem));
        }
    }
    models
}

/// A program ready to launch: its files and the runner arguments that name them.
struct Program {
    name: String,
    weights_mib: f64,
    pte: PathBuf,
    /// The `.ptd`, unless the export kept every weight in the `.pte`.
    ptd: Option<PathBuf>,
    args: Vec<String>,
    exported: bool,
    steps: usize,
}

impl PeerModel {
    /// Generates (or finds) the model's files under `out`.
    fn program(&self, out: &Path) -> Result<Program, String> {
        match self {
            PeerModel::Generated(spec) => {
                let files = ensure(spec, &out.join("models"))
                    .map_err(|e| format!("generating {}: {e}", spec.name()))?;
                let input = out.join(format!("{}.input.f32", spec.name()));
                spec.write_input(&input)
                    .map_err(|e| format!("{}: {e}", input.display()))?;
                Ok(Program {
                    name: spec.name(),
                    weights_mib: spec.weight_bytes() as f64 / 1048576.0,
                    args: vec![
                        files.pte.display().to_string(),
                        "--data".into(),
                        files.ptd.display().to_string(),
                        "--input".into(),
                        input.display().to_string(),
                    ],
                    pte: files.pte,
                    ptd: Some(files.ptd),
                    exported: false,
                    steps: 1,
                })
            }
            PeerModel::Exported(stem) => exported_program(&exports_dir(), stem),
            PeerModel::Committed(stem) => exported_program(&committed_exports_dir(), stem),
        }
    }
}

/// An exported program's `.pte` and first `.ptd` as its description names them (in `dir`), their
/// size in MiB, and the runner arguments that load them.
fn described_files(
    dir: &Path,
    described: &serde_json::Value,
) -> Result<(PathBuf, Option<PathBuf>, f64, Vec<String>), String> {
    let pte = dir.join(described["program"].as_str().unwrap_or_default());
    let ptd = described["data"]
        .as_array()
        .and_then(|d| d.first())
        .and_then(|name| name.as_str())
        .map(|name| dir.join(name));
    let mut weights_mib = 0.0;
    for file in std::iter::once(&pte).chain(&ptd) {
        let m = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
        weights_mib += m.len() as f64 / 1048576.0;
    }
    let mut args = vec![pte.display().to_string()];
    if let Some(ptd) = &ptd {
        args.extend(["--data".into(), ptd.display().to_string()]);
    }
    Ok((pte, ptd, weights_mib, args))
}

/// An exported program's files, from its `io.json` (steps of one method), or its `calls.json`
/// (a sequence of calls of methods that share state: each launch runs them in order on one
/// program, with ExecuTorch's arenas shared; the first execute is the first call's, a prefill).
fn exported_program(dir: &Path, stem: &str) -> Result<Program, String> {
    let calls_path = dir.join(format!("{stem}.calls.json"));
    if calls_path.exists() {
        return called_program(dir, stem, &calls_path);
    }
    let io_path = dir.join(format!("{stem}.io.json"));
    let text = std::fs::read_to_string(&io_path).map_err(|e| {
        format!(
            "{}: {e} (make it with `scripts/export-executorch-fixtures.sh --bench`)",
            io_path.display()
        )
    })?;
    let io: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", io_path.display()))?;
    let steps = io["steps"].as_array().map_or(0, Vec::len);
    let inputs = io["steps"][0]["inputs"].as_array().map_or(0, Vec::len);
    if steps == 0 || inputs == 0 {
        return Err(format!("{}: no inputs", io_path.display()));
    }
    let (pte, ptd, weights_mib, mut args) = described_files(dir, &io)?;
    for i in 0..inputs {
        args.extend([
            "--input".into(),
            dir.join(format!("{stem}.s{{step}}.in{i}.bin"))
                .display()
                .to_string(),
        ]);
    }
    args.extend(["--steps".into(), steps.to_string()]);
    Ok(Program {
        name: stem.to_string(),
        weights_mib,
        pte,
        ptd,
        args,
        exported: true,
        steps,
    })
}

/// A program described by `calls.json`: `--call METHOD:INPUT,...` per call, in order.
fn called_program(dir: &Path, stem: &str, path: &Path) -> Result<Program, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let described: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let calls = described["calls"].as_array().cloned().unwrap_or_default();
    if calls.is_empty() {
        return Err(format!("{}: no calls", path.display()));
    }
    let (pte, ptd, weights_mib, mut args) = described_files(dir, &described)?;
    for call in &calls {
        let method = call["method"].as_str().unwrap_or_default();
        let inputs: Vec<String> = call["inputs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["file"].as_str())
            .map(|f| dir.join(f).display().to_string())
            .collect();
        args.extend(["--call".into(), format!("{method}:{}", inputs.join(","))]);
    }
    Ok(Program {
        name: stem.to_string(),
        weights_mib,
        pte,
        ptd,
        args,
        exported: true,
        steps: calls.len(),
    })
}

/// A measured model by name: `fp32` (384 MiB, 48 Linear), `qd8` (96 MiB qd8/qc8w, 48 Linear),
/// `qb4w` (96 MiB of blockwise 4-bit weights with bf16 scales, 48 Linear: the LLM format),
/// `llm1184` (96 MiB qd8/qc8w in 1184 Linear: an on-device LLM's count of cache entries), `cnn`
/// (64 MiB of fp32 convolutions and depthwise convolutions); and programs exported by
/// ExecuTorch: `llm-export` (a Llama-shaped 8da4w decoder, d=1024, 12 layers, 32k vocabulary,
/// decoding 16 tokens per launch), `resnet18-export` (ResNet-18, fp32), `llm1b-export`
/// (Llama-3.2-1B's shape in 8da4w: d=2048, 16 layers, FFN 8192, 32k vocabulary, 8 tokens; the
/// scale of the app ExecuTorch's packed cache was made for) and `llm-prefill-decode-export` (the
/// d=1024 decoder with prefill and decode as methods sharing its KV caches: a 16-token prefill,
/// then 8 decodes).
pub fn peer_model(name: &str) -> Result<PeerModel, String> {
    if let Some((_, stem)) = EXPORTS.iter().find(|(n, _)| *n == name) {
        return Ok(PeerModel::Exported(stem));
    }
    if let Some((_, stem)) = APPS.iter().find(|(n, _)| *n == name) {
        return Ok(PeerModel::Committed(stem));
    }
    let llm = |dtype, mib, layers| ModelSpec {
        preset: Preset::LlmLike,
        dtype,
        mib,
        layers,
    };
    Ok(PeerModel::Generated(match name {
        "fp32" => llm(Dtype::Fp32, 384, 48),
        "qd8" => llm(Dtype::Qd8, 96, 48),
        "qb4w" => llm(Dtype::Qb4w, 96, 48),
        "llm1184" => ModelSpec::llm_like(96, Dtype::Qd8),
        "cnn" => ModelSpec::cnn(64),
        "mlp24" => llm(Dtype::Qd8, 24, 24),
        "fp32-1184" => ModelSpec::llm_like(64, Dtype::Fp32),
        other => {
            return Err(format!(
                "unknown model {other:?}: one of {}",
                MODEL_NAMES.join(", ")
            ))
        }
    }))
}

/// The models a `--models` name measures: `apps` is every program of [`APPS`] and
/// [`GENERATED_APPS`]; any other name is one model ([`peer_model`]).
pub fn peer_models(name: &str) -> Result<Vec<PeerModel>, String> {
    if name != "apps" {
        return peer_model(name).map(|m| vec![m]);
    }
    GENERATED_APPS
        .iter()
        .chain(APPS.iter().map(|(n, _)| n))
        .map(|n| peer_model(n))
        .collect()
}

/// `xnnblob-et-run` beside the running executable (where `cargo build --release --workspace`
/// puts it, and where a bench binary's `deps/` parent has it).
pub fn runner_near_executable() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable's path: {e}"))?;
    let dir = exe.parent().ok_or("this executable has no directory")?;
    [dir, dir.parent().unwrap_or(dir)]
        .iter()
        .map(|d| d.join("xnnblob-et-run"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "xnnblob-et-run is not beside {}: `cargo build --release --workspace` builds it",
                exe.display()
            )
        })
}

/// Drops `files` from the page cache. Only clean pages that no process maps go: between
/// launches, that is every page of these files.
fn drop_from_page_cache(files: &[&Path]) {
    use std::os::fd::AsRawFd;
    for path in files {
        let Ok(file) = std::fs::File::open(path) else {
            continue;
        };
        // SAFETY: a valid open descriptor; the advice changes no data.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// One launch of `xnnblob-et-run` (the peer bench's, and the demo's): its `key=value` lines.
pub(crate) fn launch(runner: &Path, args: &[String]) -> Result<HashMap<String, String>, String> {
    launched(runner, args).map_err(|f| f.message)
}

/// A launch of the runner that did not succeed.
struct LaunchFailed {
    /// How it ended (`signal: 11 (SIGSEGV)`, `exit status: 1`, or why it did not start).
    status: String,
    /// The last line it wrote to stderr.
    last_line: String,
    /// The command, its status and everything it wrote to stderr.
    message: String,
}

/// One launch of `runner` with `args`: the values it printed, or how it failed.
fn launched(runner: &Path, args: &[String]) -> Result<HashMap<String, String>, LaunchFailed> {
    let command = format!("{} {}", runner.display(), args.join(" "));
    let out = Command::new(runner)
        .args(args)
        .output()
        .map_err(|e| LaunchFailed {
            status: format!("not started: {e}"),
            last_line: String::new(),
            message: format!("{command}: {e}"),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(LaunchFailed {
            status: out.status.to_string(),
            last_line: stderr
                .trim_end()
                .lines()
                .last()
                .unwrap_or_default()
                .to_string(),
            message: format!("{command}: {}: {}", out.status, stderr.trim_end()),
        });
    }
    Ok(runner_values(&String::from_utf8_lossy(&out.stdout)))
}

fn number(values: &HashMap<String, String>, key: &str) -> Result<f64, String> {
    values
        .get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("xnnblob-et-run printed no number for {key}"))
}

/// What a scenario's launches measured, or why ExecuTorch's backend could not be launched.
type ScenarioOutcome = Result<Measured, String>;

/// The files a launch reads: `program` (runner arguments) names the `.pte` and any `.ptd`.
struct Launches<'a> {
    runner: &'a Path,
    program: Vec<String>,
    pte: &'a Path,
    ptd: Option<&'a Path>,
}

/// One scenario's launches of one model under one load mode.
struct Planned {
    scenario: Scenario,
    args: Vec<String>,
    cache: PathBuf,
    runs: Vec<HashMap<String, String>>,
    /// Why ExecuTorch's backend could not be launched in this scenario: no more launches.
    failed: Option<String>,
}

impl Planned {
    /// `launched`, recorded; a failure of ExecuTorch's backend marks the scenario failed
    /// instead of ending the run.
    fn record(
        &mut self,
        launched: Result<HashMap<String, String>, LaunchFailed>,
    ) -> Result<(), String> {
        match launched {
            Ok(values) => self.runs.push(values),
            Err(f) if self.scenario.backend == "executorch" => {
                self.failed = Some(format!("{}; its last line: {}", f.status, f.last_line));
            }
            Err(f) => return Err(f.message),
        }
        Ok(())
    }
}

impl Launches<'_> {
    /// The runner's arguments for `scenario`. Cold launches have a cache file of their own, so
    /// that a warm scenario's file stays as its warm-up launch left it.
    fn plan(&self, scenario: Scenario, mode: &str, out: &Path, name: &str) -> Planned {
        let cache = match scenario.cache {
            CacheUse::Cold => out.join(format!("{name}.{}.cold.cache", scenario.backend)),
            CacheUse::Bundle => out.join(format!("{name}.{}.bundled.cache", scenario.backend)),
            _ => out.join(format!("{name}.{}.cache", scenario.backend)),
        };
        let mut args = self.program.clone();
        args.extend([
            "--backend".into(),
            scenario.backend.into(),
            "--load-mode".into(),
            mode.into(),
        ]);
        match scenario.cache {
            CacheUse::Off => args.push("--no-weight-cache".into()),
            _ => args.extend(["--cache".into(), cache.display().to_string()]),
        }
        if scenario.cache == CacheUse::Bundle {
            args.extend([
                "--cache-layers".into(),
                bundle_dir(out, name).display().to_string(),
            ]);
        }
        match scenario.cache {
            CacheUse::Warm | CacheUse::WarmFromDisk => {
                args.extend(["--repeat".into(), "10".into()])
            }
            CacheUse::WarmBusy => args.extend(["--repeat".into(), "20".into()]),
            CacheUse::Off | CacheUse::Cold | CacheUse::Bundle => {}
        }
        Planned {
            scenario,
            args,
            cache,
            runs: Vec::new(),
            failed: None,
        }
    }

    /// One launch of a planned scenario, after what its scenario does first.
    fn launch_once(&self, planned: &mut Planned) -> Result<(), String> {
        if planned.failed.is_some() {
            return Ok(());
        }
        match planned.scenario.cache {
            CacheUse::Cold | CacheUse::Bundle => {
                let _ = std::fs::remove_file(&planned.cache);
            }
            CacheUse::WarmFromDisk => {
                let files: Vec<&Path> = [Some(self.pte), self.ptd, Some(&planned.cache)]
                    .into_iter()
                    .flatten()
                    .collect();
                drop_from_page_cache(&files)
            }
            CacheUse::Off | CacheUse::Warm | CacheUse::WarmBusy => {}
        }
        let busy = (planned.scenario.cache == CacheUse::WarmBusy).then(BusyCores::start);
        let run = launched(self.runner, &planned.args);
        drop(busy);
        planned.record(run)?;
        // A cold launch leaves hundreds of MiB of cache file to write back (ExecuTorch's cache
        // does not sync it); written now, it does not slow whichever launch comes next.
        // SAFETY: sync takes no arguments and cannot fail.
        unsafe { libc::sync() };
        Ok(())
    }

    /// Every scenario of one model under `mode`, `repeats` launches each, interleaved: each
    /// round launches every scenario once, so a drift of the machine (another tenant, the
    /// clock) falls on both backends alike. The scenarios from a cold page cache run in rounds
    /// of their own after the others: dropping the files would turn the next launch of any
    /// other scenario into one from disk.
    fn measure_all(
        &self,
        mode: &str,
        out: &Path,
        name: &str,
        repeats: usize,
    ) -> Result<Vec<(Scenario, ScenarioOutcome)>, String> {
        let mut planned: Vec<Planned> = SCENARIOS
            .iter()
            .map(|&s| self.plan(s, mode, out, name))
            .collect();
        // The bundle a device would ship, packed ahead of time for this CPU's class (untimed).
        if SCENARIOS.iter().any(|s| s.cache == CacheUse::Bundle) {
            let dir = bundle_dir(out, name);
            let _ = std::fs::remove_dir_all(&dir);
            let data: Vec<PathBuf> = self.ptd.iter().map(|p| p.to_path_buf()).collect();
            xnnblob::program::pack_ahead(self.pte, &data, &dir.join(format!("{name}.host.xbc")))
                .map_err(|e| format!("packing {name} ahead: {}", xnnblob::report::report(&e)))?;
        }
        // One untimed launch per backend makes the warm scenarios' shared file; where it
        // fails, every scenario that would find that file fails with it.
        for backend in ["executorch", "xnnblob"] {
            if let Some(p) = planned
                .iter_mut()
                .find(|p| p.scenario.backend == backend && p.scenario.cache == CacheUse::Warm)
            {
                let _ = std::fs::remove_file(&p.cache);
                let mut warming = self.plan(p.scenario, mode, out, name);
                warming.record(launched(self.runner, &p.args))?;
                if let Some(failed) = warming.failed {
                    let shared = p.cache.clone();
                    let finds_it = |q: &Planned| {
                        q.cache == shared
                            && matches!(
                                q.scenario.cache,
                                CacheUse::Warm | CacheUse::WarmFromDisk | CacheUse::WarmBusy
                            )
                    };
                    for q in planned.iter_mut().filter(|q| finds_it(q)) {
                        q.failed = Some(format!("making its warm file: {failed}"));
                    }
                }
            }
        }
        let from_disk = |p: &Planned| p.scenario.cache == CacheUse::WarmFromDisk;
        for phase in [false, true] {
            for round in 0..repeats {
                eprintln!(
                    "peer: {name} {mode}: round {} of {repeats}{}",
                    round + 1,
                    if phase {
                        ", from a cold page cache"
                    } else {
                        ""
                    }
                );
                for p in planned.iter_mut().filter(|p| from_disk(p) == phase) {
                    self.launch_once(p)?;
                }
            }
        }
        planned
            .into_iter()
            .map(|p| {
                // A bundle scenario's file is the bundle: its size is what a device ships.
                let file = match p.scenario.cache {
                    CacheUse::Bundle => bundle_dir(out, name).join(format!("{name}.host.xbc")),
                    _ => p.cache.clone(),
                };
                Ok((
                    p.scenario,
                    match p.failed {
                        Some(failed) => Err(failed),
                        None => Ok(measured(&p.runs, &file)?),
                    },
                ))
            })
            .collect()
    }
}

/// Where the bundle of model `name` is packed ahead of time.
fn bundle_dir(out: &Path, name: &str) -> PathBuf {
    out.join(format!("{name}.bundle"))
}

/// What `runs`, the launches of one scenario, measured; `cache` is its cache file.
fn measured(runs: &[HashMap<String, String>], cache: &Path) -> Result<Measured, String> {
    let of = |key: &str, scale: f64| -> Result<Spread, String> {
        let values = runs
            .iter()
            .map(|r| number(r, key).map(|v| v * scale))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(spread(values.into_iter()))
    };
    let first_output = runs
        .iter()
        .map(|r| Ok(number(r, "load_to_ready_ms")? + number(r, "first_execute_ms")?))
        .collect::<Result<Vec<f64>, String>>()?;
    Ok(Measured {
        load_to_ready_ms: of("load_to_ready_ms", 1.0)?,
        first_execute_ms: of("first_execute_ms", 1.0)?,
        steady_execute_ms: of("execute_ms", 1.0)?,
        first_output_ms: spread(first_output.into_iter()),
        peak_rss_mib: of("peak_rss_kib", 1.0 / 1024.0)?,
        load_anon_mib: of("load_rss_anon_kib", 1.0 / 1024.0)?,
        load_file_mib: of("load_rss_file_kib", 1.0 / 1024.0)?,
        read_mib: of("load_rchar", 1.0 / 1048576.0)?,
        disk_read_mib: of("load_read_bytes", 1.0 / 1048576.0)?,
        cache_file_mib: std::fs::metadata(cache).map_or(0.0, |m| m.len() as f64 / 1048576.0),
        floor_ms: runs
            .iter()
            .map(|r| {
                Some(
                    number(r, "load_to_ready_ms").ok()? - number(r, "init_ms").ok()?
                        + number(r, "init_pool_ms").ok()?
                        + number(r, "init_xnnpack_runtime_ms").ok()?,
                )
            })
            .collect::<Option<Vec<f64>>>()
            .filter(|v| !v.is_empty())
            .map(|v| spread(v.into_iter())),
    })
}

/// One thread per core spinning until dropped: the other apps of a busy phone.
struct BusyCores {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyCores {
    fn start() -> BusyCores {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..xnnblob::backend::machine_threads())
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyCores { stop, threads }
    }
}

impl Drop for BusyCores {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs every scenario of every model under both load modes and writes the reports; returns
/// the results.
pub fn run(o: &PeerOptions) -> Result<Vec<PeerResult>, String> {
    if o.repeats == 0 {
        return Err("--repeats must be at least 1".into());
    }
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for model in &o.models {
        let program = model.program(&o.out)?;
        let launches = Launches {
            runner: &o.runner,
            program: program.args.clone(),
            pte: &program.pte,
            ptd: program.ptd.as_deref(),
        };
        for mode in LOAD_MODES {
            for (scenario, measured) in
                launches.measure_all(mode, &o.out, &program.name, o.repeats)?
            {
                let measured = match measured {
                    Ok(m) => m,
                    Err(reason) => {
                        failures.push(PeerFailure {
                            model: program.name.clone(),
                            load_mode: mode,
                            scenario,
                            reason,
                        });
                        continue;
                    }
                };
                results.push(PeerResult {
                    model: program.name.clone(),
                    weights_mib: program.weights_mib,
                    exported: program.exported,
                    decode_steps: program.steps,
                    load_mode: mode,
                    scenario,
                    measured,
                });
            }
        }
    }
    let md = markdown(&results, &failures, o.repeats);
    print!("{md}");
    let write = |name: &str, text: &str| {
        let path = o.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("peer.md", &md)?;
    write("peer.json", &to_json(&results, &failures, o.repeats))?;
    svg(&o.out.join("peer.svg"), &results)?;
    eprintln!(
        "wrote peer.md, peer.json and peer.svg in {}",
        o.out.display()
    );
    Ok(results)
}

/// The results as `peer.json`: `results`, one object per model, load mode and scenario, with
/// the median, min and max of each timed measure.
pub fn to_json(results: &[PeerResult], failures: &[PeerFailure], repeats: usize) -> String {
    // Three decimals: a microsecond, a KiB; more digits are noise.
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let s =
        |s: Spread| json!({"median": round(s.median), "min": round(s.min), "max": round(s.max)});
    let rows: Vec<_> = results
        .iter()
        .map(|r| {
            let m = &r.measured;
            json!({
                "model": r.model,
                "weights_mib": round(r.weights_mib),
                "exported": r.exported,
                "decode_steps": r.decode_steps,
                "load_mode": r.load_mode,
                "scenario": r.scenario.name,
                "load_to_ready_ms": s(m.load_to_ready_ms),
                "first_execute_ms": s(m.first_execute_ms),
                "steady_execute_ms": s(m.steady_execute_ms),
                "first_output_ms": s(m.first_output_ms),
                "peak_rss_mib": round(m.peak_rss_mib.median),
                "load_anon_mib": round(m.load_anon_mib.median),
                "load_file_mib": round(m.load_file_mib.median),
                "read_during_load_mib": round(m.read_mib.median),
                "disk_read_during_load_mib": round(m.disk_read_mib.median),
                "cache_file_mib": round(m.cache_file_mib),
                "floor_ms": m.floor_ms.map(s),
            })
        })
        .collect();
    let failed: Vec<_> = failures
        .iter()
        .map(|f| {
            json!({
                "model": f.model,
                "load_mode": f.load_mode,
                "scenario": f.scenario.name,
                "reason": f.reason,
            })
        })
        .collect();
    serde_json::to_string_pretty(
        &json!({ "repeats": repeats, "results": rows, "failures": failed }),
    )
    .unwrap_or_default()
}

/// The results of one model under one load mode, by scenario name.
fn group<'a>(
    results: &'a [PeerResult],
    model: &str,
    mode: &str,
) -> HashMap<&'static str, &'a Measured> {
    results
        .iter()
        .filter(|r| r.model == model && r.load_mode == mode)
        .map(|r| (r.scenario.name, &r.measured))
        .collect()
}

/// The models of `results`, in the order they ran.
fn models(results: &[PeerResult]) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for r in results {
        if !out.iter().any(|(m, _)| *m == r.model) {
            out.push((r.model.clone(), r.weights_mib));
        }
    }
    out
}

/// The table, the ratios, and each of the issue's targets with its verdict.
pub fn markdown(results: &[PeerResult], failures: &[PeerFailure], repeats: usize) -> String {
    let mut md = format!(
        "Each cell: median (min-max) of {repeats} fresh processes; ms unless named.\n\n\
         | model | load mode | scenario | load-to-ready ms | first execute ms | steady execute ms | first output ms | peak RSS MiB | anon / file RSS after load MiB | read() during load MiB | from disk during load MiB | cache file MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let cell = |s: Spread| {
        let d = if s.median < 10.0 { 2 } else { 1 };
        format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max)
    };
    for r in results {
        let m = &r.measured;
        let _ = writeln!(
            md,
            "| {} ({:.0} MiB) | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | {:.1} |",
            r.model,
            r.weights_mib,
            r.load_mode,
            r.scenario.name,
            cell(m.load_to_ready_ms),
            cell(m.first_execute_ms),
            cell(m.steady_execute_ms),
            cell(m.first_output_ms),
            m.peak_rss_mib.median,
            m.load_anon_mib.median,
            m.load_file_mib.median,
            m.read_mib.median,
            m.disk_read_mib.median,
            m.cache_file_mib
        );
    }
    md.push_str("\nRatios of medians (ExecuTorch's / xnnblob's: above 1, xnnblob is faster):\n\n");
    let mut verdicts = String::new();
    let mut verdict = |what: String, ratio: f64, limit: f64| {
        let met = ratio <= limit;
        let _ = writeln!(
            verdicts,
            "- {what}: {ratio:.3} (target <= {limit}): {}",
            if met { "met" } else { "NOT met" }
        );
    };
    for (model, _) in models(results) {
        let first = results.iter().find(|r| r.model == model);
        let exported = first.is_some_and(|r| r.exported);
        let steps = first.map_or(1, |r| r.decode_steps);
        for mode in LOAD_MODES {
            let g = group(results, &model, mode);
            let ready = |name: &str| g.get(name).map(|m| m.load_to_ready_ms.median);
            let first_output = |name: &str| g.get(name).map(|m| m.first_output_ms.median);
            let (Some(none), Some(xb_cold), Some(xb_warm)) = (
                g.get("executorch, no cache"),
                ready("xnnblob, cold"),
                ready("xnnblob, warm"),
            ) else {
                continue;
            };
            let et_none = none.load_to_ready_ms.median;
            // Where ExecuTorch's cache failed on the program, its warm launch is the one
            // without a cache: what an app that ships ExecuTorch's backend gets.
            let (et_warm_m, et_warm_is) = match g.get("executorch cache, warm") {
                Some(m) => (*m, "ExecuTorch's warm"),
                None => (*none, "ExecuTorch without a cache (its cache failed)"),
            };
            let et_warm = et_warm_m.load_to_ready_ms.median;
            let et_cold = ready("executorch cache, cold");
            let et_disk = first_output("executorch cache, warm, cold page cache");
            let xb_disk = first_output("xnnblob, warm, cold page cache");
            let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.1}x"));
            let _ = writeln!(
                md,
                "- {model} ({mode}): warm {:.1}x against {et_warm_is}; cold {} against ExecuTorch's cold with its cache, {:.1}x against no cache; first output after a warm launch from disk {}",
                et_warm / xb_warm,
                ratio(et_cold.map(|c| c / xb_cold)),
                et_none / xb_cold,
                ratio(et_disk.zip(xb_disk).map(|(e, x)| e / x))
            );
            // Issue 16's targets for the generated models; issue 39's for ExecuTorch's exports
            // (the LLM the project exists for), under both loaders.
            let warm_limit = match (mode, exported) {
                (_, true) => 0.7,
                ("mmap", _) => 0.5,
                _ => 0.01,
            };
            let (cold_limit, none_limit) = if exported { (0.5, 0.8) } else { (0.4, 0.7) };
            verdict(
                format!("{model} ({mode}): warm load-to-ready / {et_warm_is}"),
                xb_warm / et_warm,
                warm_limit,
            );
            if let Some(et_cold) = et_cold {
                verdict(
                    format!("{model} ({mode}): cold / ExecuTorch's cold with its cache"),
                    xb_cold / et_cold,
                    cold_limit,
                );
            }
            verdict(
                format!("{model} ({mode}): cold / ExecuTorch without a cache"),
                xb_cold / et_none,
                none_limit,
            );
            if let (true, Some(xb), Some(et)) = (
                exported,
                g.get("xnnblob, cold"),
                g.get("executorch cache, cold"),
            ) {
                verdict(
                    format!(
                        "{model} ({mode}): cold peak RSS {:.0} MiB / ExecuTorch's cold {:.0} MiB",
                        xb.peak_rss_mib.median, et.peak_rss_mib.median
                    ),
                    xb.peak_rss_mib.median / et.peak_rss_mib.median,
                    1.0,
                );
            }
            if let (true, Some(xb), Some(et)) = (
                exported,
                g.get("xnnblob, warm"),
                g.get("executorch cache, warm"),
            ) {
                // Issue 39: what a phone counts against the app is its anonymous memory.
                verdict(
                    format!(
                        "{model} ({mode}): anonymous memory after a warm load {:.0} MiB / ExecuTorch's {:.0} MiB",
                        xb.load_anon_mib.median, et.load_anon_mib.median
                    ),
                    xb.load_anon_mib.median / et.load_anon_mib.median.max(1.0),
                    1.0,
                );
            }
            if steps > 1 {
                if let (Some(xb), Some(et)) =
                    (g.get("xnnblob, warm"), g.get("executorch cache, warm"))
                {
                    let _ = writeln!(
                        md,
                        "- {model} ({mode}): decode per token (median execute of {steps} tokens and the first token's repeats) {:.2} ms, ExecuTorch's {:.2} ms",
                        xb.steady_execute_ms.median, et.steady_execute_ms.median
                    );
                }
            }
            if let (Some(cold), Some(warm)) = (g.get("xnnblob, cold"), g.get("xnnblob, warm")) {
                // The cache file holds the packed weights (and a small index).
                let budget = warm.cache_file_mib + 64.0;
                verdict(
                    format!(
                        "{model} ({mode}): cold peak RSS {:.0} MiB / (packed {:.0} MiB + 64 MiB)",
                        cold.peak_rss_mib.median, warm.cache_file_mib
                    ),
                    cold.peak_rss_mib.median / budget,
                    1.0,
                );
            }
            if let (Some(et_disk), Some(xb_disk)) = (et_disk, xb_disk) {
                verdict(
                    format!("{model} ({mode}): first output from a cold page cache / ExecuTorch's"),
                    xb_disk / et_disk,
                    0.8,
                );
            }
            if let Some(floor) = g.get("xnnblob, warm").and_then(|m| m.floor_ms) {
                // Issue 61: against what no backend avoids in the same launches.
                verdict(
                    format!(
                        "{model} ({mode}): warm load-to-ready / the floor ({:.2} ms: ExecuTorch's method load, its thread pool, XNNPACK's runtime creation)",
                        floor.median
                    ),
                    xb_warm / floor.median,
                    1.2,
                );
            }
            if let Some(xb) = g.get("xnnblob, warm") {
                let et = et_warm_m;
                // Issue 61: the execute right after a warm load (XNNPACK's first-run setup,
                // the first touch of each packed page) is what an app's first output waits on.
                verdict(
                    format!("{model} ({mode}): first execute after a warm load / {et_warm_is}"),
                    xb.first_execute_ms.median / et.first_execute_ms.median,
                    1.0,
                );
                // ExecuTorch's launches that packed run their tokens on the same packed weights
                // as its warm ones: how far apart its own medians land, next to the ratio.
                let itself = g.get("executorch cache, cold").map_or(String::new(), |c| {
                    let ratio = c.steady_execute_ms.median / et.steady_execute_ms.median;
                    format!(
                        " (ExecuTorch's launches that packed against its warm ones: {:.3})",
                        ratio.max(1.0 / ratio)
                    )
                });
                verdict(
                    format!("{model} ({mode}): steady execute, idle / {et_warm_is}{itself}"),
                    xb.steady_execute_ms.median / et.steady_execute_ms.median,
                    1.0,
                );
            }
            if let (true, Some(et), Some(xb)) = (
                exported,
                g.get("executorch cache, cold"),
                g.get("xnnblob, cold"),
            ) {
                // Issue 39: the tokens of the launch that packs, while its save runs.
                verdict(
                    format!(
                        "{model} ({mode}): steady execute in the launch that packs / ExecuTorch's"
                    ),
                    xb.steady_execute_ms.median / et.steady_execute_ms.median,
                    1.05,
                );
            }
            if let (Some(et), Some(xb)) = (
                g.get("executorch cache, warm, busy cores"),
                g.get("xnnblob, warm, busy cores"),
            ) {
                // Issue 39 asks 1.1 of the exports; issue 27 asked 1.2 of every model.
                let busy_limit = if exported { 1.1 } else { 1.2 };
                // Two sets of ExecuTorch's own launches: the ratio a backend scores against
                // itself, next to each ratio of worst cases.
                let again = g.get("executorch cache, warm, busy cores, again");
                let itself = |of: fn(&Measured) -> f64| {
                    again.map_or(String::new(), |a| {
                        let ratio = of(a) / of(et);
                        format!(
                            " (ExecuTorch against itself: {:.3})",
                            ratio.max(1.0 / ratio)
                        )
                    })
                };
                verdict(
                    format!(
                        "{model} ({mode}): first execute beside busy cores, worst / ExecuTorch's worst{}",
                        itself(|m| m.first_execute_ms.max)
                    ),
                    xb.first_execute_ms.max / et.first_execute_ms.max,
                    busy_limit,
                );
                verdict(
                    format!(
                        "{model} ({mode}): steady execute beside busy cores, worst / ExecuTorch's worst{}",
                        itself(|m| m.steady_execute_ms.max)
                    ),
                    xb.steady_execute_ms.max / et.steady_execute_ms.max,
                    busy_limit,
                );
            }
        }
    }
    if !failures.is_empty() {
        md.push_str("\nNot measured (ExecuTorch's backend failed to launch):\n\n");
        for f in failures {
            let _ = writeln!(
                md,
                "- {} ({}), {}: {}",
                f.model, f.load_mode, f.scenario.name, f.reason
            );
        }
    }
    let _ = write!(
        md,
        "\nTargets:\n\n{verdicts}\nThe 1184-weight warm launch against XNNPACK's runtime-creation floor is measured by the load bench (`xnnblob bench --dtype qd8 --mib 96 --scenarios xnnblob-warm,floor`).\n"
    );
    md
}

/// Short labels of the scenarios, in [`SCENARIOS`] order.
const SHORT: [&str; 10] = [
    "ET none",
    "ET cold",
    "ET warm",
    "xnnblob cold",
    "xnnblob warm",
    "ET disk*",
    "xnnblob disk*",
    "ET busy+",
    "xnnblob busy+",
    "ET busy+ again",
];

/// One panel per model and load mode: each scenario's load-to-ready (first output for the
/// from-disk scenarios), on a log scale, ExecuTorch in red and xnnblob in blue.
pub fn svg(path: &Path, results: &[PeerResult]) -> Result<(), String> {
    let models = models(results);
    let height = 40 + 260 * models.len().max(1) as u32;
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            "load-to-ready, ms (log); * = first output after a warm launch from a cold page cache; \
             + = worst first execute beside one busy thread per core",
            ("sans-serif", 16),
        )
        .map_err(|x| e(&x))?;
    let panels = root.split_evenly((models.len().max(1), LOAD_MODES.len()));
    for (i, panel) in panels.iter().enumerate() {
        let Some((model, mib)) = models.get(i / LOAD_MODES.len()) else {
            continue;
        };
        let mode = LOAD_MODES[i % LOAD_MODES.len()];
        let g = group(results, model, mode);
        let values: Vec<f64> = SCENARIOS
            .iter()
            .map(|s| {
                g.get(s.name).map_or(f64::NAN, |m| match s.cache {
                    CacheUse::WarmFromDisk => m.first_output_ms.median,
                    CacheUse::WarmBusy => m.first_execute_ms.max,
                    _ => m.load_to_ready_ms.median,
                })
            })
            .collect();
        let top = values
            .iter()
            .cloned()
            .filter(|v| v.is_finite())
            .fold(1.0, f64::max)
            * 3.0;
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(48)
            .caption(
                format!("{model} ({mib:.0} MiB), {mode}"),
                ("sans-serif", 13),
            )
            .build_cartesian_2d(
                (0..SCENARIOS.len() as i32).into_segmented(),
                (0.1f64..top).log_scale(),
            )
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_style(("sans-serif", 10))
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => SHORT.get(*i as usize).unwrap_or(&"").to_string(),
                _ => String::new(),
            })
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, v)| {
                        let color = if SCENARIOS[i].backend == "xnnblob" {
                            BLUE
                        } else {
                            RED
                        };
                        let i = i as i32;
                        Rectangle::new(
                            [
                                (SegmentValue::Exact(i), 0.1),
                                (SegmentValue::Exact(i + 1), v.max(0.1)),
                            ],
                            color.mix(0.6).filled(),
                        )
                    }),
            )
            .map_err(|x| e(&x))?;
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, v)| {
                        Text::new(
                            if *v < 10.0 {
                                format!("{v:.1}")
                            } else {
                                format!("{v:.0}")
                            },
                            (SegmentValue::CenterOf(i as i32), v.max(0.1) * 1.15),
                            ("sans-serif", 10),
                        )
                    }),
            )
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(ms: f64) -> Spread {
        Spread {
            median: ms,
            min: ms * 0.9,
            max: ms * 1.1,
        }
    }

    /// One model's results under both load modes, with `xnnblob_warm_ms` for xnnblob's warm.
    fn results(xnnblob_warm_ms: f64) -> Vec<PeerResult> {
        let mut out = Vec::new();
        for mode in LOAD_MODES {
            for scenario in SCENARIOS {
                let ms = match (scenario.backend, scenario.cache) {
                    ("xnnblob", CacheUse::Warm) => xnnblob_warm_ms,
                    ("xnnblob", _) => 50.0,
                    (_, CacheUse::Warm) => 10.0,
                    _ => 200.0,
                };
                out.push(PeerResult {
                    model: "m".into(),
                    weights_mib: 96.0,
                    exported: false,
                    decode_steps: 1,
                    load_mode: mode,
                    scenario,
                    measured: Measured {
                        load_to_ready_ms: flat(ms),
                        first_execute_ms: flat(20.0),
                        steady_execute_ms: flat(5.0),
                        first_output_ms: flat(ms + 20.0),
                        peak_rss_mib: flat(120.0),
                        load_anon_mib: flat(40.0),
                        load_file_mib: flat(70.0),
                        read_mib: flat(0.5),
                        disk_read_mib: flat(0.0),
                        cache_file_mib: 100.0,
                        floor_ms: (scenario.backend == "xnnblob"
                            && scenario.cache == CacheUse::Warm)
                            .then(|| flat(0.8 * ms)),
                    },
                });
            }
        }
        out
    }

    /// Where ExecuTorch's cache failed on a program, warm is compared with ExecuTorch without
    /// a cache, and the failure is named.
    #[test]
    fn a_failed_executorch_cache_is_reported_and_warm_compared_without_it() {
        let results: Vec<PeerResult> = results(5.0)
            .into_iter()
            .filter(|r| r.scenario.backend == "xnnblob" || r.scenario.cache == CacheUse::Off)
            .collect();
        let failures: Vec<PeerFailure> = SCENARIOS
            .iter()
            .filter(|s| s.backend == "executorch" && s.cache != CacheUse::Off)
            .map(|&scenario| PeerFailure {
                model: "m".into(),
                load_mode: "mmap",
                scenario,
                reason: "signal: 11 (SIGSEGV); its last line: x".into(),
            })
            .collect();
        let md = markdown(&results, &failures, 5);
        assert!(
            md.contains("m (mmap): warm load-to-ready / ExecuTorch without a cache (its cache failed): 0.025"),
            "{md}"
        );
        assert!(
            md.contains("- m (mmap), executorch cache, warm: signal: 11 (SIGSEGV)"),
            "{md}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&to_json(&results, &failures, 5)).unwrap();
        assert_eq!(json["failures"].as_array().unwrap().len(), failures.len());
    }

    #[test]
    fn the_report_states_each_target_and_compare_reads_the_json() {
        let md = markdown(&results(1.0), &[], 5);
        // Warm 1 ms against ExecuTorch's 10: 0.1, met under mmap (0.5), not under file (0.01).
        assert!(
            md.contains(
                "m (mmap): warm load-to-ready / ExecuTorch's warm: 0.100 (target <= 0.5): met"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "m (file): warm load-to-ready / ExecuTorch's warm: 0.100 (target <= 0.01): NOT met"
            ),
            "{md}"
        );
        assert!(md.contains("cold / ExecuTorch's cold with its cache: 0.250 (target <= 0.4): met"));
        // The floor of the same launches: 0.8 ms under a warm load of 1.
        assert!(
            md.contains("m (mmap): warm load-to-ready / the floor (0.80 ms")
                && md.contains("): 1.250 (target <= 1.2): NOT met"),
            "{md}"
        );
        assert_eq!(md.matches("| m (96 MiB) |").count(), 2 * SCENARIOS.len());

        let dir = tempfile::tempdir().unwrap();
        let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
        std::fs::write(&base, to_json(&results(1.0), &[], 5)).unwrap();
        std::fs::write(&new, to_json(&results(1.5), &[], 5)).unwrap();
        let (report, regressed) = super::super::compare::compare(&base, &new, 20.0).unwrap();
        assert!(regressed, "{report}");
        assert!(report.contains("m | mmap | xnnblob, warm"), "{report}");
        let (_, regressed) = super::super::compare::compare(&base, &base, 0.0).unwrap();
        assert!(!regressed);

        let chart = dir.path().join("peer.svg");
        svg(&chart, &results(1.0)).unwrap();
        let text = std::fs::read_to_string(&chart).unwrap();
        assert!(text.starts_with("<svg") && text.contains("m (96 MiB), mmap"));
    }

    #[test]
    fn an_exported_program_is_launched_with_each_steps_inputs() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/executorch/export");
        let p = exported_program(&dir, "arch_mobilenet_v2_fp32").unwrap();
        assert!(p.exported && p.steps == 1);
        assert_eq!(p.args[1], "--data");
        assert!(p.args[2].ends_with("arch_mobilenet_v2_fp32.ptd"));
        assert!(p.args[4].ends_with("arch_mobilenet_v2_fp32.s{step}.in0.bin"));
        assert_eq!(&p.args[5..], ["--steps", "1"]);
        let mib = |p: &Path| std::fs::metadata(p).unwrap().len() as f64 / 1048576.0;
        assert_eq!(p.weights_mib, mib(&p.pte) + mib(p.ptd.as_ref().unwrap()));
        // A decoder whose weights stayed in the .pte: every token's inputs, no --data.
        let p = exported_program(&dir, "arch_llama_8da4w").unwrap();
        assert_eq!(p.steps, 4);
        assert!(!p.args.contains(&"--data".to_string()));
        assert!(p.args[2].ends_with("arch_llama_8da4w.s{step}.in0.bin"));
        assert!(p.args[4].ends_with("arch_llama_8da4w.s{step}.in1.bin"));
        assert_eq!(&p.args[5..], ["--steps", "4"]);
        let e = exported_program(&dir, "missing").err().unwrap();
        assert!(e.contains("export-executorch-fixtures.sh --bench"), "{e}");
    }

    #[test]
    fn a_program_of_calls_runs_them_in_order_on_one_launch() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/executorch/export");
        let p = exported_program(&dir, "shared_prefill_step").unwrap();
        assert_eq!(p.steps, 4);
        assert_eq!(p.args[1], "--data");
        assert!(p.args[2].ends_with("shared_prefill_step.ptd"));
        let calls: Vec<&str> = p
            .args
            .iter()
            .skip_while(|a| *a != "--call")
            .step_by(2)
            .map(String::as_str)
            .collect();
        assert_eq!(calls, ["--call"; 4]);
        assert!(p.args[4].starts_with("prefill:") && p.args[4].ends_with("c0.in0.bin"));
        assert!(p.args[10].starts_with("step:") && p.args[10].ends_with("c3.in0.bin"));
    }

    #[test]
    fn models_are_named_and_unknown_names_say_which_exist() {
        for name in MODEL_NAMES {
            assert!(!peer_models(name).unwrap().is_empty(), "{name}");
        }
        assert_eq!(
            peer_models("apps").unwrap().len(),
            APPS.len() + GENERATED_APPS.len()
        );
        for (_, stem) in APPS {
            let program = exported_program(&committed_exports_dir(), stem).unwrap();
            assert!(program.pte.is_file() && program.steps >= 1, "{stem}");
        }
        assert!(matches!(
            peer_model("qb4w").unwrap(),
            PeerModel::Generated(ModelSpec {
                dtype: Dtype::Qb4w,
                ..
            })
        ));
        assert_eq!(
            peer_model("llm-export").unwrap(),
            PeerModel::Exported("bench_llama_8da4w")
        );
        let e = peer_model("resnet").unwrap_err();
        assert!(e.contains("resnet") && e.contains("llm1184"), "{e}");
    }
}
