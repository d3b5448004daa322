//! `xnnblob-lab torture`: a kill -9 campaign against the packed-weight cache, as a command
//! anyone can rerun.
//!
//! A generated qd8 model is launched through `xnnblob run --cache` in child processes that are
//! killed (SIGKILL) at a random moment of their launch: while packing, while saving, while
//! renaming, after. Most launches start without a cache file (cold: they pack and save), the
//! rest find whatever the previous kill left. After every kill one launch runs to its end, and
//! must give outputs bit-identical to a launch without any cache; then `cache verify`'s check
//! (every entry's checksum) must pass. At the end the file must be exactly the size of a cache
//! built from scratch, and no temporary file of a killed save may be left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xnnblob::cache::{CacheOptions, verify_file};
use xnnblob_test_support::synthetic::SplitMix64;
use xnnblob_test_support::synthetic::model::{Dtype, ModelSpec, Preset, ensure};

/// A campaign's settings.
#[derive(Debug, Clone)]
pub struct TortureOptions {
    /// Launches to kill.
    pub kills: usize,
    /// Weights of the generated model, MiB.
    pub mib: usize,
    /// Seeds the kill moments and which launches start cold.
    pub seed: u64,
    /// Where the model, the cache and the outputs go.
    pub dir: PathBuf,
    /// The `xnnblob` executable the children run.
    pub exe: PathBuf,
}

/// What a campaign counted. It passed when every `wrong_*`, `failed_*` and `left_*` count is 0
/// and `size_ratio` is 1.
#[derive(Debug, Clone, Default)]
pub struct TortureReport {
    /// Launches killed.
    pub kills: usize,
    /// Of those, launches that had already ended when the kill came (nothing was interrupted).
    pub ended_before_kill: usize,
    /// Killed launches that had started without a cache file (they were packing or saving).
    pub cold_kills: usize,
    /// Completion launches (one after each kill) that failed to run.
    pub failed_launches: usize,
    /// Completion launches whose outputs differed from the no-cache run's.
    pub wrong_outputs: usize,
    /// Checks of the file after a completion launch that found it invalid or an entry corrupt.
    pub failed_verifies: usize,
    /// Temporary files of killed saves left at the end.
    pub left_temporaries: usize,
    /// The file's size at the end over the size of a cache built from scratch.
    pub size_ratio: f64,
}

impl TortureReport {
    /// Whether every promise held.
    pub fn passed(&self) -> bool {
        self.failed_launches == 0
            && self.wrong_outputs == 0
            && self.failed_verifies == 0
            && self.left_temporaries == 0
            && self.size_ratio == 1.0
    }
}

impl std::fmt::Display for TortureReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "kills: {} ({} mid-launch; {} of launches that started cold; {} that had already ended)",
            self.kills,
            self.kills - self.ended_before_kill,
            self.cold_kills,
            self.ended_before_kill
        )?;
        writeln!(
            f,
            "completion launches: {}, failed: {}, wrong outputs: {}",
            self.kills, self.failed_launches, self.wrong_outputs
        )?;
        writeln!(
            f,
            "cache verify after each: {} failed of {}",
            self.failed_verifies, self.kills
        )?;
        write!(
            f,
            "at the end: {} temporary files left, file {:.3}x a cache built from scratch: {}",
            self.left_temporaries,
            self.size_ratio,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// One `xnnblob run` of the model, as arguments.
fn run_args(
    files: &xnnblob_test_support::synthetic::model::ModelFiles,
    input: &Path,
    out: &Path,
) -> Vec<String> {
    vec![
        "run".into(),
        files.pte.display().to_string(),
        "--data".into(),
        files.ptd.display().to_string(),
        "--input".into(),
        input.display().to_string(),
        "--output-dir".into(),
        out.display().to_string(),
    ]
}

fn launch(exe: &Path, args: &[String]) -> Result<(), String> {
    let out = Command::new(exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim_end().to_string())
    }
}

fn temporaries(cache: &Path) -> usize {
    let Some(name) = cache.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return 0;
    };
    let prefix = format!(".{name}.xnnblob-tmp-");
    std::fs::read_dir(cache.parent().unwrap_or(Path::new(".")))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Runs the campaign; prints a line per 100 kills on stderr.
pub fn torture(o: &TortureOptions) -> Result<TortureReport, String> {
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(&o.dir).map_err(|e| io(&o.dir, e))?;
    let spec = ModelSpec {
        preset: Preset::LlmLike,
        dtype: Dtype::Qd8,
        mib: o.mib.max(1),
        layers: 24,
    };
    let files = ensure(&spec, &o.dir.join("models")).map_err(|e| e.to_string())?;
    let input = o.dir.join("input.f32");
    spec.write_input(&input).map_err(|e| io(&input, e))?;

    // The truth: a launch with no cache at all.
    let reference_dir = o.dir.join("reference");
    launch(&o.exe, &run_args(&files, &input, &reference_dir))?;
    let output = |dir: &Path| std::fs::read(dir.join("output0.f32"));
    let reference = output(&reference_dir).map_err(|e| io(&reference_dir, e))?;

    // A cache built from scratch, undisturbed: its size is what the tortured one must reach.
    let fresh = o.dir.join("fresh.xbc");
    let _ = std::fs::remove_file(&fresh);
    let mut args = run_args(&files, &input, &o.dir.join("fresh-out"));
    args.extend(["--cache".into(), fresh.display().to_string()]);
    let started = Instant::now();
    launch(&o.exe, &args)?;
    let cold_time = started.elapsed();
    let started = Instant::now();
    launch(&o.exe, &args)?;
    let warm_time = started.elapsed();
    // Kill moments spread over the launch, its save and its exit, with a little margin past.
    let window = |cold: bool| {
        let t = if cold { cold_time } else { warm_time };
        t.mul_f64(1.1).max(Duration::from_millis(2))
    };
    let fresh_size = std::fs::metadata(&fresh).map_err(|e| io(&fresh, e))?.len();

    let cache = o.dir.join("tortured.xbc");
    let _ = std::fs::remove_file(&cache);
    let mut rng = SplitMix64(o.seed);
    let mut report = TortureReport::default();
    let killed_out = o.dir.join("killed-out");
    let done_out = o.dir.join("done-out");
    for k in 0..o.kills {
        // Two launches in three start cold: they pack and save, where a kill can tear things.
        let cold = !rng.next_u64().is_multiple_of(3);
        if cold {
            let _ = std::fs::remove_file(&cache);
            report.cold_kills += 1;
        }
        let mut args = run_args(&files, &input, &killed_out);
        args.extend(["--cache".into(), cache.display().to_string()]);
        let mut child = Command::new(&o.exe)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", o.exe.display()))?;
        let at = window(cold).mul_f64((rng.next_u64() % 10_000) as f64 / 10_000.0);
        std::thread::sleep(at);
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            report.ended_before_kill += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        report.kills += 1;

        let _ = std::fs::remove_file(done_out.join("output0.f32"));
        let mut args = run_args(&files, &input, &done_out);
        args.extend(["--cache".into(), cache.display().to_string()]);
        match launch(&o.exe, &args) {
            Err(e) => {
                report.failed_launches += 1;
                eprintln!("torture: kill {k}: the next launch failed: {e}");
            }
            Ok(()) if output(&done_out).ok().as_ref() != Some(&reference) => {
                report.wrong_outputs += 1;
                eprintln!("torture: kill {k}: the next launch's outputs differ");
            }
            Ok(()) => {}
        }
        match verify_file(&cache, &CacheOptions::default(), true, false) {
            Ok(Ok(r)) if r.corrupt.is_empty() && r.invalid_entries == 0 => {}
            other => {
                report.failed_verifies += 1;
                eprintln!("torture: kill {k}: the file fails verification: {other:?}");
            }
        }
        if (k + 1) % 100 == 0 {
            eprintln!("torture: {} kills", k + 1);
        }
    }
    report.left_temporaries = temporaries(&cache);
    let size = std::fs::metadata(&cache).map(|m| m.len()).unwrap_or(0);
    report.size_ratio = size as f64 / fresh_size.max(1) as f64;
    Ok(report)
}
