//! The load benchmark: `cargo bench --bench load [-- OPTIONS]` (see `xnnblob-lab bench --help`).

use clap::Parser;

/// The load benchmark, as a bench target: the options of `xnnblob-lab bench`.
#[derive(Parser)]
#[command(name = "load")]
struct LoadBench {
    #[command(flatten)]
    args: xnnblob_lab::bench::BenchArgs,
}

fn main() {
    let bench = LoadBench::parse();
    if let Err(e) = xnnblob_lab::bench::main(&bench.args, false) {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}
