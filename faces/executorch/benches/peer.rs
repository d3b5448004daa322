//! The peer bench with the runner this package builds: `cargo bench -p xnnblob-executorch
//! --bench peer [-- OPTIONS]`, the options of `xnnblob-lab bench --peer` (see
//! `xnnblob_lab::bench::peer`).

use std::path::PathBuf;

fn main() {
    let runner = PathBuf::from(env!("CARGO_BIN_EXE_xnnblob-et-run"));
    // The runner finds libxnnblob_executorch.so beside itself; cargo builds only the rlib here.
    xnnblob_test_support::drop_in::backend_library(&runner);
    if let Err(e) = xnnblob_lab::bench::peer_bench_main(runner) {
        eprintln!("peer bench: {e}");
        std::process::exit(1);
    }
}
