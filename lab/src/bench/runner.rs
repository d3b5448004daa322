//! The benchmark's parent and child processes, and the demo (the `cli` feature).

use super::child::{self, Launch, Scenario};
use super::peer::{self, PeerOptions};
use super::report::{self, Row};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob_test_support::synthetic::model::{self, Dtype, ModelFiles, ModelSpec, Preset};

/// Options of a benchmark run (from the command line).
#[derive(Debug, Clone)]
pub struct Options {
    /// The model to generate and launch.
    pub spec: ModelSpec,
    /// Fresh-process launches per scenario (at least 1).
    pub repeats: usize,
    /// Unload/reload cycles of the warm model in one process (0: skip).
    pub cycles: usize,
    /// Where the models, the cache file and the report go.
    pub out: PathBuf,
    /// The scenarios to run, in this order.
    pub scenarios: Vec<Scenario>,
    /// Children are launched as `xnnblob-lab bench ...` (else: this executable, as the bench binary).
    pub via_cli: bool,
}

/// `xnnblob-lab bench`'s options (and `cargo bench --bench load -- ...`'s).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The model: a chain of fully connected layers, or convolutions.
    #[arg(long, value_parser = ["llm-like", "cnn"], default_value = "llm-like")]
    preset: String,
    /// Weight type (the cnn preset is fp32 only).
    #[arg(long, value_parser = ["fp32", "qd8", "qd8-qc8w", "qb4w", "qd8-qb4w"], default_value = "fp32")]
    dtype: String,
    /// Weights in MiB [default: 512, cnn 64].
    #[arg(long)]
    mib: Option<usize>,
    /// Weighted layers [default: 1184, cnn 32].
    #[arg(long)]
    layers: Option<usize>,
    /// Fresh-process launches per scenario.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Unload/reload cycles in one process (0: skip).
    #[arg(long, default_value_t = 100)]
    cycles: usize,
    /// Where models and results go [default: target/bench].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scenarios to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_parser = Scenario::ALL.map(Scenario::name))]
    scenarios: Vec<String>,
    /// A child launch of one scenario (the parent starts these).
    #[arg(long, hide = true)]
    child: Option<String>,
    /// A child that runs N reload cycles.
    #[arg(long, hide = true)]
    child_reload: Option<usize>,
    /// What `cargo bench` passes to every bench target.
    #[arg(long, hide = true)]
    bench: bool,
    /// The peer bench instead: ExecuTorch's own backend and cache against xnnblob's, in
    /// ExecuTorch's runtime (`xnnblob-et-run`, built beside this binary).
    #[arg(long)]
    peer: bool,
    /// The peer bench's models, comma-separated [default: the generated ones, and each export
    /// that `scripts/export-executorch-fixtures.sh --bench` has made].
    #[arg(long, value_delimiter = ',', value_parser = super::peer::MODEL_NAMES, requires = "peer")]
    models: Vec<String>,
}

/// The peer bench's settings from `args`, launching `runner`.
fn peer_options(args: &BenchArgs, runner: PathBuf) -> Result<PeerOptions, String> {
    let models = if args.models.is_empty() {
        peer::default_models()
    } else {
        let named: Vec<Vec<_>> = args
            .models
            .iter()
            .map(|n| peer::peer_models(n))
            .collect::<Result<_, _>>()?;
        named.into_iter().flatten().collect()
    };
    Ok(PeerOptions {
        runner,
        repeats: args.repeats,
        models,
        out: args
            .out
            .clone()
            .unwrap_or_else(|| default_out().join("peer")),
    })
}

/// A peer bench target's `main` (`cargo bench --bench peer -- OPTIONS`, the options of
/// `xnnblob-lab bench --peer`), launching `runner`.
pub fn peer_bench_main(runner: PathBuf) -> Result<(), String> {
    #[derive(clap::Parser)]
    #[command(name = "peer")]
    struct PeerBench {
        #[command(flatten)]
        args: BenchArgs,
    }
    use clap::Parser as _;
    let bench = PeerBench::try_parse().map_err(|e| e.to_string())?;
    peer::run(&peer_options(&bench.args, runner)?).map(drop)
}

impl Options {
    /// The run `args` describe.
    pub fn from_args(args: &BenchArgs, via_cli: bool) -> Options {
        let dtype = match args.dtype.as_str() {
            "fp32" => Dtype::Fp32,
            "qb4w" | "qd8-qb4w" => Dtype::Qb4w,
            _ => Dtype::Qd8,
        };
        let mut spec = if args.preset == "cnn" {
            ModelSpec::cnn(args.mib.unwrap_or(64))
        } else {
            ModelSpec::llm_like(args.mib.unwrap_or(512), dtype)
        };
        spec.layers = args.layers.unwrap_or(spec.layers).max(1);
        let scenarios = if args.scenarios.is_empty() {
            Scenario::ALL.to_vec()
        } else {
            // clap admits only the names of Scenario::ALL.
            args.scenarios
                .iter()
                .filter_map(|s| Scenario::parse(s))
                .collect()
        };
        Options {
            spec,
            repeats: args.repeats.max(1),
            cycles: args.cycles,
            out: args.out.clone().unwrap_or_else(default_out),
            scenarios,
            via_cli,
        }
    }

    fn child_args(&self) -> Vec<String> {
        let preset = match self.spec.preset {
            Preset::LlmLike => "llm-like",
            Preset::Cnn => "cnn",
        };
        let dtype = match self.spec.dtype {
            Dtype::Fp32 => "fp32",
            Dtype::Qd8 => "qd8",
            Dtype::Qb4w => "qb4w",
        };
        vec![
            "--preset".into(),
            preset.into(),
            "--dtype".into(),
            dtype.into(),
            "--mib".into(),
            self.spec.mib.to_string(),
            "--layers".into(),
            self.spec.layers.to_string(),
            "--out".into(),
            self.out.display().to_string(),
        ]
    }

    fn cache_path(&self) -> PathBuf {
        self.out.join(format!("{}.xbc", self.spec.name()))
    }
}

fn default_out() -> PathBuf {
    // The workspace's target directory, beside this crate's.
    let cli = Path::new(env!("CARGO_MANIFEST_DIR"));
    cli.parent().unwrap_or(cli).join("target/bench")
}

/// Entry point shared by `xnnblob-lab bench` and the bench binary: a child launch when asked for
/// one, else the whole benchmark.
pub fn main(args: &BenchArgs, via_cli: bool) -> Result<(), String> {
    if args.peer {
        return peer::run(&peer_options(args, peer::runner_near_executable()?)?).map(drop);
    }
    let options = Options::from_args(args, via_cli);
    let files =
        model::ensure(&options.spec, &options.out.join("models")).map_err(|e| e.to_string())?;
    if let Some(s) = &args.child {
        let scenario = Scenario::parse(s).ok_or_else(|| format!("unknown scenario {s}"))?;
        let launch = child::launch(
            scenario,
            &files,
            &options.cache_path(),
            options.spec.input_len(),
        )?;
        println!("{}", launch.to_line());
        return Ok(());
    }
    if let Some(n) = args.child_reload {
        println!(
            "{}",
            child::reload_cycles(&files, &options.cache_path(), n, options.spec.input_len())?
        );
        return Ok(());
    }
    run(&options)
}

/// Runs one child: `--child SCENARIO` or `--child-reload N`; returns its result line.
fn spawn(options: &Options, extra: &[&str], prefix: &str) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    if options.via_cli {
        cmd.arg("bench");
    }
    let out = cmd
        .args(options.child_args())
        .args(extra)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "child {extra:?} failed: {}{}",
                stdout,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

fn run(options: &Options) -> Result<(), String> {
    let spec = &options.spec;
    let title = format!(
        "{} ({:.0} MiB of weights, {} layers, width {})",
        spec.name(),
        spec.weight_bytes() as f64 / (1 << 20) as f64,
        spec.layers,
        spec.width()
    );
    let total = options.scenarios.len() * options.repeats + usize::from(options.cycles > 0);
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").map_err(|e| e.to_string())?,
    );
    let cache = options.cache_path();
    let mut rows = Vec::new();
    for &scenario in &options.scenarios {
        let mut launches = Vec::new();
        for _ in 0..options.repeats {
            bar.set_message(scenario.name());
            match scenario {
                Scenario::Cold => {
                    let _ = std::fs::remove_file(&cache);
                }
                Scenario::Warm if !cache.exists() => {
                    spawn(options, &["--child", Scenario::Cold.name()], "LAUNCH")?;
                }
                _ => {}
            }
            let line = spawn(options, &["--child", scenario.name()], "LAUNCH")?;
            launches.push(Launch::from_line(&line).ok_or_else(|| format!("bad line {line}"))?);
            bar.inc(1);
        }
        rows.push(Row { scenario, launches });
    }
    let reload = if options.cycles > 0 {
        if !cache.exists() {
            spawn(options, &["--child", Scenario::Cold.name()], "LAUNCH")?;
        }
        bar.set_message("reload cycles");
        let cycles = options.cycles.to_string();
        let line = spawn(options, &["--child-reload", &cycles], "RELOAD")?;
        bar.inc(1);
        Some(line.trim_start_matches("RELOAD ").to_string())
    } else {
        None
    };
    bar.finish_and_clear();
    let cache_file = std::fs::metadata(&cache).map_or(0, |m| m.len());
    let md = report::markdown(&title, &rows, cache_file, reload.as_deref());
    println!("{md}");
    std::fs::create_dir_all(&options.out).map_err(|e| e.to_string())?;
    let md_path = options.out.join(format!("load-{}.md", spec.name()));
    std::fs::write(&md_path, &md).map_err(|e| e.to_string())?;
    let svg_path = options.out.join(format!("load-{}.svg", spec.name()));
    report::svg(&svg_path, &title, &rows)?;
    println!("written: {} and {}", md_path.display(), svg_path.display());
    Ok(())
}

/// The demo: an llm-like fp32 model of `mib` MiB generated into a temporary directory, launched
/// cold then warm in fresh processes.
pub fn demo(mib: usize) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("xnnblob-demo-{}", std::process::id()));
    let options = Options {
        spec: ModelSpec::llm_like(mib, Dtype::Fp32),
        repeats: 1,
        cycles: 0,
        out: dir.clone(),
        scenarios: vec![Scenario::Cold, Scenario::Warm],
        via_cli: true,
    };
    println!(
        "xnnblob {} demo: generating a {} MiB llm-like fp32 model ({} fully connected weights) in {}",
        env!("CARGO_PKG_VERSION"),
        mib,
        options.spec.layers,
        dir.display()
    );
    let result = (|| {
        let started = std::time::Instant::now();
        let files = model::ensure(&options.spec, &dir.join("models")).map_err(|e| e.to_string())?;
        println!("generated in {:.1} s", started.elapsed().as_secs_f64());
        let _ = std::fs::remove_file(options.cache_path());
        let launch = |s: Scenario| -> Result<Launch, String> {
            let line = spawn(&options, &["--child", s.name()], "LAUNCH")?;
            Launch::from_line(&line).ok_or_else(|| format!("bad line {line}"))
        };
        let cold = launch(Scenario::Cold)?;
        let warm = launch(Scenario::Warm)?;
        let file = std::fs::metadata(options.cache_path()).map_or(0, |m| m.len());
        println!(
            "cold launch: ready in {:8.1} ms (packed {} weights, saved {:.0} MiB), peak RSS {:.0} MiB",
            cold.ready,
            cold.packed,
            file as f64 / (1 << 20) as f64,
            cold.peak_rss
        );
        println!(
            "warm launch: ready in {:8.1} ms (packed {} weights), peak RSS {:.0} MiB",
            warm.ready, warm.packed, warm.peak_rss
        );
        println!("warm speed-up: {:.0}x", cold.ready / warm.ready);
        let identical = cold.checksum == warm.checksum;
        println!("outputs identical: {identical}");
        if !identical {
            return Err("cold and warm outputs differ".into());
        }
        against_executorch(&options.spec, &files, &dir)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// ExecuTorch's runner (`xnnblob-et-run`, built beside this binary by `cargo build --release
/// --workspace`), if it is there.
fn executorch_runner() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let runner = exe.with_file_name("xnnblob-et-run");
    runner.is_file().then_some(runner)
}

/// The `key=value` lines `xnnblob-et-run` prints (lines whose key has a space are not values).
pub fn runner_values(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.contains(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The demo's second half: the same program in ExecuTorch's own runtime (`Module`, mmap loader),
/// with ExecuTorch's XNNPACK backend and its packed-weight cache, then with xnnblob's backend,
/// each cold then warm in fresh processes.
fn against_executorch(spec: &ModelSpec, files: &ModelFiles, dir: &Path) -> Result<(), String> {
    let Some(runner) = executorch_runner() else {
        println!(
            "ExecuTorch comparison skipped: xnnblob-et-run is not built beside this binary \
             (cargo build --release --workspace builds it)"
        );
        return Ok(());
    };
    let input = dir.join("input.f32");
    spec.write_input(&input).map_err(|e| e.to_string())?;
    println!("in ExecuTorch 1.5.1's runtime (Module, mmap loader), the same program:");
    let mut ready = HashMap::new();
    for backend in ["executorch", "xnnblob"] {
        let cache = dir.join(format!("{backend}.cache"));
        let _ = std::fs::remove_file(&cache);
        let args: Vec<String> = [
            files.pte.display().to_string(),
            "--data".into(),
            files.ptd.display().to_string(),
            "--input".into(),
            input.display().to_string(),
            "--backend".into(),
            backend.into(),
            "--load-mode".into(),
            "mmap".into(),
            "--cache".into(),
            cache.display().to_string(),
        ]
        .into();
        for (launch, repeats) in [("cold", 1), ("warm", 3)] {
            // Warm launches are a few ms, so one is noise: the median of three.
            let mut times = Vec::new();
            for _ in 0..repeats {
                let values = peer::launch(&runner, &args)?;
                times.push(
                    values
                        .get("load_to_ready_ms")
                        .and_then(|v| v.parse::<f64>().ok())
                        .ok_or("the runner printed no load_to_ready_ms")?,
                );
            }
            times.sort_by(f64::total_cmp);
            let ms = times[times.len() / 2];
            let who = match backend {
                "executorch" => "ExecuTorch's backend",
                _ => "xnnblob's backend",
            };
            let what = if repeats > 1 {
                format!("{who}, {launch} (median of {repeats}):")
            } else {
                format!("{who}, {launch}:")
            };
            println!("  {what:<44} ready in {ms:8.1} ms");
            ready.insert((backend, launch), ms);
        }
    }
    println!(
        "xnnblob against ExecuTorch's own cache (ExecuTorch's time / xnnblob's; above 1 xnnblob \
         is faster): cold {:.1}x, warm {:.1}x",
        ready[&("executorch", "cold")] / ready[&("xnnblob", "cold")],
        ready[&("executorch", "warm")] / ready[&("xnnblob", "warm")]
    );
    Ok(())
}
