//! `xnnblob-lab bench prefill`: a prompt's prefill, xnnblob's drop-in against ExecuTorch's own
//! XNNPACK backend, inside ExecuTorch's runtime, at several prompt lengths.
//!
//! The program is [`PrefillSpec::ffn`]: four 8da4w feed-forward blocks of a small Llama over T
//! token rows. On this machine each length is timed: fresh launches alternating between the
//! backends, each executing the prompt `executes` times after a first, its median execute taken
//! (`xnnblob-et-run`'s `execute_ms`), the median over launches reported. On each aarch64 CPU named
//! (a qemu model: `cortex-a53`, `neoverse-n1`, `max,sme=off`, ...) the drop-in cross-built for
//! aarch64 runs under `qemu-aarch64` with a TCG plugin of this repository's
//! (`benches/qemu/count_insns.c`) that counts the guest instructions: qemu is no timer, but its
//! counts are exact and the same at every run. Per CPU and length it reports the instructions of
//! one execute (a launch of 1 + k executes less a launch of 1, over k), of a warm load (a launch
//! of no execute with the cache file there) and of a cold one (without it), on one thread.

use super::report::{Spread, spread};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob_test_support::synthetic::prefill::{PrefillFiles, PrefillSpec};

/// The counting plugin's source, compiled by the bench with the host's C compiler.
const PLUGIN_SOURCE: &str = include_str!("../../../benches/qemu/count_insns.c");

/// The two backends, as `xnnblob-et-run --backend` names them.
const BACKENDS: [&str; 2] = ["xnnblob", "executorch"];

/// What `bench prefill` measures.
#[derive(Debug, Clone)]
pub struct PrefillOptions {
    /// `xnnblob-et-run` for this host (its backend library beside it).
    pub runner: PathBuf,
    /// Prompt lengths.
    pub tokens: Vec<u32>,
    /// Fresh launches per backend and length (timed on this machine; 0: no timing).
    pub repeats: usize,
    /// Executes timed per launch, after the first.
    pub executes: usize,
    /// qemu CPU models to count on (none: no counting).
    pub aarch64: Vec<String>,
    /// The qemu-aarch64 to count under (none: the one on `PATH`, Debian's). Another one, such
    /// as a newer qemu built for a CPU feature bookworm's does not emulate, names its version
    /// beside each CPU in the report.
    pub qemu: Option<PathBuf>,
    /// Whether the timed launches find Linux's grant of AMX tile data refused, so that both
    /// backends run their AVX-512 kernels on an AMX machine (the report says so).
    pub refuse_amx: bool,
    /// Where programs, caches and the report go.
    pub out: PathBuf,
}

/// One backend's timing at one length.
#[derive(Debug, Clone)]
pub struct Timed {
    /// Prompt length.
    pub tokens: u32,
    /// `xnnblob` or `executorch`.
    pub backend: &'static str,
    /// The launches' median execute times, in ms.
    pub execute_ms: Spread,
}

/// One backend's instruction counts on one emulated CPU at one length.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The qemu CPU model.
    pub cpu: String,
    /// The version of the qemu it ran under, where that is not the one on `PATH`.
    pub qemu: Option<String>,
    /// Prompt length.
    pub tokens: u32,
    /// `xnnblob` or `executorch`.
    pub backend: &'static str,
    /// Guest instructions of one execute.
    pub per_execute: u64,
    /// Of a launch that loads with its cache file there and executes nothing.
    pub warm_load: u64,
    /// Of a launch that loads without a cache file (and writes it) and executes nothing.
    pub cold_load: u64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct PrefillResults {
    /// On this machine.
    pub timed: Vec<Timed>,
    /// Whether the timed launches were refused AMX tile data.
    pub amx_refused: bool,
    /// Under qemu-aarch64.
    pub counted: Vec<Counted>,
}

/// Runs the bench, writes `prefill.json` and `prefill.md` into `o.out`, and returns what it
/// measured.
pub fn run(o: &PrefillOptions) -> Result<PrefillResults, String> {
    let programs = o.out.join("programs");
    let files: Vec<(u32, PrefillFiles)> = o
        .tokens
        .iter()
        .map(|&t| {
            PrefillSpec::ffn(t)
                .ensure(&programs)
                .map(|f| (t, f))
                .map_err(|e| format!("writing the {t}-token program: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut results = PrefillResults {
        amx_refused: o.refuse_amx,
        ..PrefillResults::default()
    };
    // No launches, no timing: a run that only counts.
    if o.repeats > 0 {
        for (tokens, f) in &files {
            results.timed.extend(time(o, *tokens, f)?);
        }
    }
    if !o.aarch64.is_empty() {
        let runner = aarch64_runner(&o.runner)?;
        let qemu = Qemu::find(o.qemu.as_deref())?;
        let plugin = build_plugin(&o.out, &qemu)?;
        for cpu in &o.aarch64 {
            for (tokens, f) in &files {
                for backend in BACKENDS {
                    results
                        .counted
                        .push(count(o, &qemu, &runner, &plugin, cpu, *tokens, backend, f)?);
                }
            }
        }
    }
    std::fs::write(o.out.join("prefill.json"), to_json(&results))
        .map_err(|e| format!("{}: {e}", o.out.display()))?;
    std::fs::write(o.out.join("prefill.md"), markdown(&results))
        .map_err(|e| format!("{}: {e}", o.out.display()))?;
    Ok(results)
}

/// Times one length: `repeats` launches of each backend, alternating, after one untimed launch
/// of each that makes its cache file.
fn time(o: &PrefillOptions, tokens: u32, f: &PrefillFiles) -> Result<Vec<Timed>, String> {
    let mut medians: HashMap<&str, Vec<f64>> = HashMap::new();
    let caches = o.out.join("caches");
    std::fs::create_dir_all(&caches).map_err(|e| format!("{}: {e}", caches.display()))?;
    for round in 0..=o.repeats {
        for backend in BACKENDS {
            let cache = caches.join(format!("t{tokens}.{backend}.cache"));
            let args = runner_args(f, backend, &cache, 1 + o.executes);
            let values = if o.refuse_amx {
                super::peer::launch_refusing_amx(&o.runner, &args)?
            } else {
                super::peer::launch(&o.runner, &args)?
            };
            if round == 0 {
                continue;
            }
            let ms = values
                .get("execute_ms")
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or("xnnblob-et-run printed no execute_ms")?;
            medians.entry(backend).or_default().push(ms);
        }
    }
    Ok(BACKENDS
        .iter()
        .map(|&backend| Timed {
            tokens,
            backend,
            execute_ms: spread(medians.remove(backend).unwrap_or_default().into_iter()),
        })
        .collect())
}

/// `xnnblob-et-run`'s arguments for `steps` executes of `f` with `backend` and its cache file
/// `cache`, on one thread of ExecuTorch's pool, the program mapped.
fn runner_args(f: &PrefillFiles, backend: &str, cache: &Path, steps: usize) -> Vec<String> {
    [
        f.pte.display().to_string(),
        "--data".into(),
        f.ptd.display().to_string(),
        "--input".into(),
        f.input.display().to_string(),
        "--backend".into(),
        backend.into(),
        "--load-mode".into(),
        "mmap".into(),
        "--cache".into(),
        cache.display().to_string(),
        "--pool-threads".into(),
        "1".into(),
        "--steps".into(),
        steps.to_string(),
    ]
    .to_vec()
}

/// The drop-in's runner cross-built for aarch64 (a nested cargo into this build's target
/// directory), its backend library beside it.
fn aarch64_runner(host_runner: &Path) -> Result<PathBuf, String> {
    let host_runner = host_runner.to_path_buf();
    std::panic::catch_unwind(move || {
        xnnblob_test_support::drop_in::aarch64_drop_in(&host_runner)
            .runner
            .clone()
    })
    .map_err(|e| {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("cross-building the drop-in for aarch64 failed: {why}")
    })
}

/// The qemu-aarch64 counted under.
struct Qemu {
    /// What runs.
    program: PathBuf,
    /// Its version (`10.2.2`).
    version: String,
    /// Whether it is the one on `PATH`.
    default: bool,
}

impl Qemu {
    /// `program`, or the `qemu-aarch64` on `PATH`, with its version.
    fn find(program: Option<&Path>) -> Result<Qemu, String> {
        let default = program.is_none();
        let program = program.map_or_else(|| PathBuf::from("qemu-aarch64"), Path::to_path_buf);
        let out = Command::new(&program)
            .arg("--version")
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split_whitespace()
            .skip_while(|w| *w != "version")
            .nth(1)
            .map(str::to_string)
            .ok_or_else(|| format!("{} --version printed no version: {text}", program.display()))?;
        Ok(Qemu {
            program,
            version,
            default,
        })
    }

    /// Whether its plugin ABI is the per-vCPU one of qemu 9.0 and later.
    fn has_scoreboards(&self) -> bool {
        let major = self
            .version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        major.is_some_and(|m| m >= 9)
    }

    /// Its version, unless it is the one on `PATH` (whose figures the earlier runs name by
    /// CPU alone).
    fn named_version(&self) -> Option<String> {
        (!self.default).then(|| self.version.clone())
    }
}

/// Compiles the counting plugin into `out` with the host's C compiler, for `qemu`'s plugin ABI.
fn build_plugin(out: &Path, qemu: &Qemu) -> Result<PathBuf, String> {
    let source = out.join("count_insns.c");
    let plugin = out.join(format!("count_insns-{}.so", qemu.version));
    std::fs::write(&source, PLUGIN_SOURCE).map_err(|e| format!("{}: {e}", source.display()))?;
    let mut cc = Command::new("cc");
    cc.args(["-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o"])
        .arg(&plugin)
        .arg(&source);
    if qemu.has_scoreboards() {
        cc.arg("-DXNNBLOB_QEMU_SCOREBOARD");
    }
    let status = cc
        .status()
        .map_err(|e| format!("cc (the host's C compiler) for the qemu plugin: {e}"))?;
    if !status.success() {
        return Err(format!("cc could not build {}", source.display()));
    }
    Ok(plugin)
}

/// The instructions one launch of the aarch64 runner executes under `qemu` on `cpu`.
fn instructions(
    qemu: &Qemu,
    plugin: &Path,
    cpu: &str,
    runner: &Path,
    args: &[String],
) -> Result<u64, String> {
    let mut words = xnnblob_test_support::cross::qemu(cpu);
    words[0] = qemu.program.display().to_string();
    words.extend(["-plugin".to_string(), plugin.display().to_string()]);
    words.extend(["-d".to_string(), "plugin".to_string()]);
    let out = Command::new(&words[0])
        .args(&words[1..])
        .arg(runner)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", words[0]))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "{} {} on {cpu}: {}",
            runner.display(),
            args.join(" "),
            stderr.trim_end()
        ));
    }
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("xnnblob-insns: "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("the qemu plugin printed no count on {cpu}"))
}

/// Counts one backend at one length on `cpu`: a cold load (no cache file), a warm one, one
/// execute and 1 + `K` executes.
#[allow(clippy::too_many_arguments)]
fn count(
    o: &PrefillOptions,
    qemu: &Qemu,
    runner: &Path,
    plugin: &Path,
    cpu: &str,
    tokens: u32,
    backend: &'static str,
    f: &PrefillFiles,
) -> Result<Counted, String> {
    /// Executes counted beyond the first: the first differs (it sizes the workspace).
    const K: usize = 2;
    let dir = o.out.join("aarch64-caches");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cache = dir.join(format!(
        "{}.{}.t{tokens}.{backend}.cache",
        cpu.replace(',', "_"),
        qemu.version
    ));
    let _ = std::fs::remove_file(&cache);
    let launch = |steps| {
        let args = runner_args(f, backend, &cache, steps);
        instructions(qemu, plugin, cpu, runner, &args)
    };
    let cold_load = launch(0)?;
    let warm_load = launch(0)?;
    let one = launch(1)?;
    let more = launch(1 + K)?;
    Ok(Counted {
        cpu: cpu.to_string(),
        qemu: qemu.named_version(),
        tokens,
        backend,
        per_execute: more.saturating_sub(one) / K as u64,
        warm_load,
        cold_load,
    })
}

impl Counted {
    /// The CPU as the report and `bench compare` name it: with its qemu's version where that
    /// is not the default one.
    fn label(&self) -> String {
        match &self.qemu {
            Some(version) => format!("{} on qemu {version}", self.cpu),
            None => self.cpu.clone(),
        }
    }

    /// The qemu command line it counted under, for the report.
    fn command(&self) -> String {
        match &self.qemu {
            Some(version) => format!("qemu-aarch64 ({version}) -cpu {}", self.cpu),
            None => format!("qemu-aarch64 -cpu {}", self.cpu),
        }
    }
}

/// The name `bench compare` gates a figure by.
fn gated_name(what: &str, tokens: u32, backend: &str) -> String {
    format!("prefill t{tokens} | {what} | {backend}")
}

/// `prefill.json`: the figures, and under `gated` each one `bench compare` checks (lower is
/// better).
pub fn to_json(r: &PrefillResults) -> String {
    let s = |x: Spread| serde_json::json!({"median": x.median, "min": x.min, "max": x.max});
    let mut gated = Vec::new();
    for t in &r.timed {
        gated.push(serde_json::json!({
            // A run refused the tiles is of another CPU class: its figures are named apart.
            "name": gated_name(
                if r.amx_refused { "execute ms, AMX refused" } else { "execute ms" },
                t.tokens,
                t.backend,
            ),
            "value": t.execute_ms.median,
        }));
    }
    for c in &r.counted {
        for (what, value) in [
            ("execute instructions", c.per_execute),
            ("warm load instructions", c.warm_load),
            ("cold load instructions", c.cold_load),
        ] {
            gated.push(serde_json::json!({
                "name": gated_name(&format!("{} {what}", c.label()), c.tokens, c.backend),
                "value": value,
            }));
        }
    }
    let json = serde_json::json!({
        "bench": "prefill",
        "program": PrefillSpec::ffn(0).name().trim_end_matches("-t0"),
        "amx_refused": r.amx_refused,
        "timed": r.timed.iter().map(|t| serde_json::json!({
            "tokens": t.tokens, "backend": t.backend, "execute_ms": s(t.execute_ms),
        })).collect::<Vec<_>>(),
        "counted": r.counted.iter().map(|c| serde_json::json!({
            "cpu": c.cpu, "qemu": c.qemu, "tokens": c.tokens, "backend": c.backend,
            "per_execute": c.per_execute, "warm_load": c.warm_load, "cold_load": c.cold_load,
        })).collect::<Vec<_>>(),
        "gated": gated,
    });
    serde_json::to_string_pretty(&json).expect("JSON values serialize")
}

/// The pair of a figure for both backends, xnnblob's first.
fn pair<T: Clone>(
    items: &[T],
    same: impl Fn(&T) -> bool,
    backend: impl Fn(&T) -> &str,
) -> Option<(T, T)> {
    let find = |b: &str| items.iter().find(|i| same(i) && backend(i) == b).cloned();
    Some((find("xnnblob")?, find("executorch")?))
}

/// `prefill.md`: one table of times, and one of counts per emulated CPU, each with the ratio
/// xnnblob / ExecuTorch.
pub fn markdown(r: &PrefillResults) -> String {
    let mut out = String::from(
        "### Prefill: xnnblob's drop-in / ExecuTorch's XNNPACK backend\n\n\
         Four 8da4w feed-forward blocks (width 1024, inner 2816) over T token rows, in \
         ExecuTorch's runtime, mmap loader, one thread.\n\n",
    );
    let mut tokens: Vec<u32> = r.timed.iter().map(|t| t.tokens).collect();
    tokens.extend(r.counted.iter().map(|c| c.tokens));
    tokens.sort_unstable();
    tokens.dedup();
    if !r.timed.is_empty() {
        out.push_str(
            "Timed on this machine (median of the launches' median execute; min-max):\n\n",
        );
        if r.amx_refused {
            out.push_str(
                "Linux's grant of AMX tile data refused to every timed launch (a seccomp \
                 filter): both backends ran their AVX-512 kernels, as on a CPU without AMX.\n\n",
            );
        }
        out.push_str("| T | xnnblob ms | ExecuTorch ms | ratio |\n|---|---|---|---|\n");
        for &t in &tokens {
            let Some((x, e)) = pair(&r.timed, |i| i.tokens == t, |i| i.backend) else {
                continue;
            };
            let cell = |s: Spread| format!("{:.3} ({:.3}-{:.3})", s.median, s.min, s.max);
            out.push_str(&format!(
                "| {t} | {} | {} | {:.3} |\n",
                cell(x.execute_ms),
                cell(e.execute_ms),
                x.execute_ms.median / e.execute_ms.median
            ));
        }
        out.push('\n');
    }
    let mut cpus: Vec<(String, String)> =
        r.counted.iter().map(|c| (c.label(), c.command())).collect();
    cpus.dedup();
    for (cpu, command) in cpus {
        out.push_str(&format!(
            "Counted under `{command}` (guest instructions, millions):\n\n\
             | T | execute: xnnblob | ExecuTorch | ratio | warm load: xnnblob | ExecuTorch | ratio | cold load: xnnblob | ExecuTorch | ratio |\n\
             |---|---|---|---|---|---|---|---|---|---|\n"
        ));
        for &t in &tokens {
            let Some((x, e)) = pair(
                &r.counted,
                |i| i.label() == cpu && i.tokens == t,
                |i| i.backend,
            ) else {
                continue;
            };
            let m = |n: u64| format!("{:.1}", n as f64 / 1e6);
            let ratio = |a: u64, b: u64| format!("{:.3}", a as f64 / b as f64);
            out.push_str(&format!(
                "| {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                m(x.per_execute),
                m(e.per_execute),
                ratio(x.per_execute, e.per_execute),
                m(x.warm_load),
                m(e.warm_load),
                ratio(x.warm_load, e.warm_load),
                m(x.cold_load),
                m(e.cold_load),
                ratio(x.cold_load, e.cold_load),
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> PrefillResults {
        let flat = |ms: f64| Spread {
            median: ms,
            min: ms,
            max: ms,
        };
        let counted = |backend, per_execute| Counted {
            cpu: "max,sme=off".into(),
            qemu: None,
            tokens: 16,
            backend,
            per_execute,
            warm_load: 6_500_000,
            cold_load: 430_000_000,
        };
        PrefillResults {
            timed: vec![
                Timed {
                    tokens: 16,
                    backend: "xnnblob",
                    execute_ms: flat(30.0),
                },
                Timed {
                    tokens: 16,
                    backend: "executorch",
                    execute_ms: flat(60.0),
                },
            ],
            amx_refused: false,
            counted: vec![
                counted("xnnblob", 54_600_000),
                counted("executorch", 54_900_000),
            ],
        }
    }

    #[test]
    fn the_report_gives_each_ratio_and_compare_gates_every_figure() {
        let r = results();
        let md = markdown(&r);
        assert!(
            md.contains("| 16 | 30.000 (30.000-30.000) | 60.000 (60.000-60.000) | 0.500 |"),
            "{md}"
        );
        assert!(md.contains("`qemu-aarch64 -cpu max,sme=off`"), "{md}");
        assert!(
            md.contains("| 16 | 54.6 | 54.9 | 0.995 | 6.5 | 6.5 | 1.000 |"),
            "{md}"
        );

        let dir = tempfile::tempdir().unwrap();
        let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
        std::fs::write(&base, to_json(&r)).unwrap();
        let mut slower = r.clone();
        slower.counted[0].per_execute = 60_100_000;
        std::fs::write(&new, to_json(&slower)).unwrap();
        let (report, regressed) = super::super::compare::compare(&base, &new, 10.0).unwrap();
        assert!(regressed, "{report}");
        assert!(
            report.contains("- prefill t16 | max,sme=off execute instructions | xnnblob"),
            "{report}"
        );
        // Three figures per count, one per time: every one is gated.
        assert_eq!(
            report.matches("| prefill t16 |").count(),
            2 + 3 * 2,
            "{report}"
        );
    }

    /// A run with the tiles refused measures the AVX-512 class: its report says so, and its
    /// timed figures are gated under names of their own, never against an AMX run's.
    #[test]
    fn a_run_refused_amx_says_so_and_names_its_times_apart() {
        let mut r = results();
        r.amx_refused = true;
        let md = markdown(&r);
        assert!(md.contains("AMX tile data refused"), "{md}");
        let json = to_json(&r);
        assert!(
            json.contains("prefill t16 | execute ms, AMX refused | xnnblob"),
            "{json}"
        );
        assert!(!markdown(&results()).contains("refused"));
    }

    #[test]
    fn counts_under_another_qemu_are_named_by_its_version_and_take_its_plugin_abi() {
        let mut r = results();
        for c in &mut r.counted {
            c.cpu = "max".into();
            c.qemu = Some("10.2.2".into());
        }
        let md = markdown(&r);
        assert!(md.contains("`qemu-aarch64 (10.2.2) -cpu max`"), "{md}");
        let json = to_json(&r);
        assert!(
            json.contains("prefill t16 | max on qemu 10.2.2 execute instructions | xnnblob"),
            "{json}"
        );
        let qemu = |version: &str, default| Qemu {
            program: PathBuf::from("qemu-aarch64"),
            version: version.into(),
            default,
        };
        assert!(!qemu("7.2.22", true).has_scoreboards());
        assert!(qemu("10.2.2", false).has_scoreboards());
        assert_eq!(qemu("7.2.22", true).named_version(), None);
        assert_eq!(
            qemu("10.2.2", false).named_version().as_deref(),
            Some("10.2.2")
        );
    }
}
