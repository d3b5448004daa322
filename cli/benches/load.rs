//! The load benchmark: `cargo bench --bench load [-- OPTIONS]` (see `xnnblob bench --help`).

use clap::Parser;

/// The load benchmark, as a bench target: the options of `xnnblob bench`.
#[derive(Parser)]
#[command(name = "load")]
struct LoadBench {
    #[command(flatten)]
    args: xnnblob_cli::bench::BenchArgs,
}

fn main() {
    let bench = LoadBench::parse();
    if let Err(e) = xnnblob_cli::bench::main(&bench.args, false) {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}
