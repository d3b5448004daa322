//! The peer bench: `cargo bench --bench peer [-- OPTIONS]`, the options of `xnnblob-lab bench
//! --peer` (see `xnnblob_lab::bench::peer`). It launches `xnnblob-et-run` from the same target
//! directory: `cargo build --release --workspace` builds it.

fn main() {
    let result = xnnblob_lab::bench::peer::runner_near_executable()
        .and_then(xnnblob_lab::bench::peer_bench_main);
    if let Err(e) = result {
        eprintln!("peer bench: {e}");
        std::process::exit(1);
    }
}
