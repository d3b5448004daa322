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
        &["inspect"][..],
        &["cache"],
        &["cache", "stats"],
        &["cache", "verify"],
        &["cache", "compact"],
        &["link"],
        &["run"],
        &["prepack"],
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
        &["inspect", "x.ptd", "--jsn"][..],
        &["run", "x.pte", "--cach", "c"],
        &["cache", "stat", "c"],
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

/// The installed command line is the product's: the demo, the benches and the torture are
/// `xnnblob-lab`'s, and without a command it says what it has.
#[test]
fn the_lab_is_not_in_the_installed_command_line() {
    for args in [
        &["demo"][..],
        &["bench", "--peer"],
        &["cache", "torture", "--kills", "1"],
    ] {
        let out = xnnblob(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = xnnblob(&[]);
    assert_eq!(out.status.code(), Some(2));
    let help = String::from_utf8_lossy(&out.stderr);
    assert!(
        help.contains("Usage: xnnblob") && help.contains("prepack"),
        "{help}"
    );
}
