//! xnnblob's backend against ExecuTorch's own XNNPACK backend and its persistent cache, inside
//! ExecuTorch's runtime, in one run: each launch is a fresh `xnnblob-et-run` process on a
//! generated program (`.pte` + `.ptd`), under both of `Module`'s load modes.
//!
//! ```sh
//! cargo bench -p xnnblob-executorch --bench peer -- [--repeats N] [--models fp32,qd8,llm1184,cnn] [--out DIR]
//! ```
//!
//! Scenarios: ExecuTorch without a cache, with its cache cold (file removed before each launch)
//! and warm; xnnblob cold and warm; and both warm launches again with the program, data and cache
//! files dropped from the page cache first (`posix_fadvise(DONTNEED)`), where the first execute
//! waits for the disk. Reports the median (and range) of load-to-ready, first execute, peak RSS,
//! bytes read during the load, and the cache file size; writes `peer.md` and `peer.json` under
//! `--out` (default `target/bench/peer`). Otherwise files stay in the page cache between
//! launches: those scenarios measure work, not disk.
//!
//! Models: `fp32` (384 MiB, 48 Linear), `qd8` (96 MiB qd8/qc8w, 48 Linear), `llm1184` (96 MiB
//! qd8/qc8w in 1184 Linear: an on-device LLM's count of cache entries), `cnn` (64 MiB fp32
//! convolutions and depthwise convolutions).

#[path = "../tests/support/mod.rs"]
mod support;

use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob::bench::model::{ensure, Dtype, ModelSpec, Preset};

/// One scenario: which backend, and what happens to its cache file around each launch.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    backend: &'static str,
    cache: CacheUse,
}

#[derive(Clone, Copy, PartialEq)]
enum CacheUse {
    /// `weight_cache_enabled=false`.
    Off,
    /// The cache file is removed before every launch.
    Cold,
    /// One launch fills the file first; the measured launches find it.
    Warm,
    /// As `Warm`, with every file of the launch dropped from the page cache before it.
    WarmFromDisk,
}

const SCENARIOS: [Scenario; 7] = [
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
];

/// Median, smallest and largest of a scenario's launches.
#[derive(Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut values: Vec<f64>) -> Spread {
    values.sort_by(f64::total_cmp);
    Spread {
        median: values[values.len() / 2],
        min: values[0],
        max: values[values.len() - 1],
    }
}

struct Measured {
    load_ms: Spread,
    first_execute_ms: Spread,
    peak_rss_mib: Spread,
    read_mib: Spread,
    cache_mib: f64,
}

struct Options {
    repeats: usize,
    models: Vec<ModelSpec>,
    out: PathBuf,
}

fn options() -> Options {
    let mut o = Options {
        repeats: 5,
        models: vec![model("fp32"), model("qd8")],
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench/peer"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--repeats" => o.repeats = value.parse().expect("--repeats N"),
            "--models" => o.models = value.split(',').map(model).collect(),
            "--out" => o.out = PathBuf::from(value),
            // cargo bench passes --bench to every bench target.
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown option {other}: see the module docs"),
        }
        i += 2;
    }
    assert!(o.repeats >= 1, "--repeats must be at least 1");
    o
}

/// The measured models, by name (see the module docs).
fn model(name: &str) -> ModelSpec {
    let llm = |dtype, mib, layers| ModelSpec {
        preset: Preset::LlmLike,
        dtype,
        mib,
        layers,
    };
    match name {
        "fp32" => llm(Dtype::Fp32, 384, 48),
        "qd8" => llm(Dtype::Qd8, 96, 48),
        "llm1184" => ModelSpec::llm_like(96, Dtype::Qd8),
        "cnn" => ModelSpec::cnn(64),
        other => panic!("unknown model {other}: fp32, qd8, llm1184 or cnn"),
    }
}

/// Drops `files` from the page cache (only clean pages no process maps: the launches' files).
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

fn launch(args: &[String]) -> HashMap<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_xnnblob-et-run"))
        .args(args)
        .output()
        .expect("xnnblob-et-run starts");
    assert!(
        out.status.success(),
        "xnnblob-et-run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    xnnblob::bench::runner_values(&String::from_utf8_lossy(&out.stdout))
}

fn number(values: &HashMap<String, String>, key: &str) -> f64 {
    values[key].parse().expect("a number")
}

fn remove_cache(cache: &Path) {
    let _ = std::fs::remove_file(cache);
}

fn measure(
    files: &[String],
    scenario: Scenario,
    mode: &str,
    cache: &Path,
    repeats: usize,
) -> Measured {
    let mut args = files.to_vec();
    args.extend([
        "--backend".into(),
        scenario.backend.into(),
        "--load-mode".into(),
        mode.into(),
    ]);
    match scenario.cache {
        CacheUse::Off => args.push("--no-weight-cache".into()),
        CacheUse::Cold | CacheUse::Warm | CacheUse::WarmFromDisk => {
            args.extend(["--cache".into(), cache.display().to_string()])
        }
    }
    remove_cache(cache);
    if matches!(scenario.cache, CacheUse::Warm | CacheUse::WarmFromDisk) {
        launch(&args);
    }
    let mut runs = Vec::new();
    for _ in 0..repeats {
        match scenario.cache {
            CacheUse::Cold => remove_cache(cache),
            CacheUse::WarmFromDisk => {
                let program: Vec<&Path> = files
                    .iter()
                    .filter(|f| f.ends_with(".pte") || f.ends_with(".ptd"))
                    .map(Path::new)
                    .collect();
                drop_from_page_cache(&[program.as_slice(), &[cache]].concat());
            }
            _ => {}
        }
        runs.push(launch(&args));
    }
    let cache_mib = std::fs::metadata(cache).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    let of = |key: &str, scale: f64| spread(runs.iter().map(|r| number(r, key) * scale).collect());
    Measured {
        load_ms: of("load_to_ready_ms", 1.0),
        first_execute_ms: of("first_execute_ms", 1.0),
        peak_rss_mib: of("peak_rss_kib", 1.0 / 1024.0),
        read_mib: of("load_rchar", 1.0 / 1048576.0),
        cache_mib,
    }
}

fn main() {
    let o = options();
    support::backend_library();
    std::fs::create_dir_all(&o.out).expect("the output directory");
    let mut md = String::new();
    let mut results = Vec::new();
    writeln!(
        md,
        "| model | load mode | scenario | load-to-ready ms | first execute ms | peak RSS MiB | read during load MiB | cache file MiB |\n|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    let mut ratios = String::new();
    for spec in &o.models {
        let files = ensure(spec, &o.out.join("models")).expect("the generated model");
        let input = o.out.join(format!("{}.input.f32", spec.name()));
        let values: Vec<u8> = (0..spec.input_len())
            .flat_map(|i| (((i % 17) as f32 - 8.0) / 8.0).to_le_bytes())
            .collect();
        std::fs::write(&input, values).expect("the input file");
        let program = vec![
            files.pte.display().to_string(),
            "--data".into(),
            files.ptd.display().to_string(),
            "--input".into(),
            input.display().to_string(),
        ];
        let weights_mib = spec.weight_bytes() as f64 / 1048576.0;
        for mode in ["file", "mmap"] {
            let mut by_name = HashMap::new();
            let mut first_execute = HashMap::new();
            for scenario in SCENARIOS {
                let cache = o
                    .out
                    .join(format!("{}.{}.cache", spec.name(), scenario.backend));
                let m = measure(&program, scenario, mode, &cache, o.repeats);
                let cell = |s: Spread, digits: usize| {
                    format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max, d = digits)
                };
                writeln!(
                    md,
                    "| {} ({weights_mib:.0} MiB) | {mode} | {} | {} | {} | {:.0} | {:.1} | {:.1} |",
                    spec.name(),
                    scenario.name,
                    cell(m.load_ms, 1),
                    cell(m.first_execute_ms, 1),
                    m.peak_rss_mib.median,
                    m.read_mib.median,
                    m.cache_mib
                )
                .unwrap();
                results.push(json!({
                    "model": spec.name(),
                    "weights_mib": weights_mib,
                    "load_mode": mode,
                    "scenario": scenario.name,
                    "repeats": o.repeats,
                    "load_to_ready_ms": {"median": m.load_ms.median, "min": m.load_ms.min, "max": m.load_ms.max},
                    "first_execute_ms": {"median": m.first_execute_ms.median, "min": m.first_execute_ms.min, "max": m.first_execute_ms.max},
                    "peak_rss_mib": m.peak_rss_mib.median,
                    "read_during_load_mib": m.read_mib.median,
                    "cache_file_mib": m.cache_mib,
                }));
                by_name.insert(scenario.name, m.load_ms.median);
                first_execute.insert(scenario.name, m.first_execute_ms.median);
            }
            let ratio = |a: &str, b: &str| by_name[a] / by_name[b];
            let from_disk = |name: &str| {
                let key = format!("{name}, warm, cold page cache");
                by_name[key.as_str()] + first_execute[key.as_str()]
            };
            writeln!(
                ratios,
                "- {} ({mode}): ExecuTorch's warm / xnnblob's warm {:.1}x; ExecuTorch's cold / xnnblob's cold {:.1}x; ExecuTorch without a cache / xnnblob's cold {:.1}x; first output after a warm launch from disk (load + first execute), ExecuTorch's / xnnblob's {:.1}x",
                spec.name(),
                ratio("executorch cache, warm", "xnnblob, warm"),
                ratio("executorch cache, cold", "xnnblob, cold"),
                ratio("executorch, no cache", "xnnblob, cold"),
                from_disk("executorch cache") / from_disk("xnnblob"),
            )
            .unwrap();
        }
    }
    writeln!(
        md,
        "\nLoad-to-ready ratios (medians, higher is better for xnnblob):\n\n{ratios}"
    )
    .unwrap();
    print!("{md}");
    std::fs::write(o.out.join("peer.md"), &md).expect("peer.md");
    std::fs::write(
        o.out.join("peer.json"),
        serde_json::to_string_pretty(&json!({ "repeats": o.repeats, "results": results })).unwrap(),
    )
    .expect("peer.json");
    eprintln!("wrote {} and peer.json", o.out.join("peer.md").display());
}
