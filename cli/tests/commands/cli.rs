//! The `xnnblob` command line itself: help and version everywhere, unknown options refused.

use std::process::Output;

fn xnnblob(args: &[&str]) -> Output {
    crate::xnnblob().args(args).output().unwrap()
}

#[test]
fn every_command_has_help_and_the_binary_a_version() {
    let version = xnnblob(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("xnnblob {}", env!("CARGO_PKG_VERSION"))
    );
    for command in [
        &["demo"][..],
        &["bench"],
        &["inspect"],
        &["cache"],
        &["cache", "stats"],
        &["cache", "verify"],
        &["cache", "compact"],
        &["link"],
        &["run"],
    ] {
        let mut args = command.to_vec();
        args.push("--help");
        let out = xnnblob(&args);
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: xnnblob"),
            "{args:?}"
        );
    }
}

#[test]
fn help_is_never_taken_for_a_file() {
    // `cache stats --help` once tried to open a file named --help.
    let out = xnnblob(&["cache", "stats", "--help"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("No such file"));
}

#[test]
fn unknown_options_are_refused() {
    for args in [
        &["bench", "--mibs", "4"][..],
        &["inspect", "x.ptd", "--jsn"],
        &["run", "x.pte", "--cach", "c"],
        &["cache", "stat", "c"],
        &["bench", "--scenarios", "no-cache,warmest"],
    ] {
        let out = xnnblob(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error:"),
            "{args:?}"
        );
    }
}

#[test]
fn run_pairs_dtype_and_shape_with_the_input_before_them() {
    let out = xnnblob(&["run", "x.pte", "--dtype", "float32", "--input", "a.bin"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dtype follows the --input"));
    let out = xnnblob(&["run", "x.pte", "--input", "a.bin", "--dtype", "float64"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown dtype \"float64\""));
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
    let out = xnnblob(&["bench", "compare", &base, &slower, "--max-regression", "20"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("+30.0%"));
    let out = xnnblob(&["bench", "compare", &base, &slower, "--max-regression", "40"]);
    assert!(out.status.success());
}
