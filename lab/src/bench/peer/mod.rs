//! The peer bench: xnnblob's backend against ExecuTorch's own XNNPACK backend and its persistent
//! cache, inside ExecuTorch 1.5.1's runtime, in one run. Each launch is a fresh `xnnblob-et-run`
//! process on a generated program (`.pte` + `.ptd`), under both of `Module`'s load modes.
//!
//! ```sh
//! xnnblob-lab bench --peer [--repeats N] [--models fp32,qd8,qb4w,llm1184,cnn] [--out DIR]
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
//! `xnnblob-lab bench compare` reads) and `peer.svg` under `--out` (default `target/bench/peer`).

use super::report::{Spread, spread};
use super::runner_values;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob_test_support::synthetic::model::{Dtype, ModelSpec, Preset, ensure};

mod report;
pub use report::{markdown, svg, to_json};

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
            ));
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
    launched(runner, args, false).map_err(|f| f.message)
}

/// As [`launch`], with Linux's grant of AMX tile data refused to the launched process
/// ([`super::amx_refused`]).
pub(crate) fn launch_refusing_amx(
    runner: &Path,
    args: &[String],
) -> Result<HashMap<String, String>, String> {
    launched(runner, args, true).map_err(|f| f.message)
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

/// One launch of `runner` with `args` (AMX tile data refused where `refuse_amx`): the values it
/// printed, or how it failed.
fn launched(
    runner: &Path,
    args: &[String],
    refuse_amx: bool,
) -> Result<HashMap<String, String>, LaunchFailed> {
    let command = format!("{} {}", runner.display(), args.join(" "));
    let mut launch = Command::new(runner);
    launch.args(args);
    if refuse_amx {
        super::amx_refused::refuse_amx(&mut launch);
    }
    let out = launch.output().map_err(|e| LaunchFailed {
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
        let run = launched(self.runner, &planned.args, false);
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
                warming.record(launched(self.runner, &p.args, false))?;
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

#[cfg(test)]
mod tests;
