//! A short run of every coverage-guided fuzz target (`fuzz/`, docs/fuzzing.md), in the README's
//! test command: `scripts/fuzz.sh build` builds them as a fuzzing session does (libFuzzer, the
//! coverage instrumentation, debug assertions, on the stable toolchain), then each runs a fixed
//! number of inputs, mutated from a copy of its checked-in seeds with a fixed seed: a count, not
//! a time limit, so nothing here reads the clock. Each must exit cleanly, and libFuzzer's report
//! must show that it ran every input and that the code under test was instrumented and covered
//! (coverage grows from the seeds' as mutations reach further).

use xnnblob_test_support as common;

use std::path::Path;
use std::process::Command;

/// Runs per target: a minute and a half on a 2-core machine in all, the build aside. The slow
/// targets compile XNNPACK runtimes or write a file per input.
const RUNS: [(&str, u64); 9] = [
    ("ptd", 300_000),
    ("pte", 300_000),
    ("cache_file", 300_000),
    ("cache_lookups", 3_000),
    ("payload", 100_000),
    ("graph_verifier", 300_000),
    ("plan", 60_000),
    ("state", 100_000),
    ("capi", 40_000),
];

/// The number after `key` in `line` (`cov: 123` -> 123).
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// What libFuzzer reported about one run.
#[derive(Debug)]
struct Report {
    /// Instrumented edges in the binary ("Loaded 1 modules (N inline 8-bit counters)").
    counters: u64,
    /// Edges covered once the seeds had run.
    seed_cov: u64,
    /// Edges and features covered at the end.
    cov: u64,
    ft: u64,
    /// Inputs run ("Done N runs").
    runs: u64,
}

fn report(log: &str) -> Option<Report> {
    let last = |marker: &str| log.lines().rfind(|l| l.contains(marker));
    Some(Report {
        counters: field(last("inline 8-bit counters")?, "(")?,
        seed_cov: field(last("INITED")?, "cov:")?,
        cov: field(last("DONE")?, "cov:")?,
        ft: field(last("DONE")?, "ft:")?,
        runs: field(last("Done ")?, "Done")?,
    })
}

#[test]
fn every_fuzz_target_runs_its_seeds_and_mutations_cleanly() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let build = Command::new("bash")
        .arg(repo.join("scripts/fuzz.sh"))
        .arg("build")
        .output()
        .expect("bash runs scripts/fuzz.sh");
    assert!(
        build.status.success(),
        "scripts/fuzz.sh build failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let bin_dir = String::from_utf8_lossy(&build.stdout)
        .lines()
        .last()
        .expect("the script prints the binaries' directory")
        .to_string();
    let scratch = common::scratch("fuzz-short");
    for (target, runs) in RUNS {
        // A copy: libFuzzer adds what it finds to its first corpus directory.
        let corpus = scratch.join("corpus").join(target);
        std::fs::create_dir_all(&corpus).unwrap();
        let seeds = repo.join("fuzz/corpus").join(target);
        for entry in std::fs::read_dir(&seeds).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), corpus.join(entry.file_name())).unwrap();
        }
        let artifacts = scratch.join("artifacts");
        std::fs::create_dir_all(&artifacts).unwrap();
        let out = Command::new(Path::new(&bin_dir).join(target))
            .arg(format!("-runs={runs}"))
            .arg("-seed=1")
            .arg(format!(
                "-artifact_prefix={}/{target}-",
                artifacts.display()
            ))
            .arg(&corpus)
            // The targets' scratch files go under the test's scratch directory.
            .env("TMPDIR", &*scratch)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if !out.status.success() {
            // Kept past the scratch directory's removal, where scripts/fuzz.sh keeps crashes.
            let kept = repo.join("fuzz/artifacts").join(target);
            std::fs::create_dir_all(&kept).unwrap();
            for entry in std::fs::read_dir(&artifacts).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), kept.join(entry.file_name())).unwrap();
            }
            panic!(
                "{target} failed ({}); its input is in {}:\n{}",
                out.status,
                kept.display(),
                tail.join("\n")
            );
        }
        let r = report(&log).unwrap_or_else(|| panic!("{target}: no libFuzzer report in:\n{log}"));
        println!(
            "{target}: {} runs, {} instrumented edges, coverage {} after the seeds, {} at the end \
             ({} features)",
            r.runs, r.counters, r.seed_cov, r.cov, r.ft
        );
        assert_eq!(r.runs, runs, "{target} ran every input");
        assert!(r.counters > 0, "{target}: instrumented");
        assert!(r.seed_cov > 0, "{target}: the seeds cover code");
        assert!(r.cov >= r.seed_cov, "{target}: coverage never shrinks");
    }
}

/// The fuzz crate stays outside the workspace (cargo-fuzz's layout), so it cannot inherit
/// `[workspace.lints]` and repeats them; this keeps the copy equal, so that its targets' unsafe
/// blocks answer to the same rules (`.ci/run` lints it: `cd fuzz && cargo clippy --release`).
#[test]
fn the_fuzz_crate_lints_as_the_workspace_does() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(repo.join(path)).unwrap();
    let (workspace, fuzz) = (read("Cargo.toml"), read("fuzz/Cargo.toml"));
    assert!(
        !table(&workspace, "workspace.lints.clippy").is_empty(),
        "the workspace's lints are where this test reads them"
    );
    for tool in ["clippy", "rust"] {
        assert_eq!(
            table(&fuzz, &format!("lints.{tool}")),
            table(&workspace, &format!("workspace.lints.{tool}")),
            "fuzz/Cargo.toml's [lints.{tool}] against the workspace's"
        );
    }
}

/// The `key = value` lines of the TOML table `[name]` in `manifest`, without comments or blank
/// lines; none when it has no such table.
fn table(manifest: &str, name: &str) -> Vec<String> {
    let header = format!("[{name}]");
    manifest
        .lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}
