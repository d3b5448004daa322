//! The `xnnblob-lab` command: its commands' help and options, `bench compare`'s verdict, and
//! that the installed command links none of this. (The short crash torture of `xnnblob run` is
//! among the command line's tests, which have that binary.)

use std::process::{Command, Output};
use xnnblob_test_support as common;

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xnnblob-lab"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_command_has_help_and_the_binary_a_version() {
    let version = lab(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("xnnblob-lab {}", env!("CARGO_PKG_VERSION"))
    );
    for command in [
        &["demo"][..],
        &["bench"],
        &["bench", "compare"],
        &["bench", "prefill"],
        &["torture"],
    ] {
        let mut args = command.to_vec();
        args.push("--help");
        let out = lab(&args);
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: xnnblob-lab"),
            "{args:?}"
        );
    }
}

#[test]
fn unknown_options_are_refused() {
    for args in [
        &["bench", "--mibs", "4"][..],
        &["bench", "--scenarios", "no-cache,warmest"],
        &["torture", "--kill", "3"],
        &["demo", "--mb", "4"],
    ] {
        let out = lab(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error:"),
            "{args:?}"
        );
    }
}

#[test]
fn bench_compare_exits_1_on_a_regression_beyond_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, load: f64| {
        let path = dir.path().join(name);
        let json = serde_json::json!({"results": [{
            "model": "m", "load_mode": "mmap", "scenario": "xnnblob, warm",
            "load_to_ready_ms": {"median": load}
        }]});
        std::fs::write(&path, json.to_string()).unwrap();
        path.display().to_string()
    };
    let (base, slower) = (write("base.json", 1.0), write("slower.json", 1.3));
    let out = lab(&["bench", "compare", &base, &slower, "--max-regression", "20"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("+30.0%"));
    let out = lab(&["bench", "compare", &base, &slower, "--max-regression", "40"]);
    assert!(out.status.success());
}

#[test]
fn the_torture_says_where_the_xnnblob_it_runs_is_missing() {
    let out = lab(&[
        "torture",
        "--kills",
        "1",
        "--xnnblob",
        "/nonexistent/xnnblob",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/xnnblob is not built"), "{err}");
}

/// The installed `xnnblob` links the product only: nothing of the test support (the synthetic
/// models, the fault injector) nor of this lab, by its normal dependencies.
#[test]
fn the_installed_command_line_links_no_test_support_nor_lab() {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(common::repo_root())
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "-p",
            "xnnblob-cli",
            "--prefix",
            "none",
        ])
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{tree}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tree.contains("xnnblob v"), "{tree}");
    for crate_name in ["xnnblob-test-support", "xnnblob-lab"] {
        assert!(!tree.contains(crate_name), "{crate_name} in:\n{tree}");
    }
}
