//! The command line's tests, in one binary (XNNPACK links once): each module runs the
//! `xnnblob` binary for one area of commands. Run one with `cargo test -p xnnblob-cli --test
//! commands <area>::`.

use std::path::Path;
use std::process::Command;
use xnnblob_test_support as common;

/// The `xnnblob` binary this test run built, as a command to add arguments to: the one way
/// every module here starts it.
fn xnnblob() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xnnblob"))
}

/// Runs `xnnblob ARGS` in `dir`: whether it succeeded, and its stdout then its stderr.
fn run_xnnblob_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = xnnblob().args(args).current_dir(dir).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

mod cache_cli;
mod cli;
mod inspect_cli;
mod link_cli;
mod prepack_cli;
mod run_cli;
mod side_files_cli;
