//! The command line's tests, in one binary (XNNPACK links once): each module runs the
//! `xnnblob` binary for one area of commands. Run one with `cargo test -p xnnblob-cli --test
//! commands <area>::`.

#[path = "../../../tests/common/mod.rs"]
mod common;

mod cache_cli;
mod cli;
mod inspect_cli;
mod link_cli;
mod run_cli;
mod side_files_cli;
