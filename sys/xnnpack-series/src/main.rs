//! `xnnpack-series XNNPACK_DIR`: applies xnnblob's XNNPACK patch series (its kernels, then
//! `sys/xnnpack-sys/patches/*.patch` in order) to the XNNPACK source tree at `XNNPACK_DIR`, as
//! the build does, and names the first patch that does not apply. The first step of moving to
//! another XNNPACK: unpack it, run this, mend the patch it names (its `.rej` files are beside the
//! files it touched), and run it again on a fresh tree.
//!
//! The series is the build's own (`sys/xnnpack-sys/build/series.rs`), so what applies here
//! applies there.

#[path = "../../xnnpack-sys/build/series.rs"]
mod series;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: xnnpack-series [--series XNNPACK_SYS_DIR] XNNPACK_DIR

Applies xnnblob's kernels and patches (by default those of the checkout this was built from)
to the XNNPACK source tree at XNNPACK_DIR, in order, and names the first patch that fails.";

fn main() -> ExitCode {
    let mut series_dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../xnnpack-sys"));
    let mut tree = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            Some("--series") => match args.next() {
                Some(dir) => series_dir = PathBuf::from(dir),
                None => return usage_error("--series needs a directory"),
            },
            _ if tree.is_none() => tree = Some(PathBuf::from(arg)),
            _ => return usage_error("one XNNPACK_DIR only"),
        }
    }
    let Some(tree) = tree else {
        return usage_error("XNNPACK_DIR is missing");
    };
    if !tree.join("include").join("xnnpack.h").is_file() {
        eprintln!(
            "xnnpack-series: {} is not an XNNPACK source tree (no include/xnnpack.h)",
            tree.display()
        );
        return ExitCode::FAILURE;
    }
    match apply(&series_dir, &tree) {
        Ok((kernels, patches)) => {
            println!(
                "applied to {}: {kernels} kernel files, {patches} patches",
                tree.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xnnpack-series: {e}");
            ExitCode::FAILURE
        }
    }
}

fn apply(series_dir: &Path, tree: &Path) -> Result<(usize, usize), series::SeriesError> {
    let series = series::Series::read(series_dir)?;
    series.apply(tree)?;
    Ok((series.kernels.len(), series.patches.len()))
}

fn usage_error(what: &str) -> ExitCode {
    eprintln!("xnnpack-series: {what}\n\n{USAGE}");
    ExitCode::from(2)
}
